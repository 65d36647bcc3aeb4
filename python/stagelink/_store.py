"""Bootstrap through a torch.distributed Store: the config's store
callbacks, so a communicator inside a torch.distributed job opens no port of
its own (MASTER_PORT belongs to the job's store), and each rank reads only
the ranks it talks to (its TP group and its two pipeline neighbours).

The library writes this rank's part of each exchange under
"stagelink/<communicator>/<key>" and reads its peers'; once the communicator
is finalized, the keys its peers have surely read are deleted.
Communicators are numbered in creation order, which is the same on every
rank, from 0 again in each new torch world (as torch numbers its process
groups), so that a creation a failure interrupted on some ranks before an
in-process restart leaves the new world's numbers alike.

SPDX-License-Identifier: MIT
"""

import datetime
import itertools
import logging
import weakref

from . import _lib

_log = logging.getLogger("stagelink")
# The world the numbers count in (a weak reference: the old world's
# resources go with it), and the next number.
_numbering = {"world": lambda: None, "next": itertools.count()}


def _world():
    """torch.distributed's default process group, or None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist.group.WORLD


def _number():
    """The next communicator's number: 0 again once a new torch world
    exists; without one (stores given by hand) the count goes on."""
    world = _world()
    if world is not None and _numbering["world"]() is not world:
        _numbering["world"] = weakref.ref(world)
        _numbering["next"] = itertools.count()
    return next(_numbering["next"])


def default_store():
    """(store, rank, world_size) of torch.distributed's default process
    group, or None when torch.distributed is not initialized."""
    if _world() is None:
        return None
    import torch.distributed as dist
    return (dist.distributed_c10d._get_default_store(), dist.get_rank(),
            dist.get_world_size())


# STAGELINK_TIMEOUT=0 waits forever; a store's wait needs some bound, and
# its own default (torch: the process group's timeout) would end it.
_FOREVER = datetime.timedelta(days=3650)


def _timeout():
    """STAGELINK_TIMEOUT, which bounds the bootstrap's waits, for the
    store's: a peer that failed before writing its key is then reported
    at that deadline, not at the store's own (torch: 30 minutes).  None
    where it cannot be read (init refuses it)."""
    try:
        seconds = float(_lib.setting("STAGELINK_TIMEOUT"))
        return datetime.timedelta(seconds=seconds) if seconds > 0 else _FOREVER
    except (ValueError, OverflowError, _lib.StagelinkError):  # no bound
        return None


class StoreBootstrap:
    """The store callbacks over `store` (set and get, for Calls.open);
    `error` keeps the exception of a failed call for the caller's message,
    `reads` counts the keys read."""

    def __init__(self, store):
        self.store = store
        self.prefix = "stagelink/%d/" % _number()
        self.written = []
        self.reads = 0
        self.error = None
        self.timeout = _timeout()

    def set(self, key, value):
        """Publishes `value` (bytes) under `key`; 0, or 1 on failure."""
        try:
            name = self.prefix + key
            self.store.set(name, value)
            self.written.append(name)
            return 0
        except BaseException as e:  # noqa: B902 -- must not unwind into C
            return self._failed("set", key, e)

    def get(self, key):
        """The bytes under `key` once there; 1 on failure."""
        try:
            name = self.prefix + key
            if self.timeout is not None:
                try:
                    self.store.wait([name], self.timeout)
                except (NotImplementedError, RuntimeError) as e:
                    if "not implemented" not in str(e).lower() and \
                            "pure virtual" not in str(e):
                        raise
                    self.timeout = None  # a store without wait: get's own
            data = self.store.get(name)
            self.reads += 1
            return bytes(data)
        except BaseException as e:  # noqa: B902 -- must not unwind into C
            return self._failed("get", key, e)

    def _failed(self, what, key, e):
        self.error = e
        _log.info("stagelink: store %s of %r failed: %r", what, key, e)
        return 1

    def forget(self):
        """After comm_finalize: deletes what this rank wrote but the closing
        barrier's key, which a slower peer may still be reading (its other
        keys it read before it reached the barrier), and the node identity
        every rank reads (not only the peers the barrier waited for)."""
        for name in self.written[:-1]:
            if name[len(self.prefix):].startswith("nodes."):
                continue
            try:
                self.store.delete_key(name)
            except (RuntimeError, AttributeError):
                break  # a store without delete keeps them; harmless
        self.written = self.written[-1:]
