"""stagelink.megatron under Megatron-Core's own schedules: the 1F1B and the
interleaved schedule (forward_backward_pipelining_without_interleaving and
..._with_interleaving, transcribed call for call from Megatron-Core, their
p2p calls, deallocate_output_tensor and custom_backward included) drive a
model of tanh(Linear) layers, one per virtual stage, on CPU tensors.  Every
rank's weight gradients must equal the single-process model's.

Cases: both schedules, with and without sequence parallelism (each TP rank
holds its own [s/t, b, h] slice: mode "full"; otherwise the replicated
[s, b, h] goes scatter_gather), with fixed and variable sequence lengths
(the shape exchange).  p = WORLD_SIZE / t, t from --tp (default 1).
Run by stagelink_run (one node) or test/launchers/two_node.sh (two
namespaces), pytest in every rank.
SPDX-License-Identifier: MIT
"""
import os
from types import SimpleNamespace

import pytest

from conftest import check, require

torch, = require("torch", why="install python3-torch")

import stagelink  # noqa: E402
import stagelink.megatron as p2p  # noqa: E402

from tanh_pipeline import (B, DTYPE, H, batch, layer,  # noqa: E402
                           my_slice, reference, seq_len)


# -- Megatron-Core's helpers, as schedules.py has them ---------------------
def deallocate_output_tensor(out):
    if out is None:
        return
    out.data = torch.empty((1,), device=out.device, dtype=out.dtype)


def custom_backward(output, grad_output):
    if grad_output is None:
        grad_output = torch.ones_like(output, memory_format=torch.preserve_format)
    torch.autograd.Variable._execution_engine.run_backward(
        tensors=(output,), grad_tensors=(grad_output,), keep_graph=False,
        create_graph=False, inputs=tuple(), allow_unreachable=True,
        accumulate_grad=True)


class Model:
    """This rank's model chunks: virtual stage c * p + stage for chunk c."""

    def __init__(self, case, stage, tp_index):
        self.case, self.stage, self.tp_index = case, stage, tp_index
        self.chunks = [layer(c * case.p + stage) for c in range(case.v)]
        self.fed = [0] * case.v  # microbatches through each chunk

    def first(self, c):
        return self.stage == 0 and c == 0

    def last(self, c):
        return self.stage == self.case.p - 1 and c == self.case.v - 1

    def forward_step(self, c, input_tensor):
        k = self.fed[c]
        self.fed[c] += 1
        x, target = (my_slice(a, self.case, self.tp_index)
                     for a in batch(k, self.case))
        out = torch.tanh(self.chunks[c](x if input_tensor is None
                                        else input_tensor))
        if self.last(c):
            return torch.nn.functional.mse_loss(out, target) / self.case.m
        return out

    @staticmethod
    def backward_step(input_tensor, output_tensor, output_tensor_grad):
        if input_tensor is not None:
            input_tensor.retain_grad()
        custom_backward(output_tensor, output_tensor_grad)
        return None if input_tensor is None else input_tensor.grad


