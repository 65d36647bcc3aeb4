"""stagelink.megatron.P2PCommunicator under the installed Megatron-Core's
own schedules: forward_backward_pipelining_without_interleaving and
forward_backward_pipelining_with_interleaving, imported from
megatron.core, never transcribed, driven on CPU tensors over gloo process
groups from parallel_state.  The model: one tanh(Linear) layer per
virtual stage, replicated on the TP ranks (sequence parallelism gives each
TP rank its own slice of the sequence).  Every rank's weight gradients
must equal a single-process run of the same model, and stagelink's
counters must show the boundary it chose (scatter_gather: 1/t of full's
stage bytes).

Cases: 1F1B and interleaved (v = 2), overlap_p2p_comm on and off for the
interleaved one (batch_p2p_comm off with it, as upstream requires), m
divisible by p and not (interleaved: microbatch groups of p + 1),
forward_only (the last stage's losses checked), variable_seq_lengths,
sequence_parallel on and off at t = 2, context parallelism (cp = 2: each
CP rank its own part of the sequence), and Megatron's tp-pp-dp rank order;
both wiring routes: stagelink.megatron.install() and p2p_communicator=
with pg_collection=; at t = 2 each replicated case again with
gather="tp_group" (the TP group's all_gather_into_tensor rebuilds the
boundary).  Before them, misuse refused, and a cyclic
send_forward_recv_forward (last stage to first) with overlap: upstream's
dict of handles and NVTX range.  Last, Megatron's in-process restart:
new model-parallel groups, then a new torch world, each followed by a
strided (transposed) tensor sent across every boundary.

CPU shim (megatron_cpu.token_counter, the only change): schedules.py's
`total_num_tokens = torch.zeros([], dtype=torch.int, device="cuda")` (in
both schedules) goes to the CPU.  With STAGELINK_TEST_DEVICE=cuda the
model, the data and every boundary tensor are on the rank's GPU instead
(LOCAL_RANK modulo the GPUs), with no shim (tools/lab/gpu-check runs it).

Usage (p = WORLD_SIZE / (t * cp), context parallelism cp default 1):
stagelink_run -n 4 -- python -m pytest test_megatron_core.py --tp T [--cp CP]
SPDX-License-Identifier: MIT
"""
import dataclasses
import os
import warnings
from types import SimpleNamespace

import pytest

warnings.filterwarnings("ignore", module="megatron")  # no apex, TE here

try:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core import utils as mcore_utils
    from megatron.core.enums import ModelType
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.transformer_config import TransformerConfig
except ImportError as e:
    pytest.skip("%s (tools/make-venv.sh makes .venv with megatron-core)" % e,
                allow_module_level=True)

import stagelink  # noqa: E402
import stagelink.megatron  # noqa: E402

import megatron_cpu  # noqa: E402
from conftest import check  # noqa: E402
from tanh_pipeline import (B, DEVICE, DTYPE, H, batch,  # noqa: E402
                           layer, my_slice, reference, seq_len)

if DEVICE.type == "cuda":
    if not torch.cuda.is_available():
        pytest.skip("STAGELINK_TEST_DEVICE=cuda, but torch sees no GPU",
                    allow_module_level=True)
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) %
                          torch.cuda.device_count())
else:
    megatron_cpu.token_counter()


class Stage(torch.nn.Module):
    """One virtual stage, as Megatron's schedules drive a model chunk."""

    def __init__(self, config, g, first):
        super().__init__()
        self.config, self.lin, self.first = config, layer(g), first
        self.model_type = ModelType.encoder_or_decoder
        self.input_tensor = None

    def set_input_tensor(self, input_tensor):
        if isinstance(input_tensor, list):
            input_tensor = input_tensor[0]
        self.input_tensor = input_tensor

    def forward(self, x):
        return torch.tanh(self.lin(x if self.first else self.input_tensor))


