"""Communicator and Request: the C API with the memory safety of torch's
`Work`.

- A request holds its buffer's memory (a torch tensor's storage, or a
  buffer export) until the transport is done with it.  A request dropped
  before completion is completed in the background and its memory kept
  until then; one that failed with PEER_FAILED or ABORTED keeps it until
  close(), as the C API asks.
- A blocking wait sleeps in the library in slices of 50 ms (wait_for) and
  looks at pending signals between them, so Ctrl-C raises KeyboardInterrupt
  at once and the request stays usable.
- The library is called by one thread at a time (its threading model, a
  lock here); abort() is the exception.  A helper thread completes
  dropped requests.
- After close(), every call raises ClosedError instead of reaching the
  unloaded plugin.

SPDX-License-Identifier: MIT
"""

import atexit
import collections
import itertools
import logging
import operator
import os
import queue
import sys
import threading
import time
import weakref
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _check, _group_gather, _lib, _store
from ._lib import _calls
from .errors import STATUS, ClosedError, StagelinkError, error

__all__ = ["Communicator", "Request", "Placement", "P2POp",
           "batch_isend_irecv"]

_log = logging.getLogger("stagelink")
# A torch tensor, or any object with the buffer protocol.
Buffer = Any
# "next", "prev", or the world rank of that neighbour (batch operations).
Peer = Union[str, int]
_SLICE_MS = _calls.SLICE_MS  # a wait looks at pending signals this often
_CHECK_WAIT = 1.0  # seconds a checked receive waits for its descriptor
_STOP, _REAP = object(), object()
# Open communicators by creation number: every rank creates them in the
# same order (creation is collective), so closing newest first at exit is
# one order on every rank, which the closing barriers need.
_open_comms = weakref.WeakValueDictionary()
_created = itertools.count()
# The transport may still write into a failed request's buffer until
# comm_finalize returns (stagelink.h, comm_abort).
_HOLD_UNTIL_CLOSE = (STATUS["ERR_PEER_FAILED"], STATUS["ERR_ABORTED"])
_IN_PROGRESS, _TIMEOUT = STATUS["IN_PROGRESS"], STATUS["ERR_TIMEOUT"]


