"""stagelink under Megatron-Core's pipeline schedules.

Megatron-Core since core_v0.14 moves pipeline tensors through
`P2PCommunicator(pp_group, config)` (megatron/core/pipeline_parallel/
p2p_communication.py), which its schedules build by name.  This module's
`P2PCommunicator` has the same constructor, attributes, properties,
methods and list semantics, and returns what upstream returns; stagelink
moves the tensors.  Two ways to use it:

    import stagelink.megatron
    stagelink.megatron.install()    # schedules.P2PCommunicator is ours now
    get_forward_backward_func()(...)

    p2p = stagelink.megatron.P2PCommunicator(pg_collection.pp, config,
                                             tp_group=pg_collection.tp)
    get_forward_backward_func()(..., p2p_communicator=p2p,
                                pg_collection=pg_collection)

Placement comes from Megatron's own groups: the pipeline group's ring (its
wrap-around feeds the interleaved schedule's last stage into the first)
and the tensor-parallel group (tp_group=, else parallel_state's), so any
rank order (tp-pp-dp mapping included) is followed.  The stagelink
Communicator behind is made collectively at the first construction and
shared by every later one with the same groups and mode.

Boundaries (config.sequence_parallel):
- off: every TP rank holds the same [s, b, h] tensor: mode scatter_gather,
  each TP rank sends 1/t and the receivers all-gather it;
- on: each TP rank holds only its own [s/t, b, h] slice, which is the whole
  transfer: mode full.
`sharded` is refused: no Megatron boundary keeps a full-size buffer of
which each rank reads only its own shard.

NCCL pairs Megatron's point-to-point operations by their order; stagelink
pairs them by tag.  Each direction to each neighbour keeps a counter: the
k-th tensor sent forward to the next stage carries microbatch tag k, as
does the k-th receive from the previous stage.  With variable_seq_lengths
(or mtp_standalone) each tensor's shape goes first, on the same tag with
chunk 1.

Megatron-Core before core_v0.14 looked functions up on p2p_communication:
`initialize(comm)` and this module's functions of the same names
(recv_forward(tensor_shape, config, is_first_stage) ...) serve it.

SPDX-License-Identifier: MIT
"""

import functools
import logging
import os
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import _lib
from .communicator import Communicator, P2POp, Placement, _group_ranks
from .errors import StagelinkError, error

__all__ = ["P2PCommunicator", "install", "is_single_shape", "initialize",
           "recv_forward", "recv_backward", "send_forward", "send_backward",
           "send_forward_recv_backward", "send_backward_recv_forward",
           "send_forward_recv_forward", "send_backward_recv_backward",
           "send_forward_backward_recv_forward_backward"]

_log = logging.getLogger("stagelink")

_SHAPE_CHUNK = 1   # the tag's chunk of a shape; tensors use chunk 0
_SHAPE_SLOTS = 8   # ndim, then up to 7 sizes
_MODES = ("scatter_gather", "full")


def is_single_shape(x) -> bool:
    """Whether `x` is one shape (not a list of shapes), as upstream's."""
    if isinstance(x, torch.Size):
        return True
    return (isinstance(x, (list, tuple)) and len(x) > 0 and
            all(isinstance(d, int) for d in x))


class _Link:
    """A stagelink Communicator with the tag counters of its boundary."""

    @staticmethod
    def default_device():
        """Where Megatron allocates the boundary's tensors."""
        return (torch.device("cuda", torch.cuda.current_device())
                if torch.cuda.is_available() else torch.device("cpu"))

    def __init__(self, comm: Communicator, device=None, world=None,
                 gather_group=None, made=False):
        if device is None:
            device = self.default_device()
        self.comm, self.device = comm, torch.device(device)
        # The torch world and TP group it was made for, and whether this
        # module made its Communicator (and so may end it).
        self.world, self.gather_group, self.made = world, gather_group, made
        # (operation, neighbour) -> the next tag: forward is send/next and
        # recv/prev, backward send/prev and recv/next.
        self.count = {("send", "next"): 0, ("recv", "prev"): 0,
                      ("send", "prev"): 0, ("recv", "next"): 0}
        self.broken = None  # why the counters may differ from the peers'

    def tag(self, op, peer):
        k = self.count[(op, peer)]
        self.count[(op, peer)] = (k + 1) & _lib.TAG_MAX_MICROBATCH
        return k


# (pipeline ranks, TP ranks, mode) -> _Link: schedules build a
# P2PCommunicator per call; the Communicator behind is made once.
_links: Dict[Tuple, _Link] = {}
_installed: Dict[str, Any] = {}