def data(case, tp_index, cp_index):
    return [tuple(my_slice(a, case, tp_index, cp_index)
                  for a in batch(k, case)) for k in range(case.m)]


def forward_step(data_iterator, model):
    x, target = next(data_iterator)
    out = model(x)

    def loss_func(output):
        loss = torch.nn.functional.mse_loss(output, target)
        # A copy: the schedule divides `loss` in place by m.
        return loss, {"loss": loss.detach().clone()}

    return out, loss_func


_layout = []


def model_parallel(t, p, v=1, order="tp-cp-ep-dp-pp", cp=1):
    """parallel_state as a case needs it, initialized again only when the
    layout changes: Megatron's destroy_model_parallel drops its groups but
    torch keeps them (each gloo group's threads), as in a training run that
    re-initializes once, not once a case."""
    if _layout != [(t, p, v, order, cp)]:
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=t, pipeline_model_parallel_size=p,
            virtual_pipeline_model_parallel_size=v if v > 1 else None,
            context_parallel_size=cp, order=order)
        _layout[:] = [(t, p, v, order, cp)]


def run_case(case):
    p, t, v, cp = case.p, case.t, case.v, case.cp
    model_parallel(t, p, v, case.order, cp)
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    tp_index = parallel_state.get_tensor_model_parallel_rank()
    cp_index = parallel_state.get_context_parallel_rank()
    config = TransformerConfig(
        num_layers=p * v, hidden_size=H, num_attention_heads=t,
        tensor_model_parallel_size=t, pipeline_model_parallel_size=p,
        virtual_pipeline_model_parallel_size=v if v > 1 else None,
        context_parallel_size=cp, sequence_parallel=case.sp,
        variable_seq_lengths=case.varlen,
        pipeline_dtype=DTYPE, params_dtype=DTYPE,
        overlap_p2p_comm=case.overlap, batch_p2p_comm=not case.overlap,
        microbatch_group_size_per_vp_stage=case.group if v > 1 else None,
        deallocate_pipeline_outputs=True, use_cpu_initialization=True,
        moe_token_dispatcher_type="alltoall")  # allgather refuses varlen
    # Model chunk c of stage s is virtual stage c * p + s.
    model = [Stage(config, c * p + pp_rank, pp_rank == 0 and c == 0)
             for c in range(v)]
    iters = [iter(data(case, tp_index, cp_index)) for _ in range(v)]
    kwargs = dict(forward_step_func=forward_step,
                  data_iterator=iters if v > 1 else iters[0],
                  model=model if v > 1 else model[0],
                  num_microbatches=case.m, seq_length=seq_len(0, case),
                  micro_batch_size=B,
                  forward_only=getattr(case, "forward_only", False))
    pp_group = parallel_state.get_pipeline_model_parallel_group()
    gather = getattr(case, "gather", None)
    if case.route == "explicit":
        pgc = ProcessGroupCollection.use_mpu_process_groups()
        kwargs["p2p_communicator"] = stagelink.megatron.P2PCommunicator(
            pgc.pp, config, tp_group=pgc.tp, mode=getattr(case, "mode", None),
            gather=gather)
        kwargs["pg_collection"] = pgc
        comm = kwargs["p2p_communicator"].communicator
    else:
        stagelink.megatron.install(gather=gather)
        # The class the schedules build now: its Communicator is theirs.
        comm = schedules.P2PCommunicator(pp_group, config).communicator
    gathered = t > 1 and not case.sp and getattr(case, "mode", None) != "full"
    want_backend = ("none" if not gathered else
                    "host" if gather == "tp_group" else None)
    check(want_backend is None or comm.info["gather_backend"] == want_backend,
          "%s: gathers with %s, want %s" % (
              case.name, comm.info["gather_backend"], want_backend))
    before = comm.counters()["stage_bytes_sent"]
    fn = (schedules.forward_backward_pipelining_with_interleaving if v > 1
          else schedules.forward_backward_pipelining_without_interleaving)
    got_losses = fn(**kwargs)
    sent = comm.counters()["stage_bytes_sent"] - before
    mode = getattr(case, "mode", None) or ("full" if case.sp
                                           else "scatter_gather")
    check(comm.info["mode"] == stagelink._lib.MODES[mode],
          "%s: boundary mode %d, not %s" % (case.name, comm.info["mode"],
                                            mode))
    losses = []
    want = reference(case, tp_index, losses, cp_index)
    if getattr(case, "forward_only", False):
        # Only forward boundaries, no gradient: the last stage's losses,
        # microbatch by microbatch, are the single-process model's.
        last = pp_rank == p - 1
        check(len(got_losses) == (case.m if last else 0) and all(
            torch.allclose(d["loss"], losses[k], atol=1e-12)
            for k, d in enumerate(got_losses)),
            "%s: stage %d: losses %s, want %s" % (
                case.name, pp_rank, [d["loss"].item() for d in got_losses],
                [x.item() for x in losses] if last else []))
        check(all(model[c].lin.weight.grad is None for c in range(v)),
              "%s: forward_only left gradients" % case.name)
        return sent, pp_rank
    for c in range(v):
        g = c * p + pp_rank
        got = model[c].lin.weight.grad
        check(got is not None and torch.allclose(got, want[g], atol=1e-12),
              "%s: virtual stage %d: gradient differs from the single-process "
              "model's" % (case.name, g))
    return sent, pp_rank