def _index(value, name, low, high):
    """operator.index(value) within [low, high], else ValueError (never a
    silent wrap into the C field)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise TypeError("%s must be an integer, not %s"
                        % (name, type(value).__name__)) from None
    if not low <= v <= high:
        raise ValueError("%s=%r is out of range: it must be in [%d, %d]"
                         % (name, value, low, high))
    return v


def _choice(value, name, choices):
    if value not in choices:
        raise ValueError("%s=%r is not one of %s"
                         % (name, value, ", ".join(map(repr, choices))))
    return choices[value]


class Placement:
    """Where this rank sits, given explicitly instead of Megatron's rank
    order (TP fastest, then DP, then PP): the world ranks of the matching
    TP rank in the previous and next stage (None at the pipeline's ends;
    the interleaved schedule's wrap-around gives both ends a neighbour)
    and of this rank's TP group, by TP index."""

    def __init__(self, prev_rank: Optional[int], next_rank: Optional[int],
                 tp_ranks: Sequence[int], tp_index: Optional[int] = None
                 ) -> None:
        self.prev_rank, self.next_rank = prev_rank, next_rank
        self.tp_ranks = [operator.index(r) for r in tp_ranks]
        self.tp_index = tp_index

    def __repr__(self):
        return ("Placement(prev_rank=%r, next_rank=%r, tp_ranks=%r, "
                "tp_index=%r)" % (self.prev_rank, self.next_rank,
                                  self.tp_ranks, self.tp_index))

    def _topology(self, rank, world, tp_size):
        """The topology as Calls.open takes it (prev_rank, next_rank,
        tp_index, tp_ranks); ValueError when it cannot describe `rank`."""
        if len(self.tp_ranks) != tp_size or len(set(self.tp_ranks)) != tp_size:
            raise ValueError("placement: tp_ranks %r must be %d distinct ranks"
                             % (self.tp_ranks, tp_size))
        for r in self.tp_ranks:
            _index(r, "placement tp_ranks entry", 0, world - 1)
        ends = [-1 if r is None else _index(r, "placement neighbour", 0,
                                            world - 1)
                for r in (self.prev_rank, self.next_rank)]
        index = self.tp_index
        if index is None:
            if rank is None or rank not in self.tp_ranks:
                raise ValueError("placement: rank %r is not in tp_ranks %r; "
                                 "give tp_index" % (rank, self.tp_ranks))
            index = self.tp_ranks.index(rank)
        index = _index(index, "placement tp_index", 0, tp_size - 1)
        return (ends[0], ends[1], index, list(self.tp_ranks))


class Request(_calls.Request):
    """One isend or irecv.  wait() blocks until it completes (raising its
    error), test() polls, cancel() asks to stop it.  A dropped Request is
    completed in the background; its buffer stays alive until then.

    Its state, post and wait are compiled (_request.c); what follows is
    the rest, and what the wait hands over on its uncommon paths."""

    __slots__ = ()

    @property
    def _what(self):
        """What the request is, for sentences: made only when one is."""
        d = self._desc
        if isinstance(d, str):
            return d
        recv, microbatch, chunk, peer, b = d
        return "%s of microbatch %d chunk %d %s %s stage (%s)" % (
            "irecv" if recv else "isend", microbatch, chunk,
            "from the" if recv else "to the",
            "next" if peer == 0 else "previous", b.describe())

    def __repr__(self):
        state = ("done" if self._err is None else "failed: " +
                 error(*self._err).status) if self._done else "in flight"
        return "<stagelink.Request %s (%s)>" % (self._what, state)

    def _result(self):
        if self._err is not None:
            raise error(*self._err)
        if self._stream is not None:
            self._order_current_stream()
        return None

    def _arm_current_stream(self):
        """Before a wait or test that may complete a CUDA receive (lock
        held): the library is to order the caller's current stream after
        the data as it completes (order_stream), as torch's Work.wait()."""
        if self._stream is None or self._done:
            return
        import torch
        stream, device = self._stream
        current = torch.cuda.current_stream(device).cuda_stream
        want = None if current == stream else current
        if want == self._ordered:
            return
        comm = self._comm
        status = comm._calls.order_stream(self._handle, want)
        if status == 0:
            self._ordered = want
        elif status != STATUS["ERR_UNSUPPORTED"]:  # an older plugin: below
            comm._raise(status)

    def _order_current_stream(self):
        """As torch's Work.wait(): the caller's current CUDA stream waits
        for the data, so a consumer on another stream than the post's
        (Megatron's combined 1F1B posts on a communication stream) sees
        the whole tensor.  The library did it at completion when it could
        (order_stream); else, an event on the post's stream."""
        if self._stream is None:
            return
        import torch
        stream, device = self._stream
        current = torch.cuda.current_stream(device)
        if current.cuda_stream != stream and \
                current.cuda_stream != self._ordered:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.ExternalStream(stream, device=device))
            current.wait_event(ready)

    def _raise_timeout(self, timeout):
        """The wait that ended in flight: at the library's deadline
        (STAGELINK_TIMEOUT; timeout None), or at wait(timeout)'s."""
        if timeout is None:
            raise error(_TIMEOUT, self._timed_out)
        raise error(_TIMEOUT, "%s did not complete within wait(timeout=%g); "
                    "it stays in flight: wait again or cancel it"
                    % (self._what, timeout))

    def test(self) -> bool:
        """True once the transfer completed (raising its error if it
        failed; the current CUDA stream then waits for the data, as after
        wait()); False while it is in flight.  Never blocks for long, but
        where it completes a receive gathered on tp_group: that runs the
        group's collective, which waits for the TP peers."""
        comm = self._comm
        if not self._done:
            with comm._lock:
                comm._require_open("test")
                comm._reap()
                self._arm_current_stream()
                if not self._done and not comm._test(self):
                    return False
        self._result()
        return True

    def is_completed(self) -> bool:
        """torch's Work.is_completed: True once done (or failed), without
        raising or ordering any stream (a later wait() orders it); as
        test() otherwise."""
        if self._done:
            return True
        comm = self._comm
        try:
            with comm._lock:
                comm._require_open("is_completed")
                comm._reap()
                return self._done or bool(comm._test(self))
        except StagelinkError:
            return True

    def cancel(self) -> bool:
        """Asks the transport to cancel; wait() then raises CanceledError,
        unless the transfer completed first (of a message in chunks that
        has begun to land, the rest is dropped as it comes, never left for
        a later receive).  Returns False if it had already completed."""
        comm = self._comm
        if self._done:
            return False
        comm._require_open("cancel")
        with comm._lock:
            comm._require_open("cancel")
            if self._done:
                return False
            comm._call(comm._calls.cancel, self._handle)
            if self._check is not None:
                comm._calls.cancel(self._check.request._handle)
        return True

    def __del__(self):
        try:
            if not self._done and self._handle is not None:
                self._comm._orphan(self)
        except Exception:  # interpreter shutdown: modules may be gone
            pass


