"""A two-stage pipeline with torch CPU tensors over stagelink, checked
against the same model run whole in one process.

Stage 0 holds layer 1, stage 1 layer 2 and the loss; each of the t TP
ranks of a stage (t = WORLD_SIZE / 2) holds the full activation, and with
scatter_gather only its 1/t shard crosses between stages.  Microbatches
run 1F1B-style: activations forward, gradients back, tagged by microbatch.

    stagelink_run -n 4 -- /usr/bin/python3 two_stage_torch.py
SPDX-License-Identifier: MIT
"""
import os
import sys

try:
    import torch
except ImportError as e:
    print("SKIP: this example needs torch (Debian: python3-torch): %s" % e)
    sys.exit(77)

import stagelink

MICROBATCHES, BATCH, HIDDEN = 4, 8, 256


def model():
    torch.manual_seed(1234)
    return torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN)


def inputs(mb):
    g = torch.Generator().manual_seed(100 + mb)
    return torch.randn(BATCH, HIDDEN, generator=g), torch.randn(BATCH, HIDDEN, generator=g)


def reference():
    """The whole model in one process: layer 1's weight gradient."""
    l1, l2 = model()
    for mb in range(MICROBATCHES):
        x, target = inputs(mb)
        torch.nn.functional.mse_loss(l2(torch.relu(l1(x))), target).backward()
    return l1.weight.grad, l2.weight.grad


def main():
    world = int(os.environ["WORLD_SIZE"])
    l1, l2 = model()
    ref1, ref2 = reference()
    with stagelink.Communicator(tp_size=world // 2) as comm:
        stage = comm.info["pp_index"]
        for mb in range(MICROBATCHES):
            x, target = inputs(mb)
            if stage == 0:
                h = torch.relu(l1(x))
                comm.send(h.detach().contiguous(), microbatch=mb)
                grad_h = torch.empty_like(h)
                comm.recv(grad_h, peer="next", microbatch=mb)
                h.backward(grad_h)
            else:
                h = torch.empty(BATCH, HIDDEN, requires_grad=False)
                comm.recv(h, microbatch=mb)
                h.requires_grad_(True)
                torch.nn.functional.mse_loss(l2(h), target).backward()
                comm.send(h.grad.contiguous(), peer="prev", microbatch=mb)
        mine, ref = (l1.weight.grad, ref1) if stage == 0 else (l2.weight.grad, ref2)
        ok = torch.allclose(mine, ref, rtol=1e-5, atol=1e-6)
        print("rank %d stage %d: weight gradient %s the single-process "
              "model's (max difference %.2e); stage bytes sent %d" % (
                  comm.info["rank"], stage, "matches" if ok else "DIFFERS FROM",
                  (mine - ref).abs().max().item(),
                  comm.counters()["stage_bytes_sent"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