def refused(what, fn, exc, *words):
    try:
        fn()
    except exc as e:
        check(all(w in str(e) for w in words),
              "%s: the error does not say %s: %s" % (what, words, e))
    else:
        check(False, "%s was accepted" % what)


def one_chunk_pipeline(t, p):
    """The pipeline group and a config of one layer a stage (sequence
    parallel at t > 1) for the checks outside the schedules."""
    model_parallel(t, p)
    return parallel_state.get_pipeline_model_parallel_group(), \
        TransformerConfig(
            num_layers=p, hidden_size=H, num_attention_heads=t,
            tensor_model_parallel_size=t, pipeline_model_parallel_size=p,
            sequence_parallel=t > 1, pipeline_dtype=DTYPE,
            params_dtype=DTYPE, use_cpu_initialization=True)


def overlap_ring(t, p):
    """A cyclic send_forward_recv_forward (each stage to the next, the
    last to the first) with overlap, as the interleaved schedule makes."""
    pp, config = one_chunk_pipeline(t, p)
    # Around the ring with overlap: upstream's plain dict of handles, each
    # waited for by key, and its NVTX range opened and closed; with
    # batch_p2p_comm too, upstream's assert (caught as either error).
    overlap = dataclasses.replace(config, batch_p2p_comm=False)
    ring = stagelink.megatron.P2PCommunicator(pp, overlap)
    x = torch.full((4, B, H), float(dist.get_rank()), dtype=DTYPE,
                   device=DEVICE)
    # As upstream: a receive needs a shape, variable lengths or not (and
    # the refusal leaves the boundary usable: the exchange below runs).
    varlen = dataclasses.replace(overlap, variable_seq_lengths=True,
                                 moe_token_dispatcher_type="alltoall")
    refused("a receive of no tensor_shape under variable_seq_lengths",
            lambda: stagelink.megatron.P2PCommunicator(
                pp, varlen).send_forward_recv_forward(x, True, None),
            RuntimeError, "tensor_shape must be specified")
    ranges = []
    push, pop = mcore_utils.nvtx_range_push, mcore_utils.nvtx_range_pop
    mcore_utils.nvtx_range_push = lambda msg: ranges.append(("push", msg))
    mcore_utils.nvtx_range_pop = lambda msg: ranges.append(("pop", msg))
    try:
        got, handles = ring.send_forward_recv_forward(
            x, True, (4, B, H), overlap_p2p_comm=True)
    finally:
        mcore_utils.nvtx_range_push, mcore_utils.nvtx_range_pop = push, pop
    check(type(handles) is dict and sorted(handles) == ["recv_prev",
                                                        "send_next"],
          "overlap handles: %r, want a dict of recv_prev and send_next"
          % (handles,))
    for key in list(handles):
        handles.pop(key).wait()
    check(torch.all(got == float(ring.prev_rank)).item(),
          "the ring's tensor is not the previous stage's (rank %d)"
          % ring.prev_rank)
    name = ("megatron.core.pipeline_parallel.p2p_communication."
            "send_forward_recv_forward")
    check(ranges == [("push", name), ("pop", name)],
          "NVTX ranges %r, want upstream's %s" % (ranges, name))
    for exc in (AssertionError, ValueError):
        refused("batch_p2p_comm with overlap_p2p_comm (as %s)" % exc.__name__,
                lambda: stagelink.megatron.P2PCommunicator(
                    pp, config).send_forward_recv_forward(
                        x, True, (4, B, H), overlap_p2p_comm=True),
                exc, "batch_p2p_comm")


