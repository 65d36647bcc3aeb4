"""stagelink inside a torch.distributed job: after init_process_group (gloo,
the job's MASTER_ADDR/MASTER_PORT), a Communicator bootstraps through the
default group's store (no second listener on MASTER_PORT, which torch's
store holds), and through a store passed in; an explicit Placement with
the stages in reverse rank order, reading only its peers' keys;
batch_isend_irecv with torch's P2POp
forms (comm.isend, torch.distributed.isend with comm=, a neighbour's
world rank as the peer); a wrong tp_group and neighbours that disagree
refused, and a rank refused alone reported to its peers at
STAGELINK_TIMEOUT; with STAGELINK_CHECK, TP ranks completing gathered
receives in different orders refused.  t = WORLD_SIZE / 2.
SPDX-License-Identifier: MIT
"""
import gc
import os
import sys

try:
    import torch
    import torch.distributed as dist
except ImportError as e:
    print("SKIP: %s (install python3-torch)" % e)
    sys.exit(77)

import stagelink

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def exchange(comm, base):
    """Forward and back in one batch on each side, checked."""
    fwd, bwd = torch.arange(1000.) + base, -torch.arange(1000.) - base
    if comm.is_first_stage:
        got = torch.zeros(1000)
        ops = [stagelink.P2POp(comm.isend, fwd, "next", microbatch=base),
               stagelink.P2POp(dist.irecv, got, comm.info["next_rank"],
                               microbatch=base, comm=comm)]
        reqs = stagelink.batch_isend_irecv(ops)
        check(len(reqs) == 2 and all(isinstance(r, stagelink.Request)
                                     for r in reqs), "batch requests")
        for r in reqs:
            r.wait()
        check(torch.equal(got, bwd), "backward data (base %d)" % base)
    else:
        got = torch.zeros(1000)
        reqs = comm.batch_isend_irecv([
            stagelink.P2POp(dist.isend, bwd, comm.info["prev_rank"],
                            microbatch=base, comm=comm),
            stagelink.P2POp("irecv", got, "prev", microbatch=base,
                            comm=comm)])
        for r in reqs:
            r.wait()
        check(torch.equal(got, fwd), "forward data (base %d)" % base)


rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
t = world // 2
dist.init_process_group("gloo")  # env:// on stagelink_run's MASTER_PORT

# 1. The default group's store, ranks from torch.distributed.
with stagelink.Communicator(tp_size=t) as comm:
    check(comm.rank == dist.get_rank() and comm.world_size == world,
          "ranks from torch.distributed: %r" % comm)
    exchange(comm, 10)

# 2. A store passed in, with the stages in reverse rank order: stage 0 is
# the upper half of the ranks.
stage = 1 - rank // t
tp_ranks = [(1 - stage) * t + i for i in range(t)]
placement = stagelink.Placement(
    prev_rank=None if stage == 0 else rank + t,
    next_rank=rank - t if stage == 0 else None, tp_ranks=tp_ranks)
store = dist.PrefixStore("mine", dist.distributed_c10d._get_default_store())
with stagelink.Communicator(tp_size=t, store=store, rank=rank,
                            world_size=world, placement=placement) as comm:
    check(comm.is_first_stage == (stage == 0) and
          comm.is_last_stage == (stage == 1) and
          comm.info["tp_index"] == rank % t,
          "placement: rank %d (%r) is not stage %d, TP index %d"
          % (rank, comm.info, stage, rank % t))
    # Only the ranks it talks to: t - 1 TP peers and one stage neighbour,
    # in three exchanges (facts, addresses, the NCCL gather's cards; the
    # launcher gives the local rank), whatever the world size.
    reads = comm._bootstrap.reads
    check(0 < reads <= 3 * t, "init read %d keys, more than 3 exchanges "
          "with %d peers" % (reads, t))
    exchange(comm, 20)
    gc.collect()  # the store callback must outlive a collection: finalize
    # runs its closing barrier through it
    try:
        comm.batch_isend_irecv([stagelink.P2POp(comm.isend, torch.zeros(4),
                                                rank)])
        check(False, "its own rank accepted as a peer")
    except ValueError as e:
        check("no neighbour" in str(e), "own rank as peer: %s" % e)

