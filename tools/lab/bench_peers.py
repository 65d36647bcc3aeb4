#!/usr/bin/env python3
"""The pipeline boundary as other Python paths move it, for
tools/lab/bench-two-node: one rank of a job of two stages of t TP ranks
(stage 0 on the first node, stage 1 on the second, Megatron's rank
order), streaming ITERS tensors of each size forward with 4 in flight and
one answer back, as stagelink_perftest -t stream does.

    bench_peers.py PEER SIZES ITERS     (under stagelink_run, per node)

PEER:
  gloo-full      torch.distributed over gloo: every TP rank sends the
                 whole tensor to its peer (Megatron's own boundary);
  gloo-slice     each TP rank sends its 1/t slice, the receivers rebuild
                 the tensor with all_gather on their TP group (Megatron's
                 old scatter/gather);
  stagelink-py   stagelink.Communicator with torch tensors (scatter_gather);
  nixl-full      NIXL agent to agent (nixl-cu13, its own UCX, forced onto
                 tcp over the node's link), host memory: every TP rank
                 WRITEs the whole tensor into its peer's registered buffer,
                 the receiver counts NIXL's notifications (what a NIXL user
                 would do; gloo carries only the metadata and the answer).

Rank 0 prints "size,peer,t,avg_us" per size (time per tensor).
SPDX-License-Identifier: MIT
"""
import sys

# Before torch's import: the help needs no torch.
if __name__ == "__main__" and sys.argv[1:2] in (["-h"], ["--help"]):
    print("usage: bench_peers.py PEER SIZES ITERS     (under stagelink_run, per node; see below)")
    print(__doc__)
    sys.exit(0)

import os
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


def nixl_agent(name):
    """An agent on NIXL's UCX, kept on tcp over this node's link: two
    namespaces on one host look like one node to UCX, which would move
    the bytes through shared memory instead of the veth."""
    os.environ["UCX_TLS"] = "tcp"
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        os.environ["UCX_NET_DEVICES"] = os.environ["GLOO_SOCKET_IFNAME"]
    from nixl_cu13._api import nixl_agent as agent, nixl_agent_config
    return agent(name, nixl_agent_config(backends=["UCX"]))


def nixl_wait(agent, handle):
    # NIXL has no blocking wait: poll, yielding the CPU to the node's
    # other ranks (two cores here) between looks.
    while True:
        state = agent.check_xfer_state(handle)
        if state == "DONE":
            return
        if state == "ERR":
            raise RuntimeError("a NIXL transfer failed")
        time.sleep(20e-6)


def stream_nixl(agent, t, rank, stage, tensor, iters, link):
    other = rank + t if stage == 0 else rank - t
    if stage == 1:
        got = 0
        while got < iters:
            notes = agent.get_new_notifs()
            got += sum(len(v) for v in notes.values())
            if got < iters:
                time.sleep(20e-6)
        dist.send(torch.zeros(1), other)
        return
    # WINDOW prepared transfers, each posted again once its last one is
    # done, as a NIXL user streams.
    for i in range(iters):
        h = link[i % WINDOW]
        if i >= WINDOW:
            nixl_wait(agent, h)
        if agent.transfer(h, str(i).encode()) == "ERR":
            raise RuntimeError("NIXL transfer %d failed" % i)
    for i in range(max(0, iters - WINDOW), iters):
        nixl_wait(agent, link[i % WINDOW])
    dist.recv(torch.zeros(1), other)


def nixl_connect(agent, t, rank, stage, buf):
    """Registers this rank's buffer (the largest tensor; each size is its
    head); the sender learns its receiver's agent and buffer address
    through gloo."""
    reg = agent.register_memory(buf)
    every = [None] * (2 * t)
    dist.all_gather_object(every, (agent.get_agent_metadata(),
                                   buf.data_ptr()))
    if stage == 1:
        return reg, None
    meta, addr = every[rank + t]
    return reg, (agent.add_remote_agent(meta), addr)


def nixl_link(agent, peer, tensor):
    """The sender's WINDOW transfer handles of one size (WRITEs of the
    tensor into its peer's buffer), for stream_nixl."""
    if peer is None:
        return None
    name, addr = peer
    nbytes = tensor.numel() * tensor.element_size()
    local = agent.get_xfer_descs(tensor)
    remote = agent.get_xfer_descs([(addr, nbytes, 0)], "DRAM")
    return [agent.initialize_xfer("WRITE", local, remote, name, b"0")
            for _ in range(WINDOW)]


def main():
    peer, sizes, iters = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    t = world // 2
    stage, tp = rank // t, rank % t
    comm = tp_group = agent = nixl_peer = None
    if peer == "nixl-full":
        dist.init_process_group("gloo")
        agent = nixl_agent("rank%d" % rank)
        buf = torch.ones(max(parse_size(x) for x in sizes) // 4,
                         dtype=torch.float32)
        nixl_reg, nixl_peer = nixl_connect(agent, t, rank, stage, buf)
    elif peer == "stagelink-py":
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
        if agent is not None:
            tensor = buf[:n // 4]
            link = nixl_link(agent, nixl_peer, tensor)
        else:
            tensor, link = torch.ones(n // 4, dtype=torch.float32), None
        best = None
        for warm in (True, False):
            # Every rank starts the measured stream together (stagelink's
            # warm-up ends with its answer, which lines the stages up).
            if comm is None:
                dist.barrier()
            start = time.perf_counter()
            if comm is not None:
                stream_stagelink(comm, stage, tensor, 2 if warm else iters)
            elif agent is not None:
                stream_nixl(agent, t, rank, stage, tensor,
                            2 if warm else iters, link)
            else:
                stream_gloo(peer, t, rank, tp, stage, tensor,
                            2 if warm else iters, tp_group)
            if not warm:
                best = (time.perf_counter() - start) / iters * 1e6
        if comm is None:
            # The boundary is done when every TP rank has its tensor: with
            # each sending the whole tensor (the -full peers) rank 0's own
            # stream can end first, so the stage's time is the longest.
            # (stagelink's receive ends only with every shard, gathered.)
            longest = torch.tensor([best], dtype=torch.float64)
            dist.all_reduce(longest, op=dist.ReduceOp.MAX)
            best = longest.item()
        if rank == 0:
            print("%d,%s,%d,%.1f" % (n, peer, t, best), flush=True)
        for h in link or []:
            agent.release_xfer_handle(h)
    if comm is not None:
        comm.close()
        return 0
    if agent is not None:
        # NIXL's teardown, in order, before gloo's: left to the interpreter's
        # exit its destructors crash.
        dist.barrier()
        if nixl_peer is not None:
            agent.remove_remote_agent(nixl_peer[0])
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