def one_stage_and_reopen(t, p):
    """A pipeline of one stage, as upstream builds it (the rank its own
    neighbour): first and last stage, and its calls move nothing; then a
    boundary whose Communicator was closed by hand gets a new one, whose
    transfers arrive."""
    pp, config = one_chunk_pipeline(t, p)
    me = dist.get_rank()
    alone = [dist.new_group([r]) for r in range(dist.get_world_size())][me]
    one = stagelink.megatron.P2PCommunicator(alone, config)
    check(one.is_pp_first_stage and one.is_pp_last_stage and
          one.total_stages == 1 and one.next_rank == me == one.prev_rank,
          "one stage: first %s, last %s, %d stages, neighbours %s and %s"
          % (one.is_pp_first_stage, one.is_pp_last_stage, one.total_stages,
             one.prev_rank, one.next_rank))
    x = torch.ones((4, B, H), dtype=DTYPE, device=DEVICE)
    check(one.recv_forward((4, B, H), one.is_pp_first_stage) is None and
          one.send_forward(x, one.is_pp_last_stage) is None and
          one.send_backward(x, one.is_pp_first_stage) is None and
          one.recv_backward((4, B, H), one.is_pp_last_stage) is None,
          "a pipeline of one stage moved a tensor")
    one.communicator.close()
    replicated = dataclasses.replace(config, sequence_parallel=False)
    first = stagelink.megatron.P2PCommunicator(pp, replicated).communicator
    first.close()
    again = stagelink.megatron.P2PCommunicator(pp, replicated)
    check(again.communicator is not first,
          "a P2PCommunicator made after close() got the closed Communicator")
    # The stage's number: what every TP rank of a stage holds alike.
    x = torch.full((4, B, H), float(again.current_stage), dtype=DTYPE,
                   device=DEVICE)
    if not again.is_pp_last_stage:
        again.send_forward(x, False)
    if not again.is_pp_first_stage:
        got = again.recv_forward((4, B, H), False)
        check(torch.all(got == float(again.current_stage - 1)).item(),
              "after reopening: the tensor is not stage %d's"
              % (again.current_stage - 1))