def shape(case, k):
    """tensor_shape as Megatron computes it (get_tensor_shapes); with
    variable_seq_lengths the receiver learns it from the shape exchange."""
    s = seq_len(k, case)
    return [s // case.t if case.sp else s, B, H]


def one_f_one_b(model, config):
    """forward_backward_pipelining_without_interleaving."""
    case, stage = model.case, model.stage
    first, last = stage == 0, stage == case.p - 1
    warmup = min(case.p - stage - 1, case.m)
    remaining = case.m - warmup
    inputs, outputs = [], []
    fk = bk = 0  # microbatches forwarded, and backwarded (for shapes)
    for _ in range(warmup):
        input_tensor = p2p.recv_forward(shape(case, fk), config, first)
        output_tensor = model.forward_step(0, input_tensor)
        fk += 1
        p2p.send_forward(output_tensor, config, last)
        inputs.append(input_tensor)
        outputs.append(output_tensor)
        if not last:
            deallocate_output_tensor(output_tensor)
    if remaining > 0:
        input_tensor = p2p.recv_forward(shape(case, fk), config, first)
    for i in range(remaining):
        last_iteration = i == remaining - 1
        output_tensor = model.forward_step(0, input_tensor)
        fk += 1
        output_tensor_grad = p2p.send_forward_recv_backward(
            output_tensor, shape(case, bk), config, last)
        inputs.append(input_tensor)
        outputs.append(output_tensor)
        if not last:
            deallocate_output_tensor(output_tensor)
        input_tensor, output_tensor = inputs.pop(0), outputs.pop(0)
        input_tensor_grad = model.backward_step(input_tensor, output_tensor,
                                                output_tensor_grad)
        bk += 1
        if last_iteration:
            input_tensor = None
            p2p.send_backward(input_tensor_grad, config, first)
        else:
            input_tensor = p2p.send_backward_recv_forward(
                input_tensor_grad, shape(case, fk), config, first)
    for _ in range(warmup):
        input_tensor, output_tensor = inputs.pop(0), outputs.pop(0)
        output_tensor_grad = p2p.recv_backward(shape(case, bk), config, last)
        input_tensor_grad = model.backward_step(input_tensor, output_tensor,
                                                output_tensor_grad)
        bk += 1
        p2p.send_backward(input_tensor_grad, config, first)


def interleaved(model, config):
    """forward_backward_pipelining_with_interleaving, without overlap_p2p_comm
    (the p2p functions get the virtual first/last flags Megatron's
    parallel_state would give them)."""
    case, stage = model.case, model.stage
    p, v, m = case.p, case.v, case.m
    total = m * v
    all_warmup = m == p
    warmup = total if all_warmup else min((p - stage - 1) * 2 + (v - 1) * p,
                                          total)
    remaining = total - warmup
    inputs = [[] for _ in range(v)]
    outputs = [[] for _ in range(v)]
    grads = [[] for _ in range(v)]
    tshape = [seq_len(0, case) // (case.t if case.sp else 1), B, H]

    def chunk_id(k, forward):
        c = (k % (p * v)) // p
        return c if forward else v - c - 1

    def forward_helper(k):
        c = chunk_id(k, True)
        if model.first(c) and len(inputs[c]) == len(outputs[c]):
            inputs[c].append(None)
        out = model.forward_step(c, inputs[c][-1])
        outputs[c].append(out)
        return out

    def backward_helper(k):
        c = chunk_id(k, False)
        if model.last(c) and len(grads[c]) == 0:
            grads[c].append(None)
        return model.backward_step(inputs[c].pop(0), outputs[c].pop(0),
                                   grads[c].pop(0))

    inputs[0].append(p2p.recv_forward(tshape, config, model.first(0)))
    for k in range(warmup):
        output_tensor = forward_helper(k)
        next_c = chunk_id(k + 1, True)
        recv_prev = not (stage == 0 and next_c == 0) and k != total - 1
        if model.last(chunk_id(k, True)):
            output_tensor = None
        if k == warmup - 1 and not all_warmup:
            recv_next = stage != p - 1
            input_tensor, output_tensor_grad = \
                p2p.send_forward_backward_recv_forward_backward(
                    output_tensor, None, recv_prev=recv_prev,
                    recv_next=recv_next, tensor_shape=tshape, config=config)
            grads[v - 1].append(output_tensor_grad)
        else:
            input_tensor = p2p.send_forward_recv_forward(
                output_tensor, recv_prev=recv_prev, tensor_shape=tshape,
                config=config)
        inputs[next_c].append(input_tensor)
        deallocate_output_tensor(output_tensor)
    for k in range(remaining):
        forward_k = k + warmup
        output_tensor = forward_helper(forward_k)
        input_tensor_grad = backward_helper(k)
        if model.last(chunk_id(forward_k, True)):
            output_tensor = None
        if model.first(chunk_id(k, False)):
            input_tensor_grad = None
        recv_prev = True
        if stage == 0:
            next_f = chunk_id(forward_k - (p - 1), True)
            if next_f == v - 1:
                recv_prev = False
            next_f += 1
        else:
            next_f = chunk_id(forward_k + 1, True)
        recv_next = True
        if stage == p - 1:
            next_b = chunk_id(k - (p - 1), False)
            if next_b == 0:
                recv_next = False
            next_b -= 1
        else:
            next_b = chunk_id(k + 1, False)
        if k == remaining - 1:
            recv_prev = False
        input_tensor, output_tensor_grad = \
            p2p.send_forward_backward_recv_forward_backward(
                output_tensor, input_tensor_grad, recv_prev=recv_prev,
                recv_next=recv_next, tensor_shape=tshape, config=config)
        deallocate_output_tensor(output_tensor)
        if recv_prev:
            inputs[next_f].append(input_tensor)
        if recv_next:
            grads[next_b].append(output_tensor_grad)
    if all_warmup:
        grads[v - 1].append(p2p.recv_backward(tshape, config,
                                              stage == p - 1))
    for k in range(remaining, total):
        input_tensor_grad = backward_helper(k)
        next_b = chunk_id(k + 1, False)
        recv_next = not (stage == p - 1 and next_b == v - 1) and \
            k != total - 1
        if model.first(chunk_id(k, False)):
            input_tensor_grad = None
        grads[next_b].append(p2p.send_backward_recv_backward(
            input_tensor_grad, recv_next=recv_next, tensor_shape=tshape,
            config=config))


def overlapped(comm, config, case):
    """overlap_p2p_comm around the ring: the handles are keyed as
    Megatron-Core's _p2p_ops keys them, and iterating them yields the
    requests (older schedules loop over them)."""
    shape = [case.t * 2 // (case.t if case.sp else 1), B, H]
    # The same on every TP rank of a stage (scatter_gather rebuilds one
    # tensor from the group's shards).
    mine = torch.full(shape, float(comm.rank // case.t), dtype=DTYPE)
    got, handles = p2p.send_forward_recv_forward(
        mine, recv_prev=True, tensor_shape=shape, config=config,
        overlap_p2p_comm=True)
    check(sorted(handles.keys()) == ["recv_prev", "send_next"],
          "overlap handles keyed %s" % sorted(handles.keys()))
    handles.pop("send_next").wait()
    for req in handles:
        req.wait()
    check(torch.equal(got.detach(), torch.full(shape, float(
        comm.info["prev_rank"] // case.t), dtype=DTYPE)), "overlapped receive")


def run(case, world, t):
    rank = int(os.environ["RANK"])
    stage, tp_index = rank // t, rank % t
    placement = None
    if case.v > 1:  # the virtual pipeline wraps around: both ends linked
        placement = stagelink.Placement(
            prev_rank=((stage - 1) % case.p) * t + tp_index,
            next_rank=((stage + 1) % case.p) * t + tp_index,
            tp_ranks=[stage * t + i for i in range(t)])
    with stagelink.Communicator(tp_size=t, mode="full" if case.sp else
                                "scatter_gather",
                                placement=placement) as comm:
        p2p.initialize(comm)
        config = SimpleNamespace(pipeline_dtype=DTYPE, timers=None,
                                 variable_seq_lengths=case.varlen,
                                 sequence_parallel=case.sp)
        model = Model(case, stage, tp_index)
        (interleaved if case.v > 1 else one_f_one_b)(model, config)
        if case.v > 1:
            overlapped(comm, config, case)
        sent = comm.counters()["stage_bytes_sent"]
    ref = reference(case, tp_index)
    worst = 0.0
    for c, lay in enumerate(model.chunks):
        want = ref[c * case.p + stage]
        ok = lay.weight.grad is not None and torch.allclose(
            lay.weight.grad, want, rtol=1e-10, atol=1e-12)
        if lay.weight.grad is not None:
            worst = max(worst, (lay.weight.grad - want).abs().max().item())
        check(ok, "%s: rank %d chunk %d: weight gradient differs from the "
              "single-process model's" % (case.name, rank, c))
    print("%-34s rank %d stage %d: gradients %s (max difference %.1e), "
          "stage bytes sent %d" % (case.name, rank, stage,
                                   "match" if worst <= 1e-12 else "DIFFER",
                                   worst, sent), flush=True)


@pytest.mark.parametrize("name, v, sp, varlen", [
    ("1F1B", 1, False, False),
    ("1F1B sequence-parallel varlen", 1, True, True),
    ("interleaved varlen", 2, False, True),
    ("interleaved sequence-parallel", 2, True, False)])
def test_schedule(world, tp, name, v, sp, varlen):
    p = world // tp
    run(SimpleNamespace(name=name, p=p, t=tp, v=v, sp=sp, varlen=varlen,
                        m=2 * p if v > 1 else 2 * p + 1), world, tp)
