"""A drop-in for Megatron-Core's pipeline_parallel/p2p_communication: the
same functions, signatures and semantics, over a stagelink Communicator.

    import stagelink, stagelink.megatron as p2p
    comm = stagelink.Communicator(tp_size=tp, pp_size=pp)   # after
    p2p.initialize(comm)            # torch.distributed.init_process_group
    # then in schedules.py:  from stagelink.megatron import recv_forward, ...

NCCL matches Megatron's point-to-point operations by their order; stagelink
matches by tag.  Each direction to each neighbour keeps a counter, and the
k-th tensor sent forward to the next stage carries microbatch tag k, as
does the k-th receive from the previous stage: the order Megatron's
schedules already guarantee becomes the tag.  With variable_seq_lengths
each tensor's shape goes first, on the same tag with chunk 1.

Boundary kinds (config.sequence_parallel):
- off: every TP rank holds the same [s, b, h] tensor: create the
  Communicator with mode "scatter_gather" (the default); each TP rank sends
  1/t and the receivers all-gather it.
- on: each TP rank holds only its own [s/t, b, h] tensor, which is the whole
  transfer: create it with mode "full" (no gather, no full-size buffer).

The interleaved schedule wraps around the pipeline (the last stage's chunk
c feeds the first stage's chunk c + 1): give the Communicator a Placement
whose ends point at each other, and pass is_first_stage / is_last_stage as
Megatron-Core does (or let Megatron's parallel_state answer, when present).

SPDX-License-Identifier: MIT
"""

from typing import Any, List, Optional, Tuple

import torch

from . import _lib
from .communicator import Communicator, P2POp

__all__ = ["initialize", "recv_forward", "recv_backward", "send_forward",
           "send_backward", "send_forward_recv_backward",
           "send_backward_recv_forward", "send_forward_recv_forward",
           "send_backward_recv_backward",
           "send_forward_backward_recv_forward_backward"]

_SHAPE_CHUNK = 1   # the tag's chunk of a shape; tensors use chunk 0
_SHAPE_SLOTS = 8   # ndim, then up to 7 sizes
_state = None


class _State:
    def __init__(self, comm, device):
        self.comm, self.device = comm, device
        # (operation, neighbour) -> the next tag: forward is send/next and
        # recv/prev, backward send/prev and recv/next.
        self.count = {("send", "next"): 0, ("recv", "prev"): 0,
                      ("send", "prev"): 0, ("recv", "next"): 0}
        self.broken = None  # why the counters may differ from the peers'

    def tag(self, op, peer):
        k = self.count[(op, peer)]
        self.count[(op, peer)] = (k + 1) & _lib.TAG_MAX_MICROBATCH
        return k


def initialize(comm: Communicator, device: Optional[Any] = None) -> None:
    """Makes `comm` carry the p2p functions of this module.  `device`: where
    received tensors are created (default: the current CUDA device when
    CUDA is initialized, else the CPU).  Counters start at zero, so every
    rank calls it at the same point."""
    global _state
    if not isinstance(comm, Communicator):
        raise TypeError("initialize takes a stagelink.Communicator")
    if device is None:
        device = (torch.device("cuda", torch.cuda.current_device())
                  if torch.cuda.is_available() and torch.cuda.is_initialized()
                  else torch.device("cpu"))
    _state = _State(comm, torch.device(device))


def _get():
    if _state is None:
        raise RuntimeError("stagelink.megatron.initialize(comm) was not "
                           "called")
    return _state


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


def _shape_tensor(tensor):
    if tensor.dim() >= _SHAPE_SLOTS:
        raise ValueError("variable_seq_lengths: a %d-dimensional tensor has "
                         "more sizes than the shape exchange carries (%d)"
                         % (tensor.dim(), _SHAPE_SLOTS - 1))
    sizes = [tensor.dim()] + list(tensor.shape)
    return torch.tensor(sizes + [0] * (_SHAPE_SLOTS - len(sizes)),
                        dtype=torch.int64)


def _post(ops):
    if not ops:
        return []
    return _get().comm.batch_isend_irecv(ops)


class _Handles(dict):
    """The requests of an overlapped call, keyed as Megatron-Core's
    _p2p_ops keys them ("send_next", "recv_prev", "send_prev",
    "recv_next"; schedules pop them by key); iterating yields the requests
    themselves, as the schedules of older Megatron-Core that loop
    `for req in handles: req.wait()` expect."""

    def __iter__(self):
        return iter(list(self.values()))


