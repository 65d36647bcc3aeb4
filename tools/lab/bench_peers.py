#!/usr/bin/env python3
"""The pipeline boundary as other Python paths move it, for
tools/lab/bench-two-node: one rank of a job of two stages of t TP ranks
(stage 0 on the first node, stage 1 on the second, Megatron's rank
order), streaming ITERS tensors of each size forward with 4 in flight and
one answer back, as stagelink_perftest -t stream does.

    bench_peers.py PEER SIZES ITERS     (under stagelink_run, per node)

ITERS is one count for every size, or a comma list, one a size.

PEER:
  gloo-full      torch.distributed over gloo: every TP rank sends the
                 whole tensor to its peer (Megatron's own boundary);
  gloo-slice     each TP rank sends its 1/t slice, the receivers rebuild
                 the tensor with all_gather on their TP group (Megatron's
                 old scatter/gather);
  stagelink-py   stagelink.Communicator with torch tensors (scatter_gather)
                 on Debian's UCX (bench-two-node sets STAGELINK_UCX=system);
  stagelink-py-wheel
                 the same on the libucx wheel's newer UCX
                 (STAGELINK_UCX=wheel), as NIXL's wheel brings its own;
  nixl-full      NIXL agent to agent (nixl-cu13, its own UCX, forced onto
                 tcp over the node's link), host memory: every TP rank
                 WRITEs the whole tensor into its peer's registered buffer,
                 the receiver counts NIXL's notifications (what a NIXL user
                 would do; gloo carries only the metadata and the answer);
                 NIXL's progress thread off, as for shared cores (its
                 Python API spins it with no delay), the waits polling;
  nixl-slice     NIXL moving 1/t over the link, then each receiver WRITEs
                 its slice into the node's other ranks' buffers (over UCX's
                 tcp, to the node's own address: UCX would take shared
                 memory across the namespaces, which share a host); a tensor is whole on a
                 rank once its slice and the t - 1 others have landed.

Rank 0 prints "size,peer,t,avg_us,cpu_s" per size: the time per tensor
(the slowest rank's stream) and the CPU time every rank of the job spent
in the measured stream (user + system, getrusage).
SPDX-License-Identifier: MIT
"""
import sys

# Before torch's import: the help needs no torch.
if __name__ == "__main__" and sys.argv[1:2] in (["-h"], ["--help"]):
    print("usage: bench_peers.py PEER SIZES ITERS     (under stagelink_run, per node; see below)")
    print(__doc__)
    sys.exit(0)

import os
import resource
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
    # Its receive ends only with every shard, gathered.
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


def nixl_agent(name):
    """An agent on NIXL's UCX, kept on tcp over this node's link: two
    namespaces on one host look like one node to UCX, which would move
    the bytes through shared memory instead of the veth.  No progress
    thread: the Python API's spins without a delay, taking a core from the
    node's other ranks; the waits below progress the agent instead."""
    os.environ["UCX_TLS"] = "tcp"
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        os.environ["UCX_NET_DEVICES"] = os.environ["GLOO_SOCKET_IFNAME"]
    from nixl_cu13._api import nixl_agent as agent, nixl_agent_config
    return agent(name, nixl_agent_config(enable_prog_thread=False,
                                         backends=["UCX"]))


def nixl_wait(agent, handle):
    # NIXL has no blocking wait: poll, sleeping between looks to leave the
    # node's other ranks and the kernel's TCP the CPU (two cores here); a
    # yield instead read 0.89-1.00 of the link at 1 MiB against 0.94-0.98,
    # on twice the CPU.
    while True:
        state = agent.check_xfer_state(handle)
        if state == "DONE":
            return
        if state == "ERR":
            raise RuntimeError("a NIXL transfer failed")
        time.sleep(20e-6)


def nixl_send(agent, handles, iters):
    """`iters` WRITEs, WINDOW prepared handles each posted again once its
    last one is done, as a NIXL user streams; the notification carries
    the tensor's index."""
    for i in range(iters):
        h = handles[i % WINDOW]
        if i >= WINDOW:
            nixl_wait(agent, h)
        if agent.transfer(h, str(i).encode()) == "ERR":
            raise RuntimeError("NIXL transfer %d failed" % i)
    for i in range(max(0, iters - WINDOW), iters):
        nixl_wait(agent, handles[i % WINDOW])


class NixlNotes:
    """The notifications an agent got, counted per sender and index."""

    def __init__(self, agent):
        self.agent, self.count = agent, {}

    def poll(self):
        for name, notes in self.agent.get_new_notifs().items():
            for note in notes:
                key = (name, int(note.decode()))
                self.count[key] = self.count.get(key, 0) + 1

    def wait(self, senders, index, sending=()):
        """Until every sender's note of `index` is in and every handle of
        `sending` done: with no progress thread, checking a transfer's
        state is what moves it on."""
        pending = list(sending)
        while True:
            self.poll()
            for h in list(pending):
                state = self.agent.check_xfer_state(h)
                if state == "ERR":
                    raise RuntimeError("a NIXL transfer failed")
                if state == "DONE":
                    pending.remove(h)
            if not pending and all(self.count.get((s, index), 0) > 0
                                   for s in senders):
                return
            time.sleep(20e-6)