def _tp_group(tp_group):
    if tp_group is not None:
        return tp_group
    try:
        from megatron.core import parallel_state
    except ImportError:
        parallel_state = None
    if parallel_state is not None and \
            parallel_state.model_parallel_is_initialized():
        return parallel_state.get_tensor_model_parallel_group()
    raise RuntimeError(
        "stagelink.megatron.P2PCommunicator needs Megatron's tensor-parallel "
        "group: initialize megatron.core.parallel_state, or pass "
        "tp_group= (pg_collection.tp)")


def _mode(config, tp_size, mode, source="mode="):
    """The mode to create the Communicator with: "default" (STAGELINK_MODE
    may choose, for A/B tests) where the boundary is replicated and the
    code asked for none, else the one it must be.  `source`: who chose
    `mode`, for the sentence."""
    sp = bool(getattr(config, "sequence_parallel", False)) and tp_size > 1
    if mode is None:
        return "full" if sp else "default"
    if mode == "sharded":
        raise ValueError(
            "stagelink.megatron: %s\"sharded\" leaves all but 1/t of each "
            "received tensor unwritten, and no Megatron boundary reads only "
            "its shard: use scatter_gather (replicated [s, b, h]) or full "
            "(sequence parallelism's own [s/t, b, h] slice)%s" % (
                source, "; unset STAGELINK_MODE" if "STAGELINK" in source
                else ""))
    if mode not in _MODES:
        raise ValueError("stagelink.megatron: mode %r: want one of %s"
                         % (mode, ", ".join(_MODES)))
    if sp and mode != "full":
        raise ValueError(
            "sequence_parallel: each TP rank holds only its own [s/t, b, h] "
            "tensor, which is the whole transfer; use mode \"full\" "
            "(scatter_gather would split and gather it)")
    return mode


def _check_placement(comm, prev_rank, next_rank, tp_ranks, mode):
    """A Communicator given by hand must be Megatron's boundary."""
    info = comm.info
    want = {"prev_rank": -1 if prev_rank is None else prev_rank,
            "next_rank": -1 if next_rank is None else next_rank,
            "tp_size": len(tp_ranks), "tp_index": tp_ranks.index(info["rank"])
            if info["rank"] in tp_ranks else -1,
            "mode": _lib.MODES[mode]}
    wrong = ["%s %s (Megatron's groups: %s)" % (k, info[k], v)
             for k, v in want.items() if info[k] != v]
    if wrong:
        raise ValueError(
            "stagelink.megatron: the Communicator disagrees with Megatron's "
            "process groups: %s; create it with placement="
            "stagelink.Placement(prev_rank, next_rank, tp_ranks) from the "
            "groups, or let stagelink.megatron create it" % "; ".join(wrong))


_GATHERS = ("tp_group", "stagelink")


def _gather(gather, device):
    """Who rebuilds a scatter/gather boundary: torch's all_gather_into_tensor
    on Megatron's TP group ("tp_group": CUDA tensors, by default, so that
    Megatron's own TP collectives and the gather share one communicator and
    one order) or stagelink's own gather ("stagelink": CPU tensors, by
    default, where it overlaps the stage transfer and measured faster;
    docs/performance.md)."""
    if gather is None:
        return "tp_group" if device.type == "cuda" else "stagelink"
    if gather not in _GATHERS:
        raise ValueError("stagelink.megatron: gather %r: want one of %s"
                         % (gather, ", ".join(_GATHERS)))
    return gather


