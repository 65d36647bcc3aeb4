#!/usr/bin/env python3
"""The pipeline boundary as other Python paths move it, for
tools/bench-two-node: one rank of a job of two stages of t TP ranks
(stage 0 on the first node, stage 1 on the second, Megatron's rank
order), streaming ITERS tensors of each size forward with 4 in flight and
one answer back, as stagelink_perftest -k stream does.

    bench_peers.py PEER SIZES ITERS     (under stagelink_run, per node)

PEER:
  gloo-full      torch.distributed over gloo: every TP rank sends the
                 whole tensor to its peer (Megatron's own boundary);
  gloo-slice     each TP rank sends its 1/t slice, the receivers rebuild
                 the tensor with all_gather on their TP group (Megatron's
                 old scatter/gather);
  stagelink-py   stagelink.Communicator with torch tensors (scatter_gather).

Rank 0 prints "size,peer,t,avg_us" per size (time per tensor).
SPDX-License-Identifier: MIT
"""
import os
import sys
import time

import torch
import torch.distributed as dist

WINDOW = 4


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def stream_gloo(peer, t, rank, tp, stage, tensor, iters, tp_group):
    other = rank + t if stage == 0 else rank - t
    n = tensor.numel()
    part = n // t
    mine = tensor[tp * part:(tp + 1) * part] if peer == "gloo-slice" else tensor
    pending = []
    for i in range(iters):
        if len(pending) == WINDOW:
            pending.pop(0).wait()
        if stage == 0:
            pending.append(dist.isend(mine, other))
        else:
            pending.append(dist.irecv(mine, other))
        if stage == 1 and peer == "gloo-slice":
            # The rebuild waits for this slice, as a consumer would.
            pending.pop().wait()
            dist.all_gather(list(tensor[:part * t].chunk(t)), mine,
                            group=tp_group)
    for p in pending:
        p.wait()
    ack = torch.zeros(1)
    if stage == 1:
        dist.send(ack, other)
    else:
        dist.recv(ack, other)


def stream_stagelink(comm, stage, tensor, iters):
    pending = []
    for i in range(iters):
        if len(pending) == WINDOW:
            pending.pop(0).wait()
        if stage == 0:
            pending.append(comm.isend(tensor, microbatch=i))
        else:
            pending.append(comm.irecv(tensor, microbatch=i))
    for p in pending:
        p.wait()
    ack = torch.zeros(1)
    if stage == 1:
        comm.send(ack, peer="prev", microbatch=iters)
    else:
        comm.recv(ack, peer="next", microbatch=iters)


def main():
    peer, sizes, iters = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    t = world // 2
    stage, tp = rank // t, rank % t
    comm = tp_group = None
    if peer == "stagelink-py":
        import stagelink
        comm = stagelink.Communicator(tp_size=t, store=False,
                                      mode="scatter_gather")
    else:
        dist.init_process_group("gloo")
        groups = [dist.new_group(list(range(s * t, (s + 1) * t)))
                  for s in (0, 1)]
        tp_group = groups[stage]
    for size in sizes:
        n = parse_size(size)
        tensor = torch.ones(n // 4, dtype=torch.float32)
        best = None
        for warm in (True, False):
            # Every rank starts the measured stream together (stagelink's
            # warm-up ends with its answer, which lines the stages up).
            if comm is None:
                dist.barrier()
            start = time.perf_counter()
            if comm is not None:
                stream_stagelink(comm, stage, tensor, 2 if warm else iters)
            else:
                stream_gloo(peer, t, rank, tp, stage, tensor,
                            2 if warm else iters, tp_group)
            if not warm:
                best = (time.perf_counter() - start) / iters * 1e6
        if rank == 0:
            print("%d,%s,%d,%.1f" % (n, peer, t, best), flush=True)
    if comm is not None:
        comm.close()
    else:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