def stream_nixl(peer, agent, t, rank, stage, iters, links):
    """nixl-full: stage 0 WRITEs the whole tensor.  nixl-slice: stage 0
    WRITEs its slice; each stage 1 rank, as its slice lands, WRITEs it
    into the node's other ranks' buffers and waits for theirs."""
    other = rank + t if stage == 0 else rank - t
    if stage == 0:
        nixl_send(agent, links[0], iters)
        dist.recv(torch.zeros(1), other)
        return
    notes, sender = NixlNotes(agent), "rank%d" % other
    node = ["rank%d" % r for r in range(t, 2 * t) if r != rank]
    for i in range(iters):
        notes.wait([sender], i)
        if peer == "nixl-slice":
            for h in links:
                if agent.transfer(h[0], str(i).encode()) == "ERR":
                    raise RuntimeError("NIXL relay %d failed" % i)
            notes.wait(node, i, [h[0] for h in links])
    dist.send(torch.zeros(1), other)


def nixl_connect(agent, peer, t, rank, stage, buf):
    """Registers this rank's buffer (the largest tensor; each size is its
    head).  Through gloo each rank learns where it WRITEs: a sender its
    receiver's agent and buffer, a nixl-slice receiver its node's other
    ranks'.  Returns the registration and [(agent name, buffer address)]."""
    reg = agent.register_memory(buf)
    every = [None] * (2 * t)
    dist.all_gather_object(every, (agent.get_agent_metadata(),
                                   buf.data_ptr()))
    if stage == 0:
        targets = [rank + t]
    elif peer == "nixl-slice":
        targets = [r for r in range(t, 2 * t) if r != rank]
    else:
        targets = []
    return reg, [(agent.add_remote_agent(every[r][0]), every[r][1])
                 for r in targets]


def nixl_links(agent, targets, buf, view, count):
    """`count` WRITE handles a target: `view` (a slice of the registered
    `buf`) to the same offset of the target's buffer."""
    nbytes = view.numel() * view.element_size()
    offset = view.data_ptr() - buf.data_ptr()
    local = agent.get_xfer_descs(view)
    return [[agent.initialize_xfer(
                "WRITE", local,
                agent.get_xfer_descs([(addr + offset, nbytes, 0)], "DRAM"),
                name, b"0") for _ in range(count)]
            for name, addr in targets]


def main():
    peer, sizes = sys.argv[1], sys.argv[2].split(",")
    counts = [int(x) for x in sys.argv[3].split(",")]
    if len(counts) not in (1, len(sizes)):
        sys.exit("bench_peers.py: %d counts for %d sizes: give one, or one a size"
                 % (len(counts), len(sizes)))
    counts = counts * len(sizes) if len(counts) == 1 else counts
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    t = world // 2
    stage, tp = rank // t, rank % t
    comm = tp_group = agent = None
    # gloo for every peer: the barrier before each measured stream, the
    # slowest rank's time and the job's CPU time after it.
    dist.init_process_group("gloo")
    if peer.startswith("nixl-"):
        agent = nixl_agent("rank%d" % rank)
        buf = torch.ones(max(parse_size(x) for x in sizes) // 4,
                         dtype=torch.float32)
        nixl_reg, targets = nixl_connect(agent, peer, t, rank, stage, buf)
    elif peer.startswith("stagelink-py"):
        import stagelink
        # On torch.distributed's store: gloo's holds MASTER_PORT.
        comm = stagelink.Communicator(tp_size=t, mode="scatter_gather")
    else:
        groups = [dist.new_group(list(range(s * t, (s + 1) * t)))
                  for s in (0, 1)]
        tp_group = groups[stage]
    for size, iters in zip(sizes, counts):
        n = parse_size(size)
        links = None
        if agent is not None:
            tensor = buf[:n // 4]
            part = tensor.numel() // t
            mine = tensor[tp * part:(tp + 1) * part] if peer == "nixl-slice" else tensor
            links = nixl_links(agent, targets, buf, mine,
                               WINDOW if stage == 0 else 1)
        else:
            tensor = torch.ones(n // 4, dtype=torch.float32)
        best = cpu = None
        for warm in (True, False):
            # Every rank starts the measured stream together.
            dist.barrier()
            start = time.perf_counter()
            used = resource.getrusage(resource.RUSAGE_SELF)
            if comm is not None:
                stream_stagelink(comm, stage, tensor, 2 if warm else iters)
            elif agent is not None:
                stream_nixl(peer, agent, t, rank, stage,
                            2 if warm else iters, links)
            else:
                stream_gloo(peer, t, rank, tp, stage, tensor,
                            2 if warm else iters, tp_group)
            if not warm:
                best = (time.perf_counter() - start) / iters * 1e6
                now = resource.getrusage(resource.RUSAGE_SELF)
                cpu = (now.ru_utime - used.ru_utime) + (now.ru_stime - used.ru_stime)
        # The boundary is done when every TP rank has its tensor: with each
        # sending the whole tensor (the -full peers) rank 0's own stream can
        # end first, so the stage's time is the longest.
        longest = torch.tensor([best], dtype=torch.float64)
        dist.all_reduce(longest, op=dist.ReduceOp.MAX)
        total = torch.tensor([cpu], dtype=torch.float64)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        if rank == 0:
            print("%d,%s,%d,%.1f,%.6f" % (n, peer, t, longest.item(),
                                          total.item()), flush=True)
        for handles in links or []:
            for h in handles:
                agent.release_xfer_handle(h)
    if comm is not None:
        comm.close()
    if agent is not None:
        # NIXL's teardown, in order, before gloo's: left to the interpreter's
        # exit its destructors crash.
        dist.barrier()
        for name, _ in targets:
            agent.remove_remote_agent(name)
        agent.deregister_memory(nixl_reg)
        del agent
        dist.barrier()
        dist.destroy_process_group()
        # nixl-cu13 1.5.1 then crashes (SIGSEGV) in its exit-time
        # teardown, with everything measured and released: skip it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