def _link_for(pp_group, config, tp_group, mode, comm, gather=None):
    import torch.distributed as dist
    pp_ranks = _group_ranks(pp_group)
    me = dist.get_rank()
    group = (_tp_group(tp_group)
             if len(pp_ranks) < dist.get_world_size() or tp_group is not None
             else None)
    tp_ranks = _group_ranks(group) if group is not None else [me]
    if me not in tp_ranks:
        raise ValueError("stagelink.megatron: rank %d is not in its TP group "
                         "%r" % (me, tp_ranks))
    asked = _mode(config, len(tp_ranks), mode)
    r = pp_ranks.index(me)
    # One stage has no boundary (upstream's neighbours are the rank
    # itself, and its calls never reach them).
    prev_rank = pp_ranks[(r - 1) % len(pp_ranks)] if len(pp_ranks) > 1 else None
    next_rank = pp_ranks[(r + 1) % len(pp_ranks)] if len(pp_ranks) > 1 else None
    device = _Link.default_device()
    by = _gather(gather, device) if len(tp_ranks) > 1 else "stagelink"
    # A default mode is STAGELINK_MODE's choice: keyed by it too.
    key = (tuple(pp_ranks), tuple(tp_ranks), asked, by,
           os.environ.get("STAGELINK_MODE") if asked == "default" else None)
    world = dist.group.WORLD
    gather_group = group if by == "tp_group" else None
    _retire_worlds_but(world)
    link = _links.get(key)
    if link is not None and not link.comm._open:  # closed by hand
        del _links[key]
        link = None
    if link is not None and link.gather_group is not gather_group:
        # New model-parallel groups of the same ranks (destroy_model_parallel,
        # then initialize_model_parallel): every rank meets them at this
        # construction, so the old Communicator is closed collectively.
        _retire(key, collective=True)
        link = None
    if link is not None and (comm is None or link.comm is comm):
        return link
    made = comm is None
    if made:
        if dist.get_world_size() % (len(pp_ranks) * len(tp_ranks)) != 0:
            raise ValueError(
                "stagelink.megatron: a pipeline of %d stages of %d TP ranks "
                "does not tile the job's %d ranks; a P2PCommunicator of a "
                "sub-pipeline needs comm= made for it" % (
                    len(pp_ranks), len(tp_ranks), dist.get_world_size()))
        # STAGELINK_MODE picks a transport, and sharded is none: refused
        # here in Megatron's terms (the library refuses it too).
        if asked == "default" and _lib.setting("STAGELINK_MODE") == "sharded":
            _mode(config, len(tp_ranks), "sharded", "STAGELINK_MODE=")
        try:
            comm = Communicator(tp_size=len(tp_ranks),
                                pp_size=len(pp_ranks), mode=asked,
                                placement=Placement(prev_rank, next_rank,
                                                    tp_ranks),
                                tp_group=group if by == "tp_group" else None)
        except StagelinkError as e:
            if mode is None and asked == "full" and \
                    "STAGELINK_MODE=" in e.message:
                raise error(e.code, (
                    "stagelink.megatron asked for mode full because "
                    "config.sequence_parallel gives each TP rank its own "
                    "[s/t, b, h] slice: %s") % e.message) from e
            raise
    got = [k for k, v in _lib.MODES.items() if v == comm.info["mode"]][0]
    try:
        if asked == "default" and got == "sharded":  # a comm= made so
            _mode(config, len(tp_ranks), "sharded", "comm= of mode ")
        _check_placement(comm, prev_rank, next_rank, tp_ranks,
                         got if asked == "default" else asked)
        if not made and gather is not None and \
                comm.info["gather_backend"] != "none" and \
                (comm.info["gather_backend"] == "host") != (by == "tp_group"):
            raise ValueError(
                "stagelink.megatron: gather=%r, but the Communicator given "
                "gathers with %s; create it with%s tp_group=" % (
                    gather, comm.info["gather_backend"],
                    "" if by == "tp_group" else "out"))
    except ValueError:
        if made:
            comm.close()  # refused alike on every rank: nothing was posted
        raise
    link = _links[key] = _Link(comm, device, world, gather_group, made)
    return link


def _retire(key, collective):
    """Drops a cached link; ends its Communicator if this module made it:
    collectively (close), or at once (abort, then close without the
    barrier) when its world is gone and its peers may be too."""
    link = _links.pop(key)
    if not link.made:
        return  # a comm= given by hand stays its owner's
    if not collective:
        try:
            link.comm.abort()
        except StagelinkError as e:
            _log.info("stagelink.megatron: aborting the Communicator of an "
                      "earlier torch world: %s", e)
    try:
        link.comm.close()
    except StagelinkError as e:
        # A collective close that failed is what ranks disagreeing looks
        # like: say so where it is seen by default.
        (_log.warning if collective else _log.info)(
            "stagelink.megatron: closing the Communicator of earlier process "
            "groups: %s", e)


def _retire_worlds_but(world):
    """After destroy_process_group and a new init_process_group (an
    in-process restart), the Communicators of the old world belong to a
    job no rank runs any more: each ends at once, newest first."""
    for key in [k for k, v in reversed(list(_links.items()))
                if v.world is not world]:
        _retire(key, collective=False)