def misuse(t, p, monkeypatch):
    """Each refused before anything is posted, with a sentence that says
    what to do; nothing is left half-made (the next case still runs)."""
    pp, config = one_chunk_pipeline(t, p)

    refused("mode sharded", lambda: stagelink.megatron.P2PCommunicator(
        pp, config, mode="sharded"), ValueError, "sharded", "full")
    refused("install(mode=sharded)", lambda: stagelink.megatron.install(
        mode="sharded"), ValueError, "sharded")
    if t > 1:
        refused("scatter_gather under sequence_parallel",
                lambda: stagelink.megatron.P2PCommunicator(
                    pp, config, mode="scatter_gather"), ValueError,
                "sequence_parallel", "full")
    # A mode the code asks for and a STAGELINK_MODE naming another.
    monkeypatch.setenv("STAGELINK_MODE", "sharded")
    refused("STAGELINK_MODE=sharded against the code's mode",
            lambda: stagelink.megatron.P2PCommunicator(
                pp, config, mode="full"), stagelink.StagelinkError,
            "STAGELINK_MODE=sharded", "(full)")
    # Where the boundary is replicated and the code asks for no mode, the
    # variable chooses (an A/B test), but never sharded.
    replicated = TransformerConfig(
        num_layers=p, hidden_size=H, num_attention_heads=t,
        tensor_model_parallel_size=t, pipeline_model_parallel_size=p,
        pipeline_dtype=DTYPE, params_dtype=DTYPE, use_cpu_initialization=True)
    refused("STAGELINK_MODE=sharded for a replicated boundary",
            lambda: stagelink.megatron.P2PCommunicator(pp, replicated),
            ValueError, "STAGELINK_MODE=\"sharded\"", "unset STAGELINK_MODE")
    if t > 1:
        # Sequence parallelism asks for full though the code named none.
        monkeypatch.setenv("STAGELINK_MODE", "scatter_gather")
        refused("STAGELINK_MODE=scatter_gather under sequence_parallel",
                lambda: stagelink.megatron.P2PCommunicator(pp, config),
                stagelink.StagelinkError, "sequence_parallel",
                "STAGELINK_MODE=scatter_gather", "set it to full")
    monkeypatch.setenv("STAGELINK_MODE", "full")
    ab = stagelink.megatron.P2PCommunicator(pp, replicated).communicator
    check(ab.info["mode"] == stagelink._lib.MODES["full"],
          "STAGELINK_MODE=full did not choose full for a replicated boundary")
    monkeypatch.delenv("STAGELINK_MODE")
    # Sends refused before a tag is taken: the boundary stays usable.
    sender = stagelink.megatron.P2PCommunicator(pp, replicated)
    counts = dict(sender._link.count)
    x = torch.ones((4, B, H), dtype=DTYPE, device=DEVICE)
    refused("a sparse send", lambda: sender.send_forward(x.to_sparse(),
                                                         False),
            ValueError, "sparse", "dense")
    refused("a send of a list of floats", lambda: sender.send_forward(
        [[1.0]], False), TypeError, "torch.Tensor")
    check(sender._link.broken is None and
          sender._link.count == counts,
          "refused sends took tags or broke the boundary: %r, %r"
          % (sender._link.count, sender._link.broken))
    # A Communicator whose placement is not Megatron's groups.
    if t > 1:
        wrong = stagelink.Communicator(tp_size=1, mode="full")
        refused("a Communicator of another TP size",
                lambda: stagelink.megatron.P2PCommunicator(
                    pp, config, comm=wrong), ValueError, "tp_size 1",
                "Megatron's groups: %d" % t)
        wrong.close()


