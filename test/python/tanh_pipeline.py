"""What the Megatron tests share: the model of
tanh(Linear) layers, one per virtual stage, with its data and the
single-process reference.  A case carries p, t, v, m, sp and varlen, and
may carry cp (context parallelism: each CP rank holds its own contiguous
part of the sequence).
STAGELINK_TEST_DEVICE=cuda puts the model and the data on the rank's
GPU (drawn on the CPU, so both devices see the same numbers).
SPDX-License-Identifier: MIT
"""
import os

import torch

H, B, DTYPE = 16, 2, torch.float64
DEVICE = torch.device(os.environ.get("STAGELINK_TEST_DEVICE", "cpu"))


def seq_len(k, case):
    return case.t * getattr(case, "cp", 1) * (2 + (k % 3 if case.varlen
                                                  else 1))


def layer(g):
    torch.manual_seed(1000 + g)
    return torch.nn.Linear(H, H).to(DTYPE).to(DEVICE)


def batch(k, case):
    g = torch.Generator().manual_seed(2000 + k)
    shape = (seq_len(k, case), B, H)
    return (torch.randn(shape, generator=g, dtype=DTYPE).to(DEVICE),
            torch.randn(shape, generator=g, dtype=DTYPE).to(DEVICE))


def my_slice(x, case, tp_index, cp_index=0):
    """This CP rank's part of the sequence, and of that this TP rank's
    under sequence parallelism."""
    n = x.shape[0] // getattr(case, "cp", 1)
    x = x[cp_index * n:(cp_index + 1) * n]
    if case.sp:
        n = x.shape[0] // case.t
        x = x[tp_index * n:(tp_index + 1) * n]
    return x.contiguous()


def reference(case, tp_index, losses=None, cp_index=0):
    """The whole model in one process: every layer's weight gradient (and
    each microbatch's loss appended to `losses`), of the rank's part of
    each sequence; Megatron's schedules scale the loss by the CP size."""
    layers = [layer(g) for g in range(case.p * case.v)]
    for k in range(case.m):
        x, target = (my_slice(a, case, tp_index, cp_index)
                     for a in batch(k, case))
        for lay in layers:
            x = torch.tanh(lay(x))
        loss = torch.nn.functional.mse_loss(x, target)
        if losses is not None:
            losses.append(loss.detach())
        (loss * getattr(case, "cp", 1) / case.m).backward()
    return [lay.weight.grad for lay in layers]