def _sendable(link, tensor, varlen):
    """A tensor to send, checked before any tag is taken (a refusal after
    would leave the peer's receive waiting): a strided, conjugate or
    negative view (a transpose, channels-last) goes as its values, in a
    copy the request keeps alive."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("stagelink.megatron sends torch.Tensors, not %s"
                        % type(tensor).__name__)
    if tensor.layout is not torch.strided:
        raise ValueError("a %s tensor cannot be sent: pass a dense one "
                         "(tensor.to_dense())" % tensor.layout)
    if tensor.is_cuda and link.device.type == "cuda" and \
            tensor.device.index != link.device.index:
        raise ValueError(
            "a tensor of %s, but this boundary works on %s (the current "
            "device at its first P2PCommunicator): call "
            "torch.cuda.set_device before it" % (tensor.device, link.device))
    if varlen and tensor.dim() >= _SHAPE_SLOTS:
        raise ValueError("variable_seq_lengths: a %d-dimensional tensor has "
                         "more sizes than the shape exchange carries (%d)"
                         % (tensor.dim(), _SHAPE_SLOTS - 1))
    copy = tensor.resolve_conj().resolve_neg().contiguous()
    if copy is not tensor and tensor.is_cuda:
        # The copy reads it on the current stream: memory allocated on
        # another must not be reused before.
        tensor.record_stream(torch.cuda.current_stream(tensor.device))
    return copy


def _shape_tensor(tensor):
    sizes = [tensor.dim()] + list(tensor.shape)
    return torch.tensor(sizes + [0] * (_SHAPE_SLOTS - len(sizes)),
                        dtype=torch.int64)


class _Handles(dict):
    """The module functions' requests of an overlapped call, keyed as
    P2PCommunicator's; iterating yields the requests themselves, as the
    schedules of Megatron-Core before core_v0.14 loop
    `for req in handles: req.wait()`.  P2PCommunicator returns a plain
    dict, as upstream does."""

    def __iter__(self):
        return iter(list(self.values()))


class _Refused(ValueError, AssertionError):
    """A combination upstream refuses with an assert: caught as either."""


def _communicate(link, *, tensor_send_next, tensor_send_prev, recv_prev,
                 recv_next, tensor_shape, config, wait_on_reqs=True,
                 handles=dict):
    """Megatron-Core's _communicate: (tensor_recv_prev, tensor_recv_next,
    requests), the requests None once waited for, else a `handles` keyed
    "send_next", "recv_prev", "send_prev", "recv_next"."""
    if link.broken is not None:
        raise RuntimeError(
            "stagelink.megatron: an earlier transfer failed (%s), so this "
            "rank's tag counters no longer match its peers': restart from a "
            "checkpoint" % link.broken)
    send = {"next": tensor_send_next, "prev": tensor_send_prev}
    recv = {"prev": recv_prev, "next": recv_next}
    varlen = (getattr(config, "variable_seq_lengths", False) or
              getattr(config, "mtp_standalone", False))
    for p in ("prev", "next"):
        if not recv[p]:
            continue
        if getattr(config, "pipeline_dtype", None) is None:
            raise RuntimeError("pipeline_dtype must be provided if recv_%s is "
                               "True" % p)
        if tensor_shape is None:
            raise RuntimeError(
                "tensor_shape must be specified if recv_%s is True. Common "
                "tensor_shape is (seq_length, micro_batch_size, hidden_size)"
                % p)
    # Upstream asserts it where it picks batched operations (its ring
    # exchange, which stagelink's transfers replace, goes first).
    if getattr(config, "batch_p2p_comm", False) and not wait_on_reqs and \
            not getattr(config, "use_ring_exchange_p2p", False):
        raise _Refused("batch_p2p_comm and overlap_p2p_comm together: "
                       "Megatron-Core refuses them too; set "
                       "batch_p2p_comm=False")
    for p in ("next", "prev"):
        if send[p] is not None:
            send[p] = _sendable(link, send[p], varlen)
    # Tags only once nothing can be refused before posting, in one fixed
    # order, so that both sides count alike.
    tags = {("send", p): link.tag("send", p) for p in ("next", "prev")
            if send[p] is not None}
    tags.update({("recv", p): link.tag("recv", p) for p in ("prev", "next")
                 if recv[p]})
    try:
        return _exchange(link, send, recv, tags, tensor_shape, config, varlen,
                         wait_on_reqs, handles)
    except BaseException as e:
        link.broken = "%s: %s" % (type(e).__name__, e)
        raise


def _post(comm, ops):
    return comm.batch_isend_irecv(ops) if ops else []


def _exchange(link, send, recv, tags, tensor_shape, config, varlen,
              wait_on_reqs, handles):
    comm = link.comm
    shapes = {"prev": tensor_shape, "next": tensor_shape}
    if varlen:
        ops, boxes = [], {}
        for p in ("prev", "next"):
            if recv[p]:
                boxes[p] = torch.empty(_SHAPE_SLOTS, dtype=torch.int64,
                                       device=link.device)
                ops.append(P2POp(comm.irecv, boxes[p], p,
                                 tags[("recv", p)], _SHAPE_CHUNK))
            if send[p] is not None:
                ops.append(P2POp(comm.isend, _shape_tensor(send[p]).to(
                    link.device), p, tags[("send", p)], _SHAPE_CHUNK))
        for req in _post(comm, ops):
            req.wait()
        for p, box in boxes.items():
            sizes = box.tolist()
            shapes[p] = sizes[1:1 + sizes[0]]

    received, ops, keys = {}, [], []
    for p in ("prev", "next"):
        if recv[p]:
            received[p] = torch.empty(shapes[p], requires_grad=True,
                                      device=link.device,
                                      dtype=config.pipeline_dtype)
            ops.append(P2POp(comm.irecv, received[p], p, tags[("recv", p)]))
            keys.append("recv_" + p)
    for p in ("next", "prev"):
        if send[p] is not None:
            ops.append(P2POp(comm.isend, send[p], p, tags[("send", p)]))
            keys.append("send_" + p)
    reqs = _post(comm, ops)
    if wait_on_reqs:
        for req in reqs:
            req.wait()
        # As upstream: None once waited for, the empty container if none.
        reqs = None if reqs else ([] if getattr(config, "batch_p2p_comm",
                                                False) else handles())
    else:
        reqs = handles(zip(keys, reqs))
    return received.get("prev"), received.get("next"), reqs


class _Timed:
    """config.timers(name, log_level=2).start()/stop(), as Megatron."""

    def __init__(self, config, name):
        self.timers, self.name = getattr(config, "timers", None), name

    def __enter__(self):
        if self.timers is not None:
            self.timers(self.name, log_level=2).start()

    def __exit__(self, *exc):
        if self.timers is not None:
            self.timers(self.name).stop()


_nvtx_utils: List[Any] = []  # megatron.core.utils, or None; looked up once


def _nvtx(method):
    """Upstream's @nvtx_decorator(): the NVTX range Megatron-Core's
    profiling (configure_nvtx_profiling) opens around each method, under
    upstream's name, so Nsight's filters still find it."""
    name = ("megatron.core.pipeline_parallel.p2p_communication." +
            method.__name__)

    @functools.wraps(method)
    def ranged(*args, **kwargs):
        if not _nvtx_utils:
            try:
                from megatron.core import utils
            except ImportError:
                utils = None
            _nvtx_utils.append(utils if hasattr(utils, "nvtx_range_push")
                               and hasattr(utils, "nvtx_range_pop")
                               else None)
        utils = _nvtx_utils[0]
        if utils is None:
            return method(*args, **kwargs)
        utils.nvtx_range_push(name)
        try:
            return method(*args, **kwargs)
        finally:
            utils.nvtx_range_pop(name)
    return ranged


class P2PCommunicator:
    """Megatron-Core's P2PCommunicator over stagelink.

    P2PCommunicator(pp_group, config) as upstream; tp_group= (default:
    parallel_state's tensor-parallel group), mode= ("scatter_gather" or
    "full"; default: full under sequence_parallel, else scatter_gather),
    gather= ("tp_group": torch's all_gather_into_tensor on tp_group, the
    default for CUDA tensors; "stagelink": stagelink's own, the default on
    CPU) and comm= (a stagelink.Communicator made by hand, checked against
    the groups) are stagelink's own, keyword-only."""

    def __init__(self, pp_group, config, *, tp_group=None,
                 mode: Optional[str] = None,
                 comm: Optional[Communicator] = None,
                 gather: Optional[str] = None):
        import torch.distributed as dist
        self.pp_group = pp_group
        self.config = config
        world_size = self.pp_group.size()
        curr_rank_in_pg = self.pp_group.rank()
        self.next_rank: Optional[int] = dist.get_global_rank(
            self.pp_group, (curr_rank_in_pg + 1) % world_size)
        self.prev_rank: Optional[int] = dist.get_global_rank(
            self.pp_group, (curr_rank_in_pg - 1) % world_size)
        self.virtual_pipeline_model_parallel_size = getattr(
            config, "virtual_pipeline_model_parallel_size", None)
        self._link = _link_for(pp_group, config, tp_group, mode, comm,
                               gather)

    @property
    def is_pp_first_stage(self) -> bool:
        """Return True if pp first stage."""
        return self.pp_group.rank() == 0

    @property
    def is_pp_last_stage(self) -> bool:
        """Return True if pp last stage."""
        return self.pp_group.rank() == self.pp_group.size() - 1

    @property
    def total_stages(self) -> int:
        """Return total number of pipeline stages."""
        return self.pp_group.size()

    @property
    def current_stage(self) -> int:
        """Return current pipeline stage index (0-indexed)."""
        return self.pp_group.rank()

    @property
    def communicator(self) -> Communicator:
        """The stagelink Communicator that carries this boundary."""
        return self._link.comm

    def _communicate(self, *, tensor_send_next, tensor_send_prev, recv_prev,
                     recv_next, tensor_shape, wait_on_reqs=True):
        return _communicate(self._link, tensor_send_next=tensor_send_next,
                            tensor_send_prev=tensor_send_prev,
                            recv_prev=recv_prev, recv_next=recv_next,
                            tensor_shape=tensor_shape, config=self.config,
                            wait_on_reqs=wait_on_reqs)

    def _each(self, timer, skip, pairs, send, recv):
        """Upstream's loop over lists: one exchange per (tensor, shape),
        sending to `send` and receiving from `recv` ("next", "prev" or
        None); the received tensors (None where skipped)."""
        received = []
        for tensor, shape in pairs:
            got = None
            if not skip:
                with _Timed(self.config, timer):
                    prev, nxt, _ = self._communicate(
                        tensor_send_next=tensor if send == "next" else None,
                        tensor_send_prev=tensor if send == "prev" else None,
                        recv_prev=recv == "prev", recv_next=recv == "next",
                        tensor_shape=shape)
                got = prev if recv == "prev" else nxt
            received.append(got)
        return received

    @_nvtx
    def recv_forward(self, tensor_shapes, is_first_stage: bool):
        """Receive tensor from previous rank in pipeline (forward receive)."""
        unwrap = is_single_shape(tensor_shapes)
        got = self._each("forward-recv", is_first_stage,
                         [(None, s) for s in ([tensor_shapes] if unwrap
                                              else tensor_shapes)],
                         None, "prev")
        return got[0] if unwrap else got

    @_nvtx
    def recv_backward(self, tensor_shapes, is_last_stage: bool):
        """Receive tensor from next rank in pipeline (backward receive)."""
        unwrap = is_single_shape(tensor_shapes)
        got = self._each("backward-recv", is_last_stage,
                         [(None, s) for s in ([tensor_shapes] if unwrap
                                              else tensor_shapes)],
                         None, "next")
        return got[0] if unwrap else got

    @_nvtx
    def send_forward(self, output_tensors, is_last_stage: bool) -> None:
        """Send tensor to next rank in pipeline (forward send)."""
        if not isinstance(output_tensors, list):
            output_tensors = [output_tensors]
        self._each("forward-send", is_last_stage,
                   [(t, None) for t in output_tensors], "next", None)

    @_nvtx
    def send_backward(self, input_tensor_grads, is_first_stage: bool) -> None:
        """Send tensor to previous rank in pipeline (backward send)."""
        if not isinstance(input_tensor_grads, list):
            input_tensor_grads = [input_tensor_grads]
        self._each("backward-send", is_first_stage,
                   [(t, None) for t in input_tensor_grads], "prev", None)

    @_nvtx
    def send_forward_recv_backward(self, output_tensors, tensor_shapes,
                                   is_last_stage: bool):
        """Batched send and recv with next rank in pipeline."""
        unwrap = not isinstance(output_tensors, list)
        if not isinstance(tensor_shapes, list):
            tensor_shapes = [tensor_shapes]
        got = self._each("forward-send-backward-recv", is_last_stage,
                         list(zip([output_tensors] if unwrap
                                  else output_tensors, tensor_shapes)),
                         "next", "next")
        return got[0] if unwrap else got

    @_nvtx
    def send_backward_recv_forward(self, input_tensor_grads, tensor_shapes,
                                   is_first_stage: bool):
        """Batched send and recv with previous rank in pipeline."""
        unwrap = not isinstance(input_tensor_grads, list)
        if not isinstance(tensor_shapes, list):
            tensor_shapes = [tensor_shapes]
        got = self._each("backward-send-forward-recv", is_first_stage,
                         list(zip([input_tensor_grads] if unwrap
                                  else input_tensor_grads, tensor_shapes)),
                         "prev", "prev")
        return got[0] if unwrap else got

    @_nvtx
    def send_forward_recv_forward(self, output_tensor, recv_prev: bool,
                                  tensor_shape, overlap_p2p_comm: bool = False):
        """Batched recv from previous rank and send to next rank in
        pipeline; with overlap_p2p_comm, (tensor, handles)."""
        with _Timed(self.config, "forward-send-forward-recv"):
            input_tensor, _, wait_handles = self._communicate(
                tensor_send_next=output_tensor, tensor_send_prev=None,
                recv_prev=recv_prev, recv_next=False,
                tensor_shape=tensor_shape, wait_on_reqs=not overlap_p2p_comm)
        if overlap_p2p_comm:
            return input_tensor, wait_handles
        return input_tensor

    @_nvtx
    def send_backward_recv_backward(self, input_tensor_grad, recv_next: bool,
                                    tensor_shape,
                                    overlap_p2p_comm: bool = False):
        """Batched recv from next rank and send to previous rank in
        pipeline; with overlap_p2p_comm, (tensor, handles)."""
        with _Timed(self.config, "backward-send-backward-recv"):
            _, output_tensor_grad, wait_handles = self._communicate(
                tensor_send_next=None, tensor_send_prev=input_tensor_grad,
                recv_prev=False, recv_next=recv_next,
                tensor_shape=tensor_shape, wait_on_reqs=not overlap_p2p_comm)
        if overlap_p2p_comm:
            return output_tensor_grad, wait_handles
        return output_tensor_grad

    @_nvtx
    def send_forward_backward_recv_forward_backward(
            self, output_tensor, input_tensor_grad, recv_prev: bool,
            recv_next: bool, tensor_shape):
        """Batched send and recv with previous and next ranks in pipeline."""
        with _Timed(self.config,
                    "forward-backward-send-forward-backward-recv"):
            input_tensor, output_tensor_grad, _ = self._communicate(
                tensor_send_next=output_tensor,
                tensor_send_prev=input_tensor_grad, recv_prev=recv_prev,
                recv_next=recv_next, tensor_shape=tensor_shape)
        return input_tensor, output_tensor_grad


