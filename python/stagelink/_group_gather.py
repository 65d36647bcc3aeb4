"""The config's gather callback over a torch.distributed process group: a
gathered receive is rebuilt with torch's all_gather_into_tensor (gloo:
its list form, all_gather) on the host's own TP group (Megatron's), on
the receive's stream for a CUDA tensor, where the host completes the
receive (wait, or a test that returns done), so no second communicator
stands beside the host's and the collective keeps the host's program
order.

SPDX-License-Identifier: MIT
"""

import collections
import logging

from . import _lib

_log = logging.getLogger("stagelink")


class _CudaMemory:
    """Bytes of device memory for torch.as_tensor (the CUDA array
    interface), as a receive's buffer arrives in the callback."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
            "version": 3, "strides": None, "stream": None}


# stagelink_gather_args_t as the binding passes it: buf a writable
# memoryview of host memory, else the device address; tag (microbatch,
# chunk, direction); offsets and lengths one per TP index.
GatherArgs = collections.namedtuple(
    "GatherArgs", "mem_type buf nbytes stream tag tp_index offsets lengths")


def _as_bytes(torch, args):
    if args.mem_type == _lib.MEM_HOST:
        return torch.frombuffer(args.buf, dtype=torch.uint8)
    return torch.as_tensor(_CudaMemory(args.buf, args.nbytes), device="cuda")


class GroupGather:
    """The gather callback (stagelink_config_t.gather, for Calls.open);
    `error` keeps the exception of a failed gather for the caller's
    message."""

    def __init__(self, group):
        self.group, self.check = group, False
        self.error = None
        # The first failure, for good: after it the TP ranks' collectives
        # no longer pair up (one rank's descriptor may be gathered where
        # its peer's was canceled), so a later one could wait forever.
        self.failed = None

    def __call__(self, *fields):
        if self.failed is not None:
            self.error = RuntimeError(
                "an earlier all_gather of the TP group failed (%r), so its "
                "ranks' collectives no longer pair up: this Communicator "
                "gathers no more; close it" % self.failed)
            return 1
        try:
            import torch
            args = GatherArgs(*fields)
            full = _as_bytes(torch, args)
            if args.mem_type == _lib.MEM_HOST:
                self._all_gather(torch, full, args)
            else:
                stream = torch.cuda.ExternalStream(args.stream or 0,
                                                   device=full.device)
                with torch.cuda.stream(stream):
                    self._all_gather(torch, full, args)
            return 0
        except BaseException as e:  # noqa: B902 -- must not unwind into C
            self.error = self.failed = e
            _log.warning("stagelink: the TP group's all_gather failed: %r", e)
            return 1

    def agree_on_check(self, mine):
        """Once, as the Communicator is made: STAGELINK_CHECK's collective
        runs only where every TP rank runs it (a rank without it would
        pair its data's gather with another's check)."""
        import torch.distributed as dist
        flags = [None] * self.group.size()
        dist.all_gather_object(flags, bool(mine), group=self.group)
        self.check = all(flags)
        if any(flags) and not self.check:
            _log.warning("stagelink: STAGELINK_CHECK is set on some ranks of "
                         "the TP group only, so its gathers are not checked; "
                         "set it on every rank")

    def _same_receive(self, torch, args, device):
        """STAGELINK_CHECK: a collective pairs the TP ranks' calls by order
        alone, so each first says which receive it rebuilds; ranks that
        complete them in different orders then fail alike, naming them,
        instead of swapping microbatches' shards."""
        t = len(args.offsets)
        mine = torch.tensor(list(args.tag) + [args.nbytes],
                            dtype=torch.int64, device=device)
        every = torch.empty(t * 4, dtype=torch.int64, device=device)
        self._gather_into(every, mine, t)
        rows = every.view(t, 4).tolist()
        if any(row != rows[0] for row in rows):
            raise ValueError(
                "STAGELINK_CHECK: the TP ranks complete different gathered "
                "receives at once (%s): every TP rank must complete them "
                "(wait, test) in the same order, as any collective" %
                ", ".join("TP index %d microbatch %d chunk %d direction %d "
                          "(%d bytes)" % tuple([k] + row)
                          for k, row in enumerate(rows)))

    def _gather_into(self, flat, mine, t):
        """`flat`'s t equal parts <- each TP rank's `mine`: in one tensor
        for NCCL, as a list for gloo (whose tensor form torch 1.13 lacks)."""
        import torch.distributed as dist
        if flat.is_cuda:
            dist.all_gather_into_tensor(flat, mine, group=self.group)
        else:
            dist.all_gather(list(flat.chunk(t)), mine, group=self.group)

    def _all_gather(self, torch, full, args):
        t, me = len(args.offsets), args.tp_index
        if self.check:
            self._same_receive(torch, args, full.device)
        offs, lens = args.offsets, args.lengths
        own = full[offs[me]:offs[me] + lens[me]]
        if all(n == lens[0] for n in lens):
            # In place where the backend reads its input before writing
            # (NCCL); gloo gets a copy.
            self._gather_into(full, own if full.is_cuda else own.clone(), t)
            return
        # Shards one element apart: padded to the longest, then placed.
        width = max(lens)
        padded = torch.zeros(t * width, dtype=torch.uint8, device=full.device)
        mine = torch.zeros(width, dtype=torch.uint8, device=full.device)
        mine[:lens[me]] = own
        self._gather_into(padded, mine, t)
        for k in range(t):
            if k != me:
                full[offs[k]:offs[k] + lens[k]] = \
                    padded[k * width:k * width + lens[k]]
