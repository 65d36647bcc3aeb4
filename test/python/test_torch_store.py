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

import pytest

from conftest import check, require

torch, dist = require("torch", "torch.distributed", why="install python3-torch")

import stagelink  # noqa: E402


pytestmark = pytest.mark.usefixtures("gloo_job")


@pytest.fixture(scope="module")
def t(world):
    return world // 2


@pytest.fixture(scope="module")
def stage(rank, t):
    """Reverse rank order: stage 0 is the upper half of the ranks."""
    return 1 - rank // t


@pytest.fixture(scope="module")
def placement(rank, t, stage):
    return stagelink.Placement(
        prev_rank=None if stage == 0 else rank + t,
        next_rank=rank - t if stage == 0 else None,
        tp_ranks=[(1 - stage) * t + i for i in range(t)])


@pytest.fixture(scope="module")
def tp_groups(t):
    """Each stage's TP group (every rank makes every group, in order)."""
    if t == 1:
        pytest.skip("t = 1 gathers nothing")
    return [dist.new_group(list(range(s * t, s * t + t))) for s in (0, 1)]


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


def test_default_store(world, t):
    """The default group's store, ranks from torch.distributed."""
    with stagelink.Communicator(tp_size=t) as comm:
        check(comm.rank == dist.get_rank() and comm.world_size == world,
              "ranks from torch.distributed: %r" % comm)
        exchange(comm, 10)


def test_store_passed_in(rank, world, t, stage, placement):
    """A store passed in, with the stages in reverse rank order."""
    store = dist.PrefixStore("mine",
                             dist.distributed_c10d._get_default_store())
    with stagelink.Communicator(tp_size=t, store=store, rank=rank,
                                world_size=world,
                                placement=placement) as comm:
        check(comm.is_first_stage == (stage == 0) and
              comm.is_last_stage == (stage == 1) and
              comm.info["tp_index"] == rank % t,
              "placement: rank %d (%r) is not stage %d, TP index %d"
              % (rank, comm.info, stage, rank % t))
        # Only the ranks it talks to: t - 1 TP peers and one stage
        # neighbour, in three exchanges (facts, addresses, the NCCL
        # gather's cards; the launcher gives the local rank), whatever the
        # world size.
        reads = comm._bootstrap.reads
        check(0 < reads <= 3 * t, "init read %d keys, more than 3 "
              "exchanges with %d peers" % (reads, t))
        exchange(comm, 20)
        gc.collect()  # the store callback must outlive a collection:
        # finalize runs its closing barrier through it
        with pytest.raises(ValueError, match="no neighbour"):
            comm.batch_isend_irecv([stagelink.P2POp(
                comm.isend, torch.zeros(4), rank)])


def test_abort_leaves_store_keys(rank, world, t):
    """close() deletes what the rank wrote but its last key and the node
    identities; after abort() it deletes nothing (the store may be what
    failed: an in-process restart's old world)."""
    store = dist.PrefixStore("abort",
                             dist.distributed_c10d._get_default_store())
    written = {}
    for aborted in (False, True):
        comm = stagelink.Communicator(tp_size=t, store=store, rank=rank,
                                      world_size=world)
        written[aborted] = list(comm._bootstrap.written)
        if aborted:
            comm.abort()
        comm.close()
    dist.barrier()  # no peer reads a closing barrier's key any more
    # delete_key says whether the key was there (torch 1.13 has no check).
    left = {a: (sum(bool(store.delete_key(n)) for n in names), len(names))
            for a, names in written.items()}
    check(left[True][0] == left[True][1] > 0 and
          left[False][0] < left[False][1],
          "keys left of those written: %d of %d after close, %d of %d after "
          "abort and close (want fewer, then all)"
          % (left[False] + left[True]))


def test_misplacement(rank, t, stage, placement, monkeypatch):
    """Refused on every rank before anything is posted: a tp_group that is
    not the TP group, and neighbours that do not name each other back
    (found in init's exchange with them)."""
    if t == 1:
        pytest.skip("t = 1 has no TP group to misplace")
    across = [dist.new_group([i, i + t]) for i in range(t)]
    with pytest.raises(ValueError, match="tp_group holds ranks"):
        stagelink.Communicator(tp_size=t, tp_group=across[rank % t])
    crossed = stagelink.Placement(
        prev_rank=None if stage == 0 else rank + t,
        next_rank=(rank + 1) % t if stage == 0 else None,
        tp_ranks=placement.tp_ranks)
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
                              next_rank=placement.next_rank,
                              tp_ranks=placement.tp_ranks)
    monkeypatch.setenv("STAGELINK_TIMEOUT", "3")
    try:
        stagelink.Communicator(tp_size=t, placement=bad)
        check(False, "a TP peer as the previous stage accepted")
    except stagelink.StagelinkError as e:
        want = "previous stage" if rank == 0 else "did that rank start"
        check(want in str(e), "rank 0 refused alone: %s" % e)


def test_check_gather_order(rank, t, tp_groups, monkeypatch):
    """STAGELINK_CHECK with the TP group's gather: TP ranks that complete
    their gathered receives in different orders fail alike, naming them,
    instead of rebuilding one microbatch from another's shards."""
    if t == 1:
        pytest.skip("t = 1 gathers nothing")
    monkeypatch.setenv("STAGELINK_CHECK", "1")
    with stagelink.Communicator(tp_size=t,
                                tp_group=tp_groups[rank // t]) as comm:
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


def test_check_on_one_tp_rank(rank, t, tp_groups, monkeypatch):
    """Set on TP index 0 only: the gathers go unchecked (a warning), not
    one rank's check paired with the other's data."""
    if t == 1:
        pytest.skip("t = 1 gathers nothing")
    monkeypatch.setenv("STAGELINK_CHECK", "1" if rank % t == 0 else "0")
    with stagelink.Communicator(tp_size=t,
                                tp_group=tp_groups[rank // t]) as comm:
        if comm.is_first_stage:
            comm.send(torch.arange(1000.), "next")
        else:
            got = torch.zeros(1000)
            comm.recv(got, "prev")
            check(torch.equal(got, torch.arange(1000.)),
                  "STAGELINK_CHECK on one TP rank: wrong data")