def install(*, tp_group=None, mode: Optional[str] = None,
            gather: Optional[str] = None) -> None:
    """Makes Megatron-Core's schedules build stagelink's P2PCommunicator:
    schedules.py, which imported upstream's class by name, gets this one,
    which takes `tp_group`, `mode` and `gather` as P2PCommunicator's
    keywords.  Call it after
    parallel_state.initialize_model_parallel and before the schedules
    run; uninstall() puts upstream's class back."""
    try:
        from megatron.core.pipeline_parallel import p2p_communication, schedules
    except ImportError as e:
        raise ImportError("stagelink.megatron.install needs megatron-core "
                          "0.14 or newer (%s)" % e) from e
    upstream = _installed.get("upstream",
                              getattr(p2p_communication, "P2PCommunicator",
                                      None))
    if upstream is None:
        raise RuntimeError(
            "this megatron-core has no P2PCommunicator (before core_v0.14): "
            "use stagelink.megatron.initialize(comm) and its module "
            "functions instead (docs/python.md)")
    _mode(None, 1, mode)  # refuses sharded and unknown modes now
    if gather is not None:
        _gather(gather, torch.device("cpu"))  # and unknown gathers

    class _Installed(P2PCommunicator):
        def __init__(self, pp_group, config, **kw):
            kw.setdefault("tp_group", tp_group)
            kw.setdefault("mode", mode)
            kw.setdefault("gather", gather)
            super().__init__(pp_group, config, **kw)

    _Installed.__name__ = _Installed.__qualname__ = "P2PCommunicator"
    if getattr(schedules, "P2PCommunicator", None) not in (
            upstream, _installed.get("class")):
        raise RuntimeError("megatron.core.pipeline_parallel.schedules does "
                           "not use P2PCommunicator by that name")
    # Only the schedules: others (multimodule_communicator) build one per
    # sub-pipeline of a few ranks, which a stagelink Communicator of the
    # whole job does not describe.
    _installed["upstream"] = upstream
    schedules.P2PCommunicator = _Installed
    _installed["modules"] = [schedules]
    _installed["class"] = _Installed