def _communicate(*, tensor_send_next, tensor_send_prev, recv_prev, recv_next,
                 tensor_shape, config, wait_on_reqs=True):
    """Megatron-Core's _communicate: returns (tensor_recv_prev,
    tensor_recv_next, requests), the requests None once waited for."""
    st = _get()
    comm = st.comm
    if st.broken is not None:
        raise RuntimeError(
            "stagelink.megatron: an earlier transfer failed (%s), so this "
            "rank's tag counters no longer match its peers': restart from a "
            "checkpoint" % st.broken)
    if (getattr(config, "sequence_parallel", False) and
            comm.info["tp_size"] > 1 and
            comm.info["mode"] != _lib.MODES["full"]):
        raise ValueError(
            "sequence_parallel: each TP rank holds only its own [s/t, b, h] "
            "tensor, which is the whole transfer; create the Communicator "
            "with mode=\"full\" (scatter_gather would split and gather it)")
    send = {"next": tensor_send_next, "prev": tensor_send_prev}
    recv = {"prev": recv_prev, "next": recv_next}
    varlen = getattr(config, "variable_seq_lengths", False)
    for p in ("prev", "next"):
        if not recv[p]:
            continue
        if getattr(config, "pipeline_dtype", None) is None:
            raise RuntimeError("pipeline_dtype must be provided if recv_%s is "
                               "True" % p)
        if tensor_shape is None and not varlen:
            raise RuntimeError(
                "tensor_shape must be specified if recv_%s is True. Common "
                "tensor_shape is (seq_length, micro_batch_size, hidden_size)"
                % p)
    # Tags only once nothing can be refused before posting, in one fixed
    # order, so that both sides count alike.
    tags = {("send", p): st.tag("send", p) for p in ("next", "prev")
            if send[p] is not None}
    tags.update({("recv", p): st.tag("recv", p) for p in ("prev", "next")
                 if recv[p]})
    try:
        return _exchange(st, send, recv, tags, tensor_shape, config, varlen,
                         wait_on_reqs)
    except BaseException as e:
        st.broken = "%s: %s" % (type(e).__name__, e)
        raise


def _exchange(st, send, recv, tags, tensor_shape, config, varlen,
              wait_on_reqs):
    comm = st.comm
    shapes = {"prev": tensor_shape, "next": tensor_shape}
    if varlen:
        ops, boxes = [], {}
        for p in ("prev", "next"):
            if recv[p]:
                boxes[p] = torch.empty(_SHAPE_SLOTS, dtype=torch.int64,
                                       device=st.device)
                ops.append(P2POp(comm.irecv, boxes[p], p,
                                 tags[("recv", p)], _SHAPE_CHUNK))
            if send[p] is not None:
                ops.append(P2POp(comm.isend, _shape_tensor(send[p]).to(
                    st.device), p, tags[("send", p)], _SHAPE_CHUNK))
        for req in _post(ops):
            req.wait()
        for p, box in boxes.items():
            sizes = box.tolist()
            shapes[p] = sizes[1:1 + sizes[0]]

    received, ops, keys = {}, [], []
    for p in ("prev", "next"):
        if recv[p]:
            received[p] = torch.empty(shapes[p], requires_grad=True,
                                      device=st.device,
                                      dtype=config.pipeline_dtype)
            ops.append(P2POp(comm.irecv, received[p], p, tags[("recv", p)]))
            keys.append("recv_" + p)
    for p in ("next", "prev"):
        if send[p] is not None:
            ops.append(P2POp(comm.isend, send[p], p, tags[("send", p)]))
            keys.append("send_" + p)
    reqs = _post(ops)
    if wait_on_reqs:
        for req in reqs:
            req.wait()
        reqs = None
    else:
        reqs = _Handles(zip(keys, reqs))
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


def recv_forward(tensor_shape: Optional[List[int]], config: Any,
                 is_first_stage: Optional[bool] = None
                 ) -> Optional[torch.Tensor]:
    """Receive from the previous stage (forward); None on the first."""
    if _is_first(is_first_stage):
        return None
    with _Timed(config, "forward-recv"):
        return _communicate(tensor_send_next=None, tensor_send_prev=None,
                            recv_prev=True, recv_next=False,
                            tensor_shape=tensor_shape, config=config)[0]