def make_cases(t, cp, p):
    """Every case of a job of t, cp and p, one layout after another."""
    cases = []
    for sched, v in (("1f1b", 1), ("interleaved", 2)):
        # m not divisible by p: the interleaved schedule then takes
        # microbatch groups of p + 1 a virtual stage (upstream refuses a
        # last group smaller than p).
        for m in (p * 2, p * 2 + 1):
            # Megatron's training refuses p = 2 interleaved without overlap.
            for overlap in ((False,) if v == 1 else
                            (True,) if p == 2 else (False, True)):
                for varlen in (False, True):
                    for sp in ((False, True) if t > 1 else (False,)):
                        cases.append(SimpleNamespace(
                            name="%s m=%d%s%s%s" % (
                                sched, m, " overlap" if overlap else "",
                                " varlen" if varlen else "",
                                " sp" if sp else ""),
                            p=p, t=t, v=v, m=m, overlap=overlap,
                            group=p if m % p == 0 else p + 1,
                            varlen=varlen, sp=sp, cp=cp, route="install",
                            order="tp-cp-ep-dp-pp"))
    # Inference and evaluation: forward_only, the forward boundaries alone.
    cases += [SimpleNamespace(**dict(vars(c), forward_only=True,
                                     name=c.name + " forward_only"))
              for c in cases if c.m % p == 0 and not c.varlen and
              (c.v == 1 or c.overlap)]
    if t > 1:
        # The TP group's all_gather_into_tensor (gloo here) rebuilds them.
        cases += [SimpleNamespace(**dict(vars(c), gather="tp_group",
                                         name=c.name + " tp_group-gather"))
                  for c in cases if not c.sp]
    # Megatron's --use-tp-pp-dp-mapping (which upstream refuses with
    # context parallelism: the expert layers' data-parallel size differs).
    base = dict(vars(cases[0]), route="explicit", order=explicit_order(cp))
    cases.append(SimpleNamespace(**dict(base, name=explicit_name(cp))))
    cases.append(SimpleNamespace(**dict(base, name=explicit_name(cp) +
                                        " full", mode="full")))
    if t > 1:
        cases.append(SimpleNamespace(**dict(
            base, name=explicit_name(cp) + " tp_group-gather",
            gather="tp_group")))
    cases.sort(key=lambda c: (c.order, c.v))  # one layout after another
    return cases


def explicit_order(cp):
    return "tp-cp-ep-pp-dp" if cp == 1 else "tp-cp-ep-dp-pp"