def uninstall() -> None:
    """Puts upstream's P2PCommunicator back where install() replaced it."""
    for module in _installed.pop("modules", []):
        module.P2PCommunicator = _installed["upstream"]
    _installed.pop("class", None)


# -- Megatron-Core before core_v0.14: module functions ---------------------
_default: Optional[_Link] = None


def initialize(comm: Communicator, device: Optional[Any] = None) -> None:
    """Older Megatron-Core: makes `comm` carry this module's functions.
    `device`: where received tensors are created (default: the current
    CUDA device where CUDA is usable, else the CPU).  Counters start at
    zero, so every rank calls it at the same point."""
    global _default
    if not isinstance(comm, Communicator):
        raise TypeError("initialize takes a stagelink.Communicator")
    if comm.info["mode"] == _lib.MODES["sharded"]:
        _mode(None, comm.tp_size, "sharded")
    _default = _Link(comm, device)


def _get():
    if _default is None:
        raise RuntimeError("stagelink.megatron.initialize(comm) was not "
                           "called (current Megatron-Core: "
                           "stagelink.megatron.install())")
    return _default


def _parallel_state_answer(first):
    """Megatron's own view (virtual pipeline included), when it is there."""
    try:
        from megatron.core import parallel_state
    except ImportError:
        return None
    if not parallel_state.model_parallel_is_initialized():
        return None
    return (parallel_state.is_pipeline_first_stage() if first
            else parallel_state.is_pipeline_last_stage())