class P2POp:
    """One operation of batch_isend_irecv, as torch.distributed.P2POp.

    `op` is comm.isend or comm.irecv (or torch.distributed.isend/irecv,
    or "send"/"recv" with `comm` given); `peer` is "next", "prev" or the
    world rank of that neighbour."""

    __slots__ = ("op", "tensor", "peer", "microbatch", "chunk", "comm")

    def __init__(self, op: Any, tensor: Buffer, peer: Peer,
                 microbatch: int = 0, chunk: int = 0,
                 comm: Optional["Communicator"] = None) -> None:
        self.op, self.tensor, self.peer = op, tensor, peer
        self.microbatch, self.chunk = microbatch, chunk
        self.comm = comm if comm is not None else getattr(op, "__self__",
                                                          None)

    def __repr__(self):
        return "P2POp(%s, peer=%r, microbatch=%r, chunk=%r)" % (
            getattr(self.op, "__name__", self.op), self.peer, self.microbatch,
            self.chunk)

    def _kind(self):
        name = self.op if isinstance(self.op, str) else getattr(
            self.op, "__name__", None)
        kinds = {"isend": _lib.OP_SEND, "send": _lib.OP_SEND,
                 "irecv": _lib.OP_RECV, "recv": _lib.OP_RECV}
        if name not in kinds:
            raise ValueError("P2POp op=%r: pass comm.isend or comm.irecv "
                             "(or torch.distributed.isend/irecv)" % (self.op,))
        return kinds[name]


Job = collections.namedtuple(
    "Job", "rank world_size local_rank local_size launcher bootstrap "
    "bootstrap_reason")
Job.__doc__ = """This process's place in its job and the bootstrap a
Communicator of the whole job uses there (local_rank and local_size are
-1 where the launcher says nothing)."""


def job() -> Job:
    """Rank and world size as the library reads the launcher's environment
    (torchrun, stagelink_run, mpirun, srun), so a program sizes itself the
    same way under each; StagelinkError (ERR_CONFIG) without a launcher."""
    status, found = _lib.library().job_query()
    if status != 0:
        raise error(status, found)
    return Job(*found)


def batch_isend_irecv(p2p_op_list: Sequence["P2POp"]) -> List[Request]:
    """Posts every operation at once, receives first, as
    torch.distributed.batch_isend_irecv; returns their Requests in the
    list's order.  On error none of them stays posted."""
    comms = {id(op.comm): op.comm for op in p2p_op_list}
    if len(comms) != 1 or None in comms.values():
        raise ValueError("batch_isend_irecv: every P2POp must belong to one "
                         "Communicator (op=comm.isend / comm.irecv, or "
                         "comm=...)")
    return next(iter(comms.values())).batch_isend_irecv(p2p_op_list)


