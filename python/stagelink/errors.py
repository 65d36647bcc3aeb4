"""The exceptions of stagelink: one class per kind of failure a caller acts on.

Every failure of a call into the library raises a StagelinkError (or a
subclass) carrying the library's status name and its sentence, which says
what failed, with which values, and what to do.  Bad arguments raise
ValueError or TypeError before anything reaches the library; what only
the library can check (the job's layout, a tensor's device, a
registration) raises InvalidArgumentError, a ValueError too.

SPDX-License-Identifier: MIT
"""

import builtins

__all__ = ["StagelinkError", "PeerFailedError", "TimeoutError",
           "SizeMismatchError", "ShapeMismatchError", "AbortedError",
           "CanceledError", "TagInUseError", "ClosedError",
           "InvalidArgumentError"]

# stagelink_status_t, in the order of include/stagelink/stagelink.h (a test
# compares it with the library's stagelink_status_string).
STATUS_NAMES = (
    "SUCCESS", "ERR_INVALID_ARG", "ERR_INVALID_STATE", "ERR_NO_MEMORY",
    "ERR_NOT_FOUND", "ERR_SYMBOL_MISSING", "ERR_VERSION_MISMATCH",
    "ERR_BOOTSTRAP", "ERR_TRANSPORT", "ERR_SIZE_MISMATCH", "ERR_TAG_IN_USE",
    "ERR_NO_PEER", "ERR_CANCELED", "ERR_TIMEOUT", "ERR_UNSUPPORTED",
    "ERR_CONFIG", "ERR_INIT", "ERR_INTERNAL", "ERR_PEER_FAILED",
    "ERR_ABORTED", "IN_PROGRESS", "ERR_ABANDONED", "ERR_ABI",
)
STATUS = {name: code for code, name in enumerate(STATUS_NAMES)}


class StagelinkError(RuntimeError):
    """A call failed.  `status` is the status name ("ERR_TIMEOUT"), `code`
    its value in stagelink_status_t, `message` the library's sentence."""

    def __init__(self, code, message):
        self.code = code
        self.status = (STATUS_NAMES[code] if 0 <= code < len(STATUS_NAMES)
                       else "status %d" % code)
        self.message = message
        super().__init__("%s: %s" % (self.status, message))

    def __reduce__(self):  # pickles (multiprocessing) with its own arguments
        return (type(self), (self.code, self.message))


class PeerFailedError(StagelinkError):
    """A peer process or link died (STAGELINK_ERR_PEER_FAILED): the sentence
    names the rank.  The communicator cannot be used again: close it and
    restart the job from a checkpoint."""


class TimeoutError(StagelinkError, builtins.TimeoutError):
    """A wait passed its deadline (STAGELINK_TIMEOUT, or the `timeout` given
    to wait).  The request stays in flight: wait again or cancel it.  Also
    a builtin TimeoutError."""


class SizeMismatchError(StagelinkError):
    """Sender and receiver passed different sizes for one tag.  Raised on
    every rank of both TP groups; the tag can be used again."""


class ShapeMismatchError(SizeMismatchError):
    """With STAGELINK_CHECK=1: the bytes fit, but the sender's dtype or shape
    is not the receiver's; the sentence names both.  (A SizeMismatchError
    too: the same tensor was not passed on both sides.)"""


class AbortedError(StagelinkError):
    """Communicator.abort() was called; close the communicator."""


class CanceledError(StagelinkError):
    """The request was canceled (Request.cancel, or close())."""


class TagInUseError(StagelinkError):
    """A transfer with the same (peer, microbatch, chunk) is still in flight
    on this side."""


class InvalidArgumentError(StagelinkError, ValueError):
    """The library refused an argument (STAGELINK_ERR_INVALID_ARG) that only
    it can check: a size that does not tile the job, a tensor of another
    device, an unknown registration.  Also a ValueError."""


class ClosedError(StagelinkError):
    """The communicator was closed: a call after close() (or after its
    `with` block) cannot reach the library."""

    def __init__(self, code=STATUS["ERR_INVALID_STATE"],
                 message="the communicator was closed (close() or the end of "
                         "its with block); create a new Communicator"):
        super().__init__(code, message)


_BY_STATUS = {
    STATUS["ERR_INVALID_ARG"]: InvalidArgumentError,
    STATUS["ERR_PEER_FAILED"]: PeerFailedError,
    STATUS["ERR_TIMEOUT"]: TimeoutError,
    STATUS["ERR_SIZE_MISMATCH"]: SizeMismatchError,
    STATUS["ERR_ABORTED"]: AbortedError,
    STATUS["ERR_CANCELED"]: CanceledError,
    STATUS["ERR_TAG_IN_USE"]: TagInUseError,
}


def error(code, message, kind=None):
    """The exception for a status returned by the library (`kind` overrides
    the class the status maps to)."""
    return (kind or _BY_STATUS.get(code, StagelinkError))(code, message)