def recv_backward(tensor_shape: Optional[List[int]], config: Any,
                  is_last_stage: Optional[bool] = None
                  ) -> Optional[torch.Tensor]:
    """Receive from the next stage (backward); None on the last."""
    if _is_last(is_last_stage):
        return None
    with _Timed(config, "backward-recv"):
        return _communicate(tensor_send_next=None, tensor_send_prev=None,
                            recv_prev=False, recv_next=True,
                            tensor_shape=tensor_shape, config=config)[1]


def send_forward(output_tensor: Optional[torch.Tensor], config: Any,
                 is_last_stage: Optional[bool] = None) -> None:
    """Send to the next stage (forward); nothing on the last."""
    if not _is_last(is_last_stage):
        with _Timed(config, "forward-send"):
            _communicate(tensor_send_next=output_tensor,
                         tensor_send_prev=None, recv_prev=False,
                         recv_next=False, tensor_shape=None, config=config)


def send_backward(input_tensor_grad: Optional[torch.Tensor], config: Any,
                  is_first_stage: Optional[bool] = None) -> None:
    """Send to the previous stage (backward); nothing on the first."""
    if not _is_first(is_first_stage):
        with _Timed(config, "backward-send"):
            _communicate(tensor_send_next=None,
                         tensor_send_prev=input_tensor_grad, recv_prev=False,
                         recv_next=False, tensor_shape=None, config=config)


def send_forward_recv_backward(output_tensor, tensor_shape, config,
                               is_last_stage=None):
    """Batched send to and receive from the next stage."""
    if _is_last(is_last_stage):
        return None
    with _Timed(config, "forward-send-backward-recv"):
        return _communicate(tensor_send_next=output_tensor,
                            tensor_send_prev=None, recv_prev=False,
                            recv_next=True, tensor_shape=tensor_shape,
                            config=config)[1]


def send_backward_recv_forward(input_tensor_grad, tensor_shape, config,
                               is_first_stage=None):
    """Batched send to and receive from the previous stage."""
    if _is_first(is_first_stage):
        return None
    with _Timed(config, "backward-send-forward-recv"):
        return _communicate(tensor_send_next=None,
                            tensor_send_prev=input_tensor_grad,
                            recv_prev=True, recv_next=False,
                            tensor_shape=tensor_shape, config=config)[0]


def send_forward_recv_forward(output_tensor, recv_prev, tensor_shape, config,
                              overlap_p2p_comm=False):
    """Interleaved schedule: receive from the previous stage while sending
    to the next.  With overlap_p2p_comm, returns (tensor, requests) and the
    caller waits."""
    with _Timed(config, "forward-send-forward-recv"):
        tensor, _, reqs = _communicate(
            tensor_send_next=output_tensor, tensor_send_prev=None,
            recv_prev=recv_prev, recv_next=False, tensor_shape=tensor_shape,
            config=config, wait_on_reqs=not overlap_p2p_comm)
    return (tensor, reqs) if overlap_p2p_comm else tensor


def send_backward_recv_backward(input_tensor_grad, recv_next, tensor_shape,
                                config, overlap_p2p_comm=False):
    """Interleaved schedule: receive from the next stage while sending to
    the previous."""
    with _Timed(config, "backward-send-backward-recv"):
        _, tensor, reqs = _communicate(
            tensor_send_next=None, tensor_send_prev=input_tensor_grad,
            recv_prev=False, recv_next=recv_next, tensor_shape=tensor_shape,
            config=config, wait_on_reqs=not overlap_p2p_comm)
    return (tensor, reqs) if overlap_p2p_comm else tensor


def send_forward_backward_recv_forward_backward(
        output_tensor, input_tensor_grad, recv_prev, recv_next, tensor_shape,
        config):
    """Interleaved schedule: all four at once."""
    with _Timed(config, "forward-backward-send-forward-backward-recv"):
        prev, nxt, _ = _communicate(
            tensor_send_next=output_tensor, tensor_send_prev=input_tensor_grad,
            recv_prev=recv_prev, recv_next=recv_next,
            tensor_shape=tensor_shape, config=config)
    return prev, nxt
