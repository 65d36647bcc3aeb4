"""stagelink from Python: pipeline-stage tensor transfers with Megatron's
scatter/gather, through one compiled binding of libstagelink (_calls).

    import stagelink, torch
    with stagelink.Communicator(tp_size=2) as comm:
        act = torch.empty(4, 1024)
        comm.recv(act, peer="prev", microbatch=0)

Buffers: torch tensors (CPU or CUDA, contiguous) and anything with the
buffer protocol (bytearray, numpy arrays, array, memoryview; bytes and
other read-only buffers for sends only).  A request keeps its buffer's
memory alive until the transport is done with it, also when dropped.

stagelink.megatron holds the drop-in for Megatron-Core's p2p_communication.

SPDX-License-Identifier: MIT
"""

# A build tree's package spans the sources and the build output (the
# compiled _calls): both directories are on PYTHONPATH (meson devenv).
# Only such a portion joins, never another installed stagelink.
import os as _os
import pkgutil as _pkgutil

__path__ = [p for p in _pkgutil.extend_path(__path__, __name__)
            if p == __path__[0] or
            not _os.path.exists(_os.path.join(p, "__init__.py"))]

from . import _lib  # noqa: E402
from ._version import __version__
from .communicator import (Communicator, Job, P2POp, Placement, Request,
                           batch_isend_irecv, job)
from .errors import (AbortedError, CanceledError, ClosedError,
                     InvalidArgumentError, PeerFailedError,
                     ShapeMismatchError, SizeMismatchError, StagelinkError,
                     TagInUseError, TimeoutError)

__all__ = ["Communicator", "Request", "Placement", "P2POp", "Job", "job",
           "batch_isend_irecv", "StagelinkError", "PeerFailedError",
           "TimeoutError", "SizeMismatchError", "ShapeMismatchError",
           "AbortedError", "CanceledError", "TagInUseError", "ClosedError",
           "InvalidArgumentError", "version", "library_version", "__version__"]


def library_version():
    """Version of the libstagelink found at run time."""
    return _lib.library().version()


version = library_version  # the name of earlier releases