def explicit_name(cp):
    return "1f1b explicit " + explicit_order(cp)


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames:
        t, cp = (metafunc.config.getoption(o) for o in ("--tp", "--cp"))
        cases = make_cases(t, cp, int(os.environ["WORLD_SIZE"]) // (t * cp))
        metafunc.parametrize("case", cases, ids=[c.name for c in cases])


@pytest.fixture(scope="module", autouse=True)
def job(gloo_job):
    stagelink.megatron.install()


@pytest.fixture(scope="module")
def p(world, tp, cp):
    return world // (tp * cp)


_sent = {}  # case name -> (stage bytes sent, pipeline rank)


def test_misuse(tp, p, monkeypatch):
    misuse(tp, p, monkeypatch)


def test_one_stage_and_reopen(tp, p):
    one_stage_and_reopen(tp, p)
    dist.barrier()


def test_overlap_ring(tp, p):
    overlap_ring(tp, p)
    dist.barrier()


def test_schedule(case):
    _sent[case.name] = run_case(case)
    dist.barrier()


def test_forward_only_bytes(tp, cp, p):
    """forward_only sends the forward boundaries alone: what training
    sends less the backward ones (none from the last stage without
    interleaving; every stage sends backward with it)."""
    for case in make_cases(tp, cp, p):
        if getattr(case, "forward_only", False):
            train = case.name.replace(" forward_only", "")
            (fwd, stage), (both, _) = _sent[case.name], _sent[train]
            alone = case.v == 1 and stage == 0
            last = case.v == 1 and stage == p - 1
            check((fwd == both if alone else fwd < both) and
                  (fwd == 0) == last,
                  "%s: stage %d sent %d bytes, training %d (want %s)" % (
                      case.name, stage, fwd, both,
                      "the same" if alone else "none" if last else "fewer"))


def test_scatter_gather_bytes(tp, cp):
    """The same schedule, scatter_gather against full: 1/t of the bytes;
    every stage sends (forward or backward): none may send nothing."""
    explicit = explicit_name(cp)
    sg, full = (_sent[explicit + s][0] for s in ("", " full"))
    check(sg * tp == full and full > 0,
          "stage bytes sent: scatter_gather %d, full %d (want 1/%d)"
          % (sg, full, tp))
    if tp > 1:
        by_group = _sent[explicit + " tp_group-gather"][0]
        check(by_group == sg, "stage bytes sent with the TP group's gather: "
              "%d, with stagelink's %d (want the same 1/%d)" % (by_group, sg,
                                                                 tp))


def strided_hop(p2p, what):
    """Around the ring with overlap, each stage sends a transposed view
    (not contiguous) of a tensor that holds its stage number and position,
    and drops it before waiting; the next stage must receive its values."""
    base = torch.arange(B * 4 * H, dtype=DTYPE, device=DEVICE).reshape(B, 4, H)
    view = (base + 1000 * p2p.current_stage).transpose(0, 1)
    check(not view.is_contiguous(), "the view is contiguous")
    got, handles = p2p.send_forward_recv_forward(view, True, (4, B, H),
                                                 overlap_p2p_comm=True)
    del view  # the request keeps what it sends
    for key in list(handles):
        handles.pop(key).wait()
    prev = (p2p.current_stage - 1) % p2p.total_stages
    check(torch.equal(got, (base + 1000 * prev).transpose(0, 1)),
          "%s: stage %d did not receive stage %d's strided tensor's values"
          % (what, p2p.current_stage, prev))


def restart_in_process(t, p):
    """Megatron's in-process restart: new model-parallel groups of the same
    ranks, then the default group destroyed and initialized again (over a
    prefix of the old store, as restart wrappers do).  Each time the
    schedules' P2PCommunicator gets a new Communicator, the old one closed,
    and the boundary carries its values (a strided send among them)."""
    _pp, config = one_chunk_pipeline(t, p)
    replicated = dataclasses.replace(config, sequence_parallel=False,
                                     batch_p2p_comm=False)
    gather = "tp_group" if t > 1 else None

    def p2p():
        return stagelink.megatron.P2PCommunicator(
            parallel_state.get_pipeline_model_parallel_group(), replicated,
            gather=gather)

    first = p2p()
    strided_hop(first, "before the restart")
    # New groups of the same ranks: the TP group the gather ran on is not
    # Megatron's any more (at t = 1 nothing is gathered: the Communicator
    # stays).
    parallel_state.destroy_model_parallel()
    _layout[:] = []
    one_chunk_pipeline(t, p)
    second = p2p()
    check((second.communicator is first.communicator) == (t == 1) and
          first.communicator._open == (t == 1) and
          not first.communicator._aborted,
          "new model-parallel groups at t = %d: the Communicator was %s and "
          "the old one %s%s (want closed collectively at t > 1)" % (
              t, "kept" if second.communicator is first.communicator
              else "made anew", "open" if first.communicator._open
              else "closed", " after an abort" if first.communicator._aborted
              else ""))
    strided_hop(second, "after new model-parallel groups")
    # A new world: every Communicator of the old one ends without a peer.
    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    parallel_state.destroy_model_parallel()
    _layout[:] = []
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.PrefixStore("restart/", store),
                            rank=rank, world_size=world)
    one_chunk_pipeline(t, p)
    third = p2p()
    check(third.communicator is not second.communicator and
          not second.communicator._open and second.communicator._aborted,
          "a new torch world: the old world's Communicator was %s, %s"
          % ("kept" if third.communicator is second.communicator
             else "replaced", "open" if second.communicator._open
             else "closed" if not second.communicator._aborted
             else "aborted"))
    # Every Communicator of the old world (the earlier tests' too) ended.
    current = [link.comm for link in stagelink.megatron._links.values()]
    stale = [c for c in stagelink.communicator._open_comms.values()
             if all(c is not k for k in current)]
    check(not stale and all(link.world is dist.group.WORLD for link in
                            stagelink.megatron._links.values()),
          "%d Communicators of the old torch world are still open"
          % len(stale))
    strided_hop(third, "after a new torch world")


def test_restart_in_process(tp, p):
    restart_in_process(tp, p)
    dist.barrier()
