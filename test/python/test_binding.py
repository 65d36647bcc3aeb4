"""The binding between two pipeline stages (t = WORLD_SIZE / 2):
bytearray, bytes, numpy and torch buffers forward and back, byte for byte;
errors become StagelinkError with the library's status and sentence.
Run by stagelink_run, pytest in every rank, with /usr/bin/python3 (Debian's
numpy and torch) or the wheel's environment.
SPDX-License-Identifier: MIT
"""
import datetime

import pytest

from conftest import check, module_comm, require

np, torch = require("numpy", "torch",
                    why="install python3-numpy and python3-torch")

import stagelink  # noqa: E402


@pytest.mark.parametrize("bad, kind", [(-1, ValueError), ("cpu", ValueError),
                                       (True, TypeError)])
def test_device_refused(world, bad, kind):
    """device=: checked here before comm_init (first: no communicator of
    this module is open yet, as a user's first call)."""
    with pytest.raises(kind):
        stagelink.Communicator(tp_size=world // 2, device=bad)


def test_device_without_gpu(world):
    """device= handed to comm_init (STAGELINK_CONFIG_DEVICE_SET), which
    refuses it where no GPU is usable, with the library's reason."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is usable here")
    with pytest.raises(stagelink.StagelinkError) as e:
        stagelink.Communicator(tp_size=world // 2, device=0)
    check(e.value.status == "ERR_CONFIG" and "CUDA device 0" in str(e.value)
          and "STAGELINK_CONFIG_DEVICE_SET" in str(e.value), str(e.value))


@pytest.fixture(scope="module")
def comm(request, world):
    with module_comm(request, stagelink.Communicator(tp_size=world // 2)) as c:
        yield c


def test_bytes_forward(comm):
    """bytearray and bytes (sends only), forward."""
    payload = bytes(range(256)) * 37
    if comm.is_first_stage:
        comm.send(payload, microbatch=1)
        comm.send(bytearray(payload), microbatch=2)
    else:
        for mb in (1, 2):
            got = bytearray(len(payload))
            comm.recv(got, microbatch=mb)
            check(bytes(got) == payload, "bytes/bytearray microbatch %d" % mb)


def test_numpy_forward(comm):
    """numpy float32 forward, whole elements per TP shard."""
    a = np.arange(10007, dtype=np.float32) * 0.5
    if comm.is_first_stage:
        comm.send(a, microbatch=3)
    else:
        b = np.zeros_like(a)
        comm.recv(b, microbatch=3)
        check(np.array_equal(a, b), "numpy float32")


def test_torch_both_ways(comm):
    """torch tensors: activations forward, gradients back (both in flight)."""
    torch.manual_seed(7)
    act = torch.randn(33, 129)
    grad = torch.randn(33, 129, dtype=torch.float64)
    if comm.is_first_stage:
        g = torch.zeros_like(grad)
        reqs = [comm.isend(act, microbatch=4),
                comm.irecv(g, peer="next", microbatch=4)]
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


def test_errors(comm):
    """Errors carry the status and the library's sentence."""
    first = comm.is_first_stage
    act = torch.randn(33, 129)
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


@pytest.mark.parametrize("kwargs, kind", [
    ({"microbatch": -1}, ValueError), ({"microbatch": 1 << 32}, ValueError),
    ({"microbatch": True}, TypeError), ({"microbatch": 1.0}, TypeError),
    ({"chunk": 1 << 11}, ValueError), ({"chunk": -2}, ValueError),
    ({"peer": "nxt"}, ValueError), ({"peer": None}, TypeError),
    ({"elem_size": 0}, ValueError)])
def test_post_argument_refused(comm, kwargs, kind):
    """A post's arguments: the common ones are taken in line, any other is
    checked by the binding, and a refused one posts nothing."""
    with pytest.raises(kind) as e:
        comm.isend(torch.zeros(4), **kwargs)
    check(list(kwargs)[0] in str(e.value) and
          not isinstance(e.value, stagelink.StagelinkError),
          "isend(**%r): %r" % (kwargs, e.value))


def test_rank_as_peer(comm):
    """A rank for the peer, index-able ints for the tag."""
    act = torch.arange(33 * 129, dtype=torch.float32).reshape(33, 129)
    if comm.is_first_stage:
        comm.send(act, peer=comm.info["next_rank"], microbatch=np.int64(6),
                  chunk=np.int16(3))
    else:
        y = torch.empty_like(act)
        comm.recv(y, peer=comm.info["prev_rank"], microbatch=np.uint32(6),
                  chunk=3)
        check(torch.equal(y, act), "a rank as peer, numpy ints as the tag")


def test_wait_arguments(comm):
    """wait()'s own arguments, refused before it waits; a timeout given by
    position; a Request that no communicator made."""
    first = comm.is_first_stage
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
    with pytest.raises(ValueError, match="no communicator"):
        stagelink.Request.__new__(stagelink.Request).wait()


def test_counters(comm):
    check(comm.counters()["transfers_completed"] >= 5, "counters")
    check(stagelink.version() == stagelink.library_version(),
          "stagelink.version, the name of earlier releases")
