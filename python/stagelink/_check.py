"""STAGELINK_CHECK=1: each transfer carries its dtype and shape, so the same
bytes passed as another dtype or shape are an error naming both sides
instead of a silent reinterpretation.  Off by default: it adds one small
transfer per tensor.

The descriptor is one 128-byte record per TP rank (t copies, elem_size
128), so that in every mode each receiving TP rank gets one whole record:
scatter_gather gathers the senders' copies, full sends all of them,
sharded delivers the receiver's own.  It travels on the data's tag with
CHECK_CHUNK_BIT set in the chunk, so with the check on chunk ids stop at
CHECK_CHUNK_BIT - 1.

SPDX-License-Identifier: MIT
"""

import struct

from . import _lib
from .errors import STATUS, ShapeMismatchError

CHECK_CHUNK_BIT = 0x400
_RECORD = struct.Struct("<4sii20s12q")  # magic, rank, ndim, dtype, dims
_MAGIC = b"SLck"
assert _RECORD.size == 128


def enabled():
    """Whether STAGELINK_CHECK asks for the check (1, yes, on, true), as the
    library's parser reads it; other values raise StagelinkError."""
    return _lib.setting("STAGELINK_CHECK") == "1"


def max_chunk(on):
    return CHECK_CHUNK_BIT - 1 if on else _lib.TAG_MAX_CHUNK


def _encode(rank, buf):
    dims = list(buf.shape)[:12]
    return _RECORD.pack(_MAGIC, rank, len(buf.shape), buf.dtype.encode()[:20],
                        *(dims + [0] * (12 - len(dims))))


def _decode(raw):
    magic, rank, ndim, dtype, *dims = _RECORD.unpack(raw)
    if magic != _MAGIC:
        return None
    return rank, dtype.rstrip(b"\0").decode(), tuple(dims[:min(ndim, 12)])


class Check:
    """The descriptor transfer that goes with one data transfer."""

    def __init__(self, recv, mine, record, request):
        self.recv, self.mine, self.record = recv, mine, record
        self.request = request

    def verdict(self, status, desc_err, err):
        """The data request's outcome given the descriptor: `err` (its
        (code, message) or None) as it is, completed, or replaced."""
        if not self.recv or desc_err is not None:
            return err
        size = _RECORD.size
        theirs = _decode(bytes(self.record[self.tp_slot * size:
                                           (self.tp_slot + 1) * size]))
        if theirs is None:
            return err
        rank, dtype, shape = theirs
        mine = (self.mine.dtype, tuple(self.mine.shape[:12]))
        sent = "%s[%s]" % (dtype, ", ".join(map(str, shape)))
        if status == STATUS["ERR_SIZE_MISMATCH"]:
            # Another dtype can split the same nbytes into other shards.
            return (status, "%s (STAGELINK_CHECK: rank %d sent %s, this rank "
                    "received into %s)" % (err[1], rank, sent,
                                           self.mine.describe()),
                    None if mine == (dtype, shape) else ShapeMismatchError)
        if status != 0 or mine == (dtype, shape):
            return err
        return (STATUS["ERR_SIZE_MISMATCH"],
                "%s: rank %d sent %s, this rank received it into %s; the "
                "bytes fit but the dtype or shape differ (STAGELINK_CHECK=1 "
                "checks both): pass the same dtype and shape on both sides"
                % (self.what, rank, sent, self.mine.describe()),
                ShapeMismatchError)


def attach(comm, req, recv, peer, microbatch, chunk):
    """Posts the descriptor of `req`, the transfer just posted to `peer`
    on (microbatch, chunk) (the comm's lock held).  If it cannot be posted,
    the data transfer is canceled and completed in the background, and the
    error raised."""
    buf = req._buf
    t = comm.info["tp_size"]
    record = bytearray(_RECORD.size * t) if recv else \
        bytearray(_encode(comm.rank, buf) * t)
    try:
        sub = comm._post_record(recv, record, peer, microbatch,
                                chunk | CHECK_CHUNK_BIT, _RECORD.size,
                                "dtype/shape descriptor of microbatch %d "
                                "chunk %d" % (microbatch, chunk))
    except BaseException:
        comm._calls.cancel(req._handle)
        comm._orphans.append(req)
        raise
    chk = Check(recv, buf, record, sub)
    chk.tp_slot = comm.info["tp_index"]
    chk.what = "microbatch %d chunk %d" % (microbatch, chunk)
    req._check = chk