class Communicator:
    """One stagelink communicator.

    Collective: every rank of the job creates it, with the same sizes.
    Ranks come from, in order: `rank` and `world_size`; torch.distributed's
    default process group (whose store also carries the bootstrap, so no
    second port is opened); the launcher's environment (torchrun, mpirun,
    Slurm, stagelink_run) with the library's own bootstrap
    (STAGELINK_BOOTSTRAP).

    store: a torch.distributed Store for the bootstrap (default: the
      default process group's, when torch.distributed is initialized);
      False uses none, leaving the choice to the library
      (STAGELINK_BOOTSTRAP=tcp for its authenticated rendezvous).
    placement: a Placement, for rank orders other than Megatron's.
    tp_group: a torch.distributed process group of this rank's TP group
      (ranks in TP index order, as Megatron's; another group raises
      ValueError): gathered receives are then
      rebuilt with torch's all_gather_into_tensor (gloo: all_gather) on
      it, inside the wait()
      or test() that completes them, on the receive's stream (no second
      communicator beside the host's).  Every rank of the group must then
      complete its gathered receives in the same order, as with any
      collective.  STAGELINK_GATHER=ucx or nccl overrides it.
    device: the CUDA device the communicator works on (an index,
      "cuda:1" or a torch.device); default: the context current at
      creation (torch.cuda.set_device before it), else the device of the
      first CUDA tensor.
      Every call runs on it, from any thread, and leaves the caller's
      current device as it was; a tensor of another device raises
      InvalidArgumentError (ERR_INVALID_ARG) naming both.
    mode: "default" (STAGELINK_MODE, else scatter_gather),
      "scatter_gather", "full" or "sharded" (see stagelink.h); another
      mode than "default" and a STAGELINK_MODE naming a different one
      raise InvalidArgumentError (ERR_INVALID_ARG) naming both.

    close() (or the end of a `with` block) finalizes collectively; an
    exception leaving the `with` block aborts instead, so the failing rank
    does not wait for the others."""

    def __init__(self, tp_size: int = 1, pp_size: int = 0,
                 mode: str = "default", *, rank: Optional[int] = None,
                 world_size: Optional[int] = None,
                 placement: Optional["Placement"] = None,
                 store: Any = None, plugin: Optional[str] = None,
                 tp_group: Any = None, device: Any = None) -> None:
        tp_size = _index(tp_size, "tp_size", 1, 1 << 30)
        pp_size = _index(pp_size, "pp_size", 0, 1 << 30)
        mode_value = _choice(mode, "mode", _lib.MODES)
        if (rank is None) != (world_size is None):
            raise ValueError("give rank and world_size together")
        bootstrap = None
        if store is None:
            found = _store.default_store()
            if found is not None:
                store = found[0]
                if rank is None:
                    rank, world_size = found[1], found[2]
        if store is not None and store is not False:
            if rank is None:
                raise ValueError("store=...: give rank and world_size (or "
                                 "initialize torch.distributed)")
        if rank is not None:
            world_size = _index(world_size, "world_size", 1, 1 << 30)
            rank = _index(rank, "rank", 0, world_size - 1)
        # The communicator's life and calls (open, closing, finalized).
        self._calls = _calls.Calls()
        if device is not None:  # else the library takes the current context
            device = _device_index(device)
        topology = None
        if placement is not None:
            if not isinstance(placement, Placement):
                raise TypeError("placement must be a stagelink.Placement")
            if rank is None:
                here = job()
            topology = placement._topology(
                rank if rank is not None else here.rank,
                world_size if rank is not None else here.world_size, tp_size)
        if tp_group is not None:
            _check_tp_group(tp_group, tp_size, rank, placement)
        if store is not None and store is not False:
            # Numbered only once every argument passed, alike on every rank.
            bootstrap = _store.StoreBootstrap(store)
        gather = None
        if tp_group is not None:
            gather = _group_gather.GroupGather(tp_group)

        _lib.library()
        status, message = self._calls.open(
            plugin, tp_size, pp_size, mode_value, rank, world_size, device,
            topology, bootstrap.set if bootstrap else None,
            bootstrap.get if bootstrap else None, gather)
        if status != 0:
            if bootstrap is not None and bootstrap.error is not None:
                message += " (the store raised %r)" % bootstrap.error
            raise error(status, message)
        # The finalize barrier calls the store too: it lives as long.
        self._bootstrap = bootstrap
        self._gather = gather
        self._lock = threading.RLock()   # one thread in the library at a time
        # abort must not race finalize; reentrant for a signal handler that
        # aborts while close() finalizes on the same thread.
        self._life = threading.RLock()
        self._queue = queue.SimpleQueue()
        self._orphans, self._held = [], []
        self._aborted = False
        self.info = self._calls.info()
        self.plugin = self._calls.plugin
        self._check = _check.enabled()
        self._max_chunk = _check.max_chunk(self._check)
        if self._check and self.plugin != "ucx":
            self._calls.abort()
            self._calls.finalize()
            raise StagelinkError(
                STATUS["ERR_UNSUPPORTED"], "STAGELINK_CHECK sends its "
                "descriptors from host memory, which the %s plugin cannot "
                "move; unset STAGELINK_CHECK or use the ucx plugin"
                % self.plugin)
        if gather is not None and self.info["gather_backend"] == "host":
            gather.agree_on_check(self._check)
        # What the compiled posts and waits hand over on their uncommon
        # paths: registered, never looked up by name.
        self._calls.bind(
            self, self._orphans, self._check, self._max_chunk,
            acquire=self._lock.acquire, release=self._lock.release,
            require_open=self._require_open, reap=self._reap,
            args=self._args, posted=self._posted, waited=self._waited,
            settle=self._settle, attach_check=self._attach_check,
            arm=Request._arm_current_stream,
            raise_timeout=Request._raise_timeout, result=Request._result,
            cuda_stream=_cuda_stream)
        # The helper thread's torch calls run on the same device.
        self._device = device if device is not None else _cuda_device()
        self._helper = threading.Thread(target=self._serve, daemon=True,
                                        name="stagelink-wait-%d" % self.rank)
        self._helper.start()
        self._created = next(_created)
        self._pid = os.getpid()
        _open_comms[self._created] = self

    # -- what this rank is ------------------------------------------------
    rank = property(lambda self: self.info["rank"])
    world_size = property(lambda self: self.info["world_size"])
    tp_size = property(lambda self: self.info["tp_size"])
    tp_index = property(lambda self: self.info["tp_index"])
    pp_index = property(lambda self: self.info["pp_index"])
    is_first_stage = property(lambda self: self.info["prev_rank"] < 0)
    is_last_stage = property(lambda self: self.info["next_rank"] < 0)
    # The life of the communicator is the binding's (Calls' state).
    _open = property(lambda self: self._calls.is_open)
    _closing = property(lambda self: self._calls.is_closing)

    def __repr__(self):
        return ("<stagelink.Communicator rank %d of %d, stage %d, TP index "
                "%d of %d, %s, %s>" % (
                    self.info["rank"], self.info["world_size"],
                    self.info["pp_index"], self.info["tp_index"],
                    self.info["tp_size"],
                    [k for k, v in _lib.MODES.items()
                     if v == self.info["mode"]][0],
                    "open" if self._open else "closed"))

    # -- calls into the library (self._lock held) -------------------------
    def _require_open(self, what):
        if not self._open or self._closing:
            raise ClosedError(message="%s after close(): the communicator "
                              "was closed (close() or the end of its with "
                              "block); create a new Communicator" % what)

    def _raise(self, status):
        raise error(status, self._calls.last_error())

    def _call(self, fn, *args):
        status = fn(*args)
        if status != 0:
            self._raise(status)

    def _complete(self, req, status, message=None):
        """Records how `req` ended (the library has released it); its memory
        is let go once the transport is done with it."""
        req._done, req._handle = True, None
        if status != 0:
            req._err = (status, message if message is not None else
                        self._calls.last_error())
            gather = getattr(self, "_gather", None)
            if gather is not None and gather.error is not None:
                req._err = (status, "%s (the TP group's all_gather raised "
                            "%r)" % (req._err[1], gather.error))
                gather.error = None
        if req._check is not None:
            self._settle_check(req, status)
        buf, req._buf = req._buf, None
        if buf is None:
            return
        if status != 0 and (status in _HOLD_UNTIL_CLOSE or
                            self._calls.get_error()[0] != 0):
            # After a failure or an abort the transport may still write
            # into it until finalize, whatever status the request ended with
            # first (stagelink.h, comm_abort).
            self._held.append(buf)
        else:
            buf.release()

    def _settle(self, req, status):
        """After a call that may have released `req` and whose status was
        an error (or was lost to an exception): the library answers a
        released request's test with INVALID_ARG.  Nothing else runs in
        between (the lock is held), so the slot cannot have been reused.
        Returns the call's sentence."""
        if status is None:
            message = ("%s completed as an exception (Ctrl-C?) arrived; its "
                       "outcome is unknown" % req._what)
        else:
            message = self._calls.last_error()
        probe, done = self._calls.test(req._handle)
        if done:
            self._complete(req, probe)
        elif probe == STATUS["ERR_INVALID_ARG"]:
            self._complete(req, STATUS["ERR_INTERNAL"] if status is None
                           else status, message)
        # else: still in flight; an error was the call's, not the request's
        return message

    def _test(self, req):
        done, status = 0, None
        try:
            status, done = self._calls.test(req._handle)
            if done:
                self._complete(req, status)
                return True
        except BaseException:
            if not req._done:
                self._settle(req, status if done else None)
            raise
        if status != 0:  # the call failed; the request is in flight
            self._raise(status)
        return False

    def _wait(self, req, slice_ms=-1):
        """Waits for `req` for one slice (-1: until done or the library's
        deadline) and returns the status; IN_PROGRESS and TIMEOUT leave it
        in flight (TIMEOUT's sentence in req._timed_out)."""
        status = None
        try:
            status = self._calls.wait(req._handle, slice_ms)
            return self._waited(req, status)
        except BaseException:
            if not req._done and status != _IN_PROGRESS and \
                    status != _TIMEOUT:
                self._settle(req, status)
            raise

    def _waited(self, req, status):
        """What a wait's status makes of `req` (self._lock held since the
        call, so a released request's slot is not yet reused): completed,
        in flight, past the library's deadline, or failed (raised)."""
        if status == 0:
            self._complete(req, status)
        elif status == _TIMEOUT:
            req._timed_out = self._calls.last_error()
        elif status != _IN_PROGRESS:  # failed, or the call itself did
            message = self._settle(req, status)
            if not req._done:
                raise error(status, message)
        return status

    def _settle_check(self, req, status):
        """Completes the dtype/shape descriptor that travelled with `req`
        and turns a disagreement into the request's error."""
        chk, req._check = req._check, None
        sub = chk.request
        if not sub._done and status not in (0, STATUS["ERR_SIZE_MISMATCH"]):
            self._calls.cancel(sub._handle)
        # The sender posts it with the data: once the data is here, so is
        # it, unless the sender does not check (STAGELINK_CHECK differs).
        end = time.monotonic() + _CHECK_WAIT
        try:
            while not sub._done and time.monotonic() < end:
                if self._wait(sub, _SLICE_MS) == STATUS["ERR_TIMEOUT"]:
                    break
        except StagelinkError:
            pass
        if not sub._done:
            _log.warning("stagelink: no dtype/shape descriptor came with %s "
                         "within %g s: is STAGELINK_CHECK=1 set on every "
                         "rank?", req._what, _CHECK_WAIT)
            self._orphans.append(sub)  # completed in the background
            return
        req._err = chk.verdict(status, sub._err, req._err)

    def _orphan(self, req):
        """A dropped request: completed by the helper thread.  Called from
        __del__, so it only appends (SimpleQueue.put is reentrant)."""
        if self._open:
            self._orphans.append(req)  # resurrected until completed
            self._queue.put(_REAP)

    def _reaped(self, req):
        if req._what.startswith("irecv") and \
                not getattr(self, "_gather_dropped", False) and \
                getattr(self, "_gather", None) is not None:
            # Its gather is the TP group's collective, entered where the
            # background completes it: not at the point its peers do.
            _log.warning("stagelink: %s was dropped; with tp_group= its "
                         "gather is a collective of the TP group, entered "
                         "when the background completes it, out of the order "
                         "its TP peers follow (a hang, or another tensor's "
                         "data): wait() for every receive", req._what)
            self._gather_dropped = True
        elif req._what.startswith("irecv") and \
                not getattr(self, "_gather_dropped", False) and \
                self.info["gather_backend"] == "nccl":
            # Its NCCL collective is issued in wait() alone: test() never
            # completes it, so it holds its slot until close().
            _log.warning("stagelink: %s was dropped; with STAGELINK_GATHER="
                         "nccl a gathered receive completes only in wait(), "
                         "which issues its collective: it stays in flight "
                         "until close(); wait() for every receive", req._what)
            self._gather_dropped = True
        try:
            return self._test(req)
        except StagelinkError as e:  # the call failed: try again later
            _log.info("stagelink: testing a dropped %s: %s", req._what, e)
            return False

    def _reap(self):
        if not self._orphans:
            return
        # In place: __del__ may append to this very list meanwhile (a
        # collection in this loop, or another thread).
        for req in [r for r in self._orphans[:] if self._reaped(r)]:
            self._orphans.remove(req)
            if req._err is not None and not self._aborted:
                # Nobody can see this failure but the log.
                _log.warning("stagelink: a dropped %s failed: %s",
                             req._what, error(*req._err))

    def _serve(self):
        """The helper thread: completes dropped requests in the background
        (a test every 10 ms while there are any)."""
        if self._device is not None:  # the plugin's device work runs here too
            import torch
            torch.cuda.set_device(self._device)
        while True:
            try:
                item = self._queue.get(timeout=0.01 if self._orphans
                                       else None)
            except queue.Empty:
                item = _REAP
            if item is _STOP:
                return
            with self._lock:
                if self._open and not self._closing:
                    self._reap()

    # -- posting ------------------------------------------------------------
    def _peer(self, peer):
        if isinstance(peer, str):
            return _choice(peer, "peer", _lib.PEERS)
        rank = _index(peer, "peer", 0, self.world_size - 1)
        ends = [p for p, r in (("next", self.info["next_rank"]),
                               ("prev", self.info["prev_rank"])) if r == rank]
        if len(ends) != 1:
            raise ValueError(
                "peer=%d is %s of rank %d (prev %d, next %d): pass \"next\" "
                "or \"prev\"" % (rank, "both neighbours" if ends else
                                 "no neighbour", self.rank,
                                 self.info["prev_rank"],
                                 self.info["next_rank"]))
        return _lib.PEERS[ends[0]]

    def _args(self, peer, microbatch, chunk, elem_size):
        """A post's arguments checked (the common ones, a peer's name and
        small ints, in line): (peer, microbatch, chunk, elem_size or 0)."""
        peer_value = _lib.PEERS.get(peer) if type(peer) is str else None
        if peer_value is None:
            peer_value = self._peer(peer)
        if type(microbatch) is not int or \
                not 0 <= microbatch <= _lib.TAG_MAX_MICROBATCH:
            microbatch = _index(microbatch, "microbatch", 0,
                                _lib.TAG_MAX_MICROBATCH)
        if type(chunk) is not int or chunk < 0 or chunk > self._max_chunk:
            chunk = _index(chunk, "chunk", 0, self._max_chunk)
        if elem_size is not None:
            elem_size = _index(elem_size, "elem_size", 1, 1 << 40)
        return peer_value, microbatch, chunk, elem_size or 0

    def _posted(self, req, status):
        """After a post that failed or raised (self._lock held): a Request
        owns what the library does from the moment it does (the call set
        req._handle), also when an exception (Ctrl-C) lands as the call
        returns; that Request is then dropped, so it is completed in the
        background with its memory kept.  A failed post raises."""
        if req._handle is None:
            req._done, req._buf = True, None  # nothing was posted
        if status is not None:
            raise error(status, self._calls.last_error())

    def _post_record(self, recv, record, peer, microbatch, chunk,
                     elem_size, what):
        """Posts a host record of the binding's own (a bytearray; the
        STAGELINK_CHECK descriptor), as given (self._lock held)."""
        return Request._post_record(self._calls, recv, record, peer,
                                    microbatch, chunk, elem_size, what)

    def _attach_check(self, req, recv, peer, microbatch, chunk):
        """With STAGELINK_CHECK: the dtype/shape descriptor of `req`, just
        posted, goes beside it (self._lock held)."""
        _check.attach(self, req, recv, peer, microbatch, chunk)

    def isend(self, buf: Buffer, peer: Peer = "next", microbatch: int = 0,
              chunk: int = 0, elem_size: Optional[int] = None,
              stream: Optional[int] = None) -> Request:
        """Starts sending `buf` (the full tensor) to the next ("next") or
        previous ("prev") stage, tagged (microbatch, chunk); returns a
        Request.  Shards fall on whole elements (elem_size, default the
        buffer's item size).  A CUDA tensor is ordered on `stream` (a
        cudaStream_t as an int; default torch's current stream)."""
        return Request._post(self._calls, False, buf, peer, microbatch, chunk,
                             elem_size, stream)

    def irecv(self, buf: Buffer, peer: Peer = "prev", microbatch: int = 0,
              chunk: int = 0, elem_size: Optional[int] = None,
              stream: Optional[int] = None) -> Request:
        """Starts receiving into `buf` (the full tensor; writable) from a
        neighbour stage; returns a Request."""
        return Request._post(self._calls, True, buf, peer, microbatch, chunk,
                             elem_size, stream)

    def send(self, buf: Buffer, peer: Peer = "next", microbatch: int = 0,
             chunk: int = 0, elem_size: Optional[int] = None,
             stream: Optional[int] = None) -> None:
        """isend, then wait."""
        Request._post(self._calls, False, buf, peer, microbatch, chunk, elem_size,
                      stream).wait()

    def recv(self, buf: Buffer, peer: Peer = "prev", microbatch: int = 0,
             chunk: int = 0, elem_size: Optional[int] = None,
             stream: Optional[int] = None) -> None:
        """irecv, then wait."""
        Request._post(self._calls, True, buf, peer, microbatch, chunk, elem_size,
                      stream).wait()

    def batch_isend_irecv(self, p2p_op_list: Sequence["P2POp"]
                          ) -> List[Request]:
        """Posts a list of P2POp at once (post_batch: receives first, never
        blocking), as torch.distributed.batch_isend_irecv; returns their
        Requests in the list's order.  On error none stays posted."""
        ops = list(p2p_op_list)
        for op in ops:
            if not isinstance(op, P2POp):
                raise TypeError("batch_isend_irecv takes a list of "
                                "stagelink.P2POp, not %s" % type(op).__name__)
            if op.comm is not None and op.comm is not self:
                raise ValueError("%r belongs to another Communicator" % op)
        if not ops:
            return []
        built = []
        for op in ops:
            recv = op._kind() == _lib.OP_RECV
            peer, microbatch, chunk, _ = self._args(op.peer, op.microbatch,
                                                    op.chunk, None)
            built.append((recv, op.tensor, peer, microbatch, chunk))
        with self._lock:
            self._require_open("batch_isend_irecv")
            self._reap()
            status, posted = Request._post_batch(self._calls, built)
            if status != 0:  # then none of the batch stays posted
                raise error(status, self._calls.last_error())
            if self._check:
                for req, (recv, _, peer, microbatch, chunk) in zip(posted,
                                                                   built):
                    self._attach_check(req, recv, peer, microbatch, chunk)
            return posted

    # -- the communicator as a whole -----------------------------------------
    def counters(self) -> Dict[str, int]:
        """Byte counters since init (stagelink_counters_t) as a dict."""
        with self._lock:
            self._require_open("counters")
            status, counters = self._calls.counters()
            if status != 0:
                self._raise(status)
        return counters

    def get_error(self) -> Optional[StagelinkError]:
        """None while healthy; else the PeerFailedError or AbortedError the
        communicator holds (`failed_rank` set on it), without progressing
        it."""
        with self._lock:
            self._require_open("get_error")
            status, rank = self._calls.get_error()
            if status == 0:
                return None
            exc = error(status, self._calls.last_error())
        exc.failed_rank = rank
        return exc

    def abort(self) -> None:
        """Fails every transfer in flight with AbortedError and refuses new
        ones, without waiting for any peer.  Safe from any thread (a
        watchdog, a signal handler's caller), also while a wait blocks;
        close() still has to follow.  A no-op once closed."""
        with self._life:
            if self._open:
                self._aborted = True
                self._call(self._calls.abort)

    def close(self) -> None:
        """Finalizes (collective: every rank calls it) and unloads the
        plugin.  Requests still in flight, dropped or not, are given
        STAGELINK_FINALIZE_GRACE seconds: sends that complete in it are
        done; receives are canceled at once (a gathered one hears its TP
        peers' parts within the grace) and sends still out then are
        abandoned, each named in a warning of the log (their wait() raises
        ClosedError).  Interrupted (Ctrl-C), it aborts and finalizes without
        the barrier before the exception goes on.  A second close() does
        nothing.  In a process forked from the one that made it, close()
        only forgets it: the transport is the parent's (any other call
        there raises StagelinkError saying so)."""
        with self._life:
            if not self._calls.begin_close():
                return
        if os.getpid() != self._pid:
            # A forked child's copy: the library refuses to finalize the
            # parent's transport and touches none of it; the binding closes.
            self._calls.finalize()
            _open_comms.pop(self._created, None)
            return
        self._queue.put(_STOP)
        if self._helper is not threading.current_thread():
            self._helper.join()
        try:
            status = self._finalize()
        except BaseException:
            self._aborted = True
            self._calls.abort()
            self._finalize()
            raise
        if status == STATUS["ERR_ABANDONED"]:
            _log.warning("stagelink: close() of rank %d: %s", self.rank,
                         self._abandoned)
        elif status != 0:
            raise error(status, "comm_finalize of rank %d failed; the log "
                        "(STAGELINK_DEBUG=INFO) says why" % self.rank)

    def _finalize(self):
        with self._lock, self._life:
            status, self._abandoned = self._calls.finalize()
            # After an abort the store may be what failed (a world torn
            # down, its host gone): its keys stay there.
            if self._bootstrap is not None and not self._aborted:
                self._bootstrap.forget()
            self._bootstrap = None
        _open_comms.pop(getattr(self, "_created", None), None)
        # The transport is done with every buffer now.
        for b in self._held + [r._buf for r in self._orphans]:
            if b is not None:
                b.release()
        self._held = []
        del self._orphans[:]  # the list the binding was given
        return status

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
            return
        # The failing rank must not wait out the others in a collective
        # finalize: abort (its peers see it go), then close quietly so the
        # original traceback is what the user sees.
        for step in (self.abort, self.close):
            try:
                step()
            except StagelinkError as e:
                _log.info("stagelink: %s after %s: %s", step.__name__,
                          exc_type.__name__, e)


