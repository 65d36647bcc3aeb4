"""Bootstrap through a torch.distributed Store: the config's allgather
callback, so a communicator inside a torch.distributed job opens no port of
its own (MASTER_PORT belongs to the job's store).

Each allgather round writes this rank's bytes under
"stagelink/<communicator>/<round>/<rank>" and reads every rank's; the last
rank to finish a round deletes its keys.  Communicators are numbered in
creation order, which is the same on every rank (as torch numbers its
process groups).

SPDX-License-Identifier: MIT
"""

import ctypes
import itertools
import logging

from . import _lib

_log = logging.getLogger("stagelink")
_comm_numbers = itertools.count()


def default_store():
    """(store, rank, world_size) of torch.distributed's default process
    group, or None when torch.distributed is not initialized."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    return (dist.distributed_c10d._get_default_store(), dist.get_rank(),
            dist.get_world_size())


class StoreAllgather:
    """The allgather callback over `store`; `error` keeps the exception of a
    failed round for the caller's message."""

    def __init__(self, store, rank, world_size):
        self.store, self.rank, self.world = store, rank, world_size
        self.prefix = "stagelink/%d/" % next(_comm_numbers)
        self.rounds = itertools.count()
        self.error = None
        self.callback = _lib.ALLGATHER(self._allgather)

    def _allgather(self, _ctx, sendbuf, recvbuf, size):
        try:
            key = "%s%d/" % (self.prefix, next(self.rounds))
            self.store.set(key + str(self.rank), ctypes.string_at(sendbuf, size))
            for r in range(self.world):
                data = self.store.get(key + str(r))
                if len(data) != size:
                    raise ValueError("rank %d wrote %d bytes under %s, not %d"
                                     % (r, len(data), key, size))
                ctypes.memmove(recvbuf + r * size, data, size)
            if self.store.add(key + "done", 1) == self.world:
                for name in [str(r) for r in range(self.world)] + ["done"]:
                    try:
                        self.store.delete_key(key + name)
                    except (RuntimeError, AttributeError):
                        break  # a store without delete keeps them; harmless
            return 0
        except BaseException as e:  # noqa: B902 -- must not unwind into C
            self.error = e
            _log.info("stagelink: store allgather failed: %r", e)
            return 1
