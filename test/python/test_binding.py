"""The ctypes binding between two pipeline stages (t = WORLD_SIZE / 2):
bytearray, bytes, numpy and torch buffers forward and back, byte for byte;
errors become StagelinkError with the library's status and sentence.
Run by stagelink_run with /usr/bin/python3 (Debian's numpy and torch).
SPDX-License-Identifier: MIT
"""
import datetime
import os
import sys

try:
    import numpy as np
    import torch
except ImportError as e:  # only where Debian's packages are absent
    print("SKIP: %s (install python3-numpy and python3-torch)" % e)
    sys.exit(77)

import stagelink

world = int(os.environ["WORLD_SIZE"])
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


with stagelink.Communicator(tp_size=world // 2) as comm:
    stage = comm.info["pp_index"]
    first = stage == 0

    # bytearray and bytes (sends only), forward.
    payload = bytes(range(256)) * 37
    if first:
        comm.send(payload, microbatch=1)
        comm.send(bytearray(payload), microbatch=2)
    else:
        for mb in (1, 2):
            got = bytearray(len(payload))
            comm.recv(got, microbatch=mb)
            check(bytes(got) == payload, "bytes/bytearray microbatch %d" % mb)

    # numpy float32 forward, whole elements per TP shard.
    a = np.arange(10007, dtype=np.float32) * 0.5
    if first:
        comm.send(a, microbatch=3)
    else:
        b = np.zeros_like(a)
        comm.recv(b, microbatch=3)
        check(np.array_equal(a, b), "numpy float32")

    # torch tensors: activations forward, gradients back (both in flight).
    torch.manual_seed(7)
    act = torch.randn(33, 129)
    grad = torch.randn(33, 129, dtype=torch.float64)
    if first:
        reqs = [comm.isend(act, microbatch=4),
                comm.irecv(g := torch.zeros_like(grad), peer="next",
                           microbatch=4)]
        for r in reqs:
            r.wait()
        check(torch.equal(g, grad), "torch gradient back")
    else:
        x = torch.empty_like(act)
        reqs = [comm.irecv(x, microbatch=4),
                comm.isend(grad, peer="prev", microbatch=4)]
        while not all(r.test() for r in reqs):
            pass
        check(torch.equal(x, act), "torch activation forward")

    # Errors carry the status and the library's sentence.
    try:
        comm.isend(act, peer="prev" if first else "next", microbatch=9)
        check(False, "a send past the pipeline's end was accepted")
    except stagelink.StagelinkError as e:
        check(e.status == "ERR_NO_PEER" and "stage" in str(e), str(e))
    if first:
        comm.send(bytearray(8), microbatch=5)
    else:
        try:
            comm.recv(bytearray(16), microbatch=5)
            check(False, "a 16-byte receive of an 8-byte send succeeded")
        except stagelink.StagelinkError as e:
            check(e.status == "ERR_SIZE_MISMATCH", str(e))
    try:
        comm.irecv(memoryview(bytearray(4)).toreadonly())
        check(False, "a read-only memoryview was accepted to receive into")
    except ValueError:
        pass

    # A post's arguments: the common ones are taken in line, any other is
    # checked by the binding, and a refused one posts nothing.
    for kwargs, kind in (({"microbatch": -1}, ValueError),
                         ({"microbatch": 1 << 32}, ValueError),
                         ({"microbatch": True}, TypeError),
                         ({"microbatch": 1.0}, TypeError),
                         ({"chunk": 1 << 11}, ValueError),
                         ({"chunk": -2}, ValueError),
                         ({"peer": "nxt"}, ValueError),
                         ({"peer": None}, TypeError),
                         ({"elem_size": 0}, ValueError)):
        try:
            comm.isend(act, **kwargs)
            check(False, "isend(**%r) was accepted" % kwargs)
        except kind as e:
            check(list(kwargs)[0] in str(e), "isend(**%r): %s" % (kwargs, e))
    other = comm.info["next_rank"] if first else comm.info["prev_rank"]
    if first:  # a rank for the peer, index-able ints for the tag
        comm.send(act, peer=other, microbatch=np.int64(6), chunk=np.int16(3))
    else:
        y = torch.empty_like(act)
        comm.recv(y, peer=other, microbatch=np.uint32(6), chunk=3)
        check(torch.equal(y, act), "a rank as peer, numpy ints as the tag")

    # wait()'s own arguments, refused before it waits; a timeout given by
    # position; a Request that no communicator made.
    r = (comm.isend(bytes(8), microbatch=7) if first else
         comm.irecv(bytearray(8), microbatch=7))
    for args, kwargs, kind in (((1, 2), {}, TypeError),
                               ((), {"bogus": 1}, TypeError),
                               (("1",), {}, TypeError),
                               ((float("nan"),), {}, ValueError)):
        try:
            r.wait(*args, **kwargs)
            check(False, "wait(*%r, **%r) was accepted" % (args, kwargs))
        except kind:
            pass
    check(r.wait(30) is True, "wait(30) did not return True, as torch's")
    check(r.test(), "wait(30) returned before the transfer completed")
    check(r.wait(datetime.timedelta(seconds=30)) is True,
          "wait(timedelta) of a completed request")
    if not first:  # a timedelta bounds a wait as its seconds do
        q = comm.irecv(bytearray(8), microbatch=8)  # never sent
        try:
            q.wait(datetime.timedelta(milliseconds=50))
            check(False, "wait(timedelta(50 ms)) of a receive never sent")
        except stagelink.TimeoutError as e:
            check("timeout=0.05" in str(e), "timedelta expiry: %s" % e)
        q.cancel()
        try:
            q.wait()
            check(False, "a canceled receive completed")
        except stagelink.CanceledError:
            pass
    try:
        stagelink.Request.__new__(stagelink.Request).wait()
        check(False, "a Request of no communicator waited")
    except ValueError as e:
        check("no communicator" in str(e), str(e))
    check(comm.counters()["transfers_completed"] >= 5, "counters")
    print("rank %d (stage %d, %s plugin, stagelink %s): %s" % (
        comm.info["rank"], stage, comm.plugin, stagelink.version(),
        "all checks passed" if not failures else "%d failed" % len(failures)))

# device=: checked here, then handed to comm_init (STAGELINK_CONFIG_DEVICE_SET),
# which refuses it where no GPU is usable, with the library's reason.
for bad, kind in ((-1, ValueError), ("cpu", ValueError), (True, TypeError)):
    try:
        stagelink.Communicator(tp_size=world // 2, device=bad)
        check(False, "device=%r was accepted" % (bad,))
    except kind:
        pass
if not torch.cuda.is_available():
    try:
        stagelink.Communicator(tp_size=world // 2, device=0)
        check(False, "device=0 was accepted without a usable GPU")
    except stagelink.StagelinkError as e:
        check(e.status == "ERR_CONFIG" and "CUDA device 0" in str(e)
              and "STAGELINK_CONFIG_DEVICE_SET" in str(e), str(e))

sys.exit(1 if failures else 0)