def _is_first(flag):
    if flag is not None:
        return flag
    answer = _parallel_state_answer(True)
    return _get().comm.is_first_stage if answer is None else answer


def _is_last(flag):
    if flag is not None:
        return flag
    answer = _parallel_state_answer(False)
    return _get().comm.is_last_stage if answer is None else answer


def _legacy(config, **kw):
    link = _get()
    _mode(config, link.comm.tp_size,
          [k for k, v in _lib.MODES.items() if v == link.comm.info["mode"]][0])
    return _communicate(link, config=config, handles=_Handles, **kw)


def recv_forward(tensor_shape: Optional[List[int]], config: Any,
                 is_first_stage: Optional[bool] = None
                 ) -> Optional[torch.Tensor]:
    """Receive from the previous stage (forward); None on the first."""
    if _is_first(is_first_stage):
        return None
    with _Timed(config, "forward-recv"):
        return _legacy(config, tensor_send_next=None, tensor_send_prev=None,
                       recv_prev=True, recv_next=False,
                       tensor_shape=tensor_shape)[0]


def recv_backward(tensor_shape: Optional[List[int]], config: Any,
                  is_last_stage: Optional[bool] = None
                  ) -> Optional[torch.Tensor]:
    """Receive from the next stage (backward); None on the last."""
    if _is_last(is_last_stage):
        return None
    with _Timed(config, "backward-recv"):
        return _legacy(config, tensor_send_next=None, tensor_send_prev=None,
                       recv_prev=False, recv_next=True,
                       tensor_shape=tensor_shape)[1]