# 3. Misplacement, refused on every rank before anything is posted: a
# tp_group that is not the TP group, and neighbours that do not name each
# other back (found in init's exchange with them).
if t > 1:
    across = [dist.new_group([i, i + t]) for i in range(t)]
    try:
        stagelink.Communicator(tp_size=t, tp_group=across[rank % t])
        check(False, "a tp_group across the stages accepted")
    except ValueError as e:
        check("tp_group holds ranks" in str(e), "wrong tp_group: %s" % e)
    crossed = stagelink.Placement(
        prev_rank=None if stage == 0 else rank + t,
        next_rank=(rank + 1) % t if stage == 0 else None,
        tp_ranks=tp_ranks)
    try:
        stagelink.Communicator(tp_size=t, placement=crossed)
        check(False, "neighbours that do not name each other accepted")
    except stagelink.StagelinkError as e:
        check("stage" in str(e) and "same process groups" in str(e),
              "crossed neighbours: %s" % e)
    # One rank refused alone (its TP peer named as its previous stage): the
    # others, waiting for its keys, fail at STAGELINK_TIMEOUT, not at the
    # store's own timeout.
    bad = stagelink.Placement(prev_rank=1 if rank == 0 else placement.prev_rank,
                              next_rank=placement.next_rank, tp_ranks=tp_ranks)
    timeout, os.environ["STAGELINK_TIMEOUT"] = \
        os.environ.get("STAGELINK_TIMEOUT"), "3"
    try:
        stagelink.Communicator(tp_size=t, placement=bad)
        check(False, "a TP peer as the previous stage accepted")
    except stagelink.StagelinkError as e:
        want = "previous stage" if rank == 0 else "did that rank start"
        check(want in str(e), "rank 0 refused alone: %s" % e)
    if timeout is None:
        del os.environ["STAGELINK_TIMEOUT"]
    else:
        os.environ["STAGELINK_TIMEOUT"] = timeout

# 4. STAGELINK_CHECK with the TP group's gather: TP ranks that complete
# their gathered receives in different orders fail alike, naming them,
# instead of rebuilding one microbatch from another's shards.
if t > 1:
    os.environ["STAGELINK_CHECK"] = "1"
    groups = [dist.new_group(list(range(s * t, s * t + t))) for s in (0, 1)]
    with stagelink.Communicator(tp_size=t,
                                tp_group=groups[rank // t]) as comm:
        if comm.is_first_stage:
            for mb in (0, 1):
                comm.send(torch.full((1000,), float(mb)), "next",
                          microbatch=mb)
        else:
            got = [torch.zeros(1000) for _ in (0, 1)]
            reqs = [comm.irecv(got[mb], "prev", microbatch=mb)
                    for mb in (0, 1)]
            for mb in ((0, 1) if comm.tp_index == 0 else (1, 0)):
                try:
                    reqs[mb].wait()
                    check(False, "microbatch %d gathered out of order" % mb)
                except stagelink.StagelinkError as e:
                    check("in the same order" in str(e),
                          "gathers out of order: %s" % e)
    # Set on TP index 0 only: the gathers go unchecked (a warning), not one
    # rank's check paired with the other's data.
    os.environ["STAGELINK_CHECK"] = "1" if rank % t == 0 else "0"
    with stagelink.Communicator(tp_size=t,
                                tp_group=groups[rank // t]) as comm:
        if comm.is_first_stage:
            comm.send(torch.arange(1000.), "next")
        else:
            got = torch.zeros(1000)
            comm.recv(got, "prev")
            check(torch.equal(got, torch.arange(1000.)),
                  "STAGELINK_CHECK on one TP rank: wrong data")
    del os.environ["STAGELINK_CHECK"]

dist.barrier()
dist.destroy_process_group()
print("rank %d: %s" % (rank, "all checks passed" if not failures else
                       "%d failed" % len(failures)), flush=True)
sys.exit(1 if failures else 0)