def _cuda_device():
    """The current CUDA device when torch has initialized CUDA, else None
    (never initializes CUDA itself)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_device()


def _device_index(device):
    """The CUDA ordinal of `device` (an int, "cuda:N", a torch.device;
    "cuda" alone is torch's current device)."""
    torch = sys.modules.get("torch")
    if isinstance(device, bool):
        raise TypeError("device must be a CUDA device index, \"cuda:N\" or "
                        "a torch.device, not %r" % (device,))
    if isinstance(device, int):
        if device < 0:
            raise ValueError("device=%d: give a CUDA device index, 0 or more"
                             % device)
        return device
    if torch is None:
        raise TypeError("device=%r: without torch, give a CUDA device index"
                        % (device,))
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError("device=%r is not a CUDA device: stagelink moves "
                         "host tensors without one" % (device,))
    return dev.index if dev.index is not None else torch.cuda.current_device()


def _group_ranks(group) -> List[int]:
    """A torch.distributed group's world ranks, by group rank."""
    import torch.distributed as dist
    return [dist.get_global_rank(group, i) for i in range(group.size())]


def _check_tp_group(tp_group, tp_size, rank, placement):
    """tp_group must be this rank's TP group, by TP index: its gather puts
    group rank k's shard where TP index k's belongs."""
    import torch.distributed as dist
    own = rank is not None and rank != dist.get_rank()
    if rank is None:
        rank = dist.get_rank()
    if placement is not None:
        want, where = list(placement.tp_ranks), "the placement's tp_ranks"
    else:
        want = [rank - rank % tp_size + k for k in range(tp_size)]
        where = "Megatron's rank order"
    if own:
        # Ranks numbered apart from torch's: only this rank's place in the
        # group can be compared, with its TP index.
        index = want.index(rank) if rank in want else placement.tp_index
        if index is None or tp_group.rank() == index:
            return
        raise ValueError(
            "tp_group: this rank is its group rank %d but TP index %d (%s): "
            "the gather would put each shard at the wrong place; pass the "
            "TP group itself, in TP index order" % (tp_group.rank(), index,
                                                    where))
    got = _group_ranks(tp_group)
    if got != want:
        raise ValueError(
            "tp_group holds ranks %s by group rank, but rank %d's TP group by "
            "TP index is %s (%s): the gather would put each shard at the "
            "wrong place; pass the TP group itself (torch.distributed."
            "new_group sorts its ranks: order tp_ranks alike)"
            % (got, rank, want, where))


def _cuda_stream(tensor, stream):
    """The stream a CUDA tensor's transfer is ordered on: `stream` (a
    cudaStream_t as an int), else torch's current one, which produced it."""
    import torch
    current = torch.cuda.current_stream(tensor.device)
    if stream is None:
        return current.cuda_stream
    if stream != current.cuda_stream:
        # The caching allocator must not hand this memory to another
        # stream before the transfer's work on `stream`.
        tensor.record_stream(torch.cuda.ExternalStream(
            stream, device=tensor.device))
    return stream


def _forked_child():
    """In a forked child the communicators are the parent's.  Their locks
    start free: a thread of the parent that held one is gone here, and a
    call must reach the library, which refuses it saying so."""
    for comm in list(_open_comms.values()):
        comm._lock._at_fork_reinit()
        comm._life._at_fork_reinit()


os.register_at_fork(after_in_child=_forked_child)


@atexit.register
def _close_at_exit():
    """Communicators left open: their dropped requests complete and they
    finalize, as close() would; after an uncaught exception they abort
    first, so the peers are not kept waiting for this rank."""
    failed = getattr(sys, "last_value", None) is not None
    for _, comm in sorted(_open_comms.items(), reverse=True):
        if comm._pid != os.getpid():  # a forked child's copy: close() forgets it
            comm.close()
            continue
        try:
            if failed:
                comm.abort()
            comm.close()
        except StagelinkError as e:
            _log.warning("stagelink: closing at exit: %s", e)