def send_forward(output_tensor: Optional[torch.Tensor], config: Any,
                 is_last_stage: Optional[bool] = None) -> None:
    """Send to the next stage (forward); nothing on the last."""
    if not _is_last(is_last_stage):
        with _Timed(config, "forward-send"):
            _legacy(config, tensor_send_next=output_tensor,
                    tensor_send_prev=None, recv_prev=False, recv_next=False,
                    tensor_shape=None)


def send_backward(input_tensor_grad: Optional[torch.Tensor], config: Any,
                  is_first_stage: Optional[bool] = None) -> None:
    """Send to the previous stage (backward); nothing on the first."""
    if not _is_first(is_first_stage):
        with _Timed(config, "backward-send"):
            _legacy(config, tensor_send_next=None,
                    tensor_send_prev=input_tensor_grad, recv_prev=False,
                    recv_next=False, tensor_shape=None)


def send_forward_recv_backward(output_tensor, tensor_shape, config,
                               is_last_stage=None):
    """Batched send to and receive from the next stage."""
    if _is_last(is_last_stage):
        return None
    with _Timed(config, "forward-send-backward-recv"):
        return _legacy(config, tensor_send_next=output_tensor,
                       tensor_send_prev=None, recv_prev=False,
                       recv_next=True, tensor_shape=tensor_shape)[1]


def send_backward_recv_forward(input_tensor_grad, tensor_shape, config,
                               is_first_stage=None):
    """Batched send to and receive from the previous stage."""
    if _is_first(is_first_stage):
        return None
    with _Timed(config, "backward-send-forward-recv"):
        return _legacy(config, tensor_send_next=None,
                       tensor_send_prev=input_tensor_grad, recv_prev=True,
                       recv_next=False, tensor_shape=tensor_shape)[0]


def send_forward_recv_forward(output_tensor, recv_prev, tensor_shape, config,
                              overlap_p2p_comm=False):
    """Interleaved schedule: receive from the previous stage while sending
    to the next.  With overlap_p2p_comm, returns (tensor, requests) and the
    caller waits."""
    with _Timed(config, "forward-send-forward-recv"):
        tensor, _, reqs = _legacy(
            config, tensor_send_next=output_tensor, tensor_send_prev=None,
            recv_prev=recv_prev, recv_next=False, tensor_shape=tensor_shape,
            wait_on_reqs=not overlap_p2p_comm)
    return (tensor, reqs) if overlap_p2p_comm else tensor


def send_backward_recv_backward(input_tensor_grad, recv_next, tensor_shape,
                                config, overlap_p2p_comm=False):
    """Interleaved schedule: receive from the next stage while sending to
    the previous."""
    with _Timed(config, "backward-send-backward-recv"):
        _, tensor, reqs = _legacy(
            config, tensor_send_next=None, tensor_send_prev=input_tensor_grad,
            recv_prev=False, recv_next=recv_next, tensor_shape=tensor_shape,
            wait_on_reqs=not overlap_p2p_comm)
    return (tensor, reqs) if overlap_p2p_comm else tensor


def send_forward_backward_recv_forward_backward(
        output_tensor, input_tensor_grad, recv_prev, recv_next, tensor_shape,
        config):
    """Interleaved schedule: all four at once."""
    with _Timed(config, "forward-backward-send-forward-backward-recv"):
        prev, nxt, _ = _legacy(
            config, tensor_send_next=output_tensor,
            tensor_send_prev=input_tensor_grad, recv_prev=recv_prev,
            recv_next=recv_next, tensor_shape=tensor_shape)
    return prev, nxt
