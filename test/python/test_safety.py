"""Memory safety and misuse of the Python package, one case per thing a user
was seen to do (issue 12's table), between two pipeline stages of t ranks
(t = WORLD_SIZE / 2), each with a clear exception or the right data:

- dropped isend, tensor garbage-collected (64 KiB, 96 KiB, 16 MiB);
- Megatron's deallocate_output_tensor (out.data = torch.empty(1)) in flight;
- dropped irecv (its buffer must not be written once freed);
- wait after a timeout (wait's own, and the library's STAGELINK_TIMEOUT)
  waits again and gets the data; Request.cancel;
- Ctrl-C (SIGINT) during a blocked receive raises KeyboardInterrupt fast,
  and the request is still usable;
- bad arguments, and conjugate or negative views, raise ValueError or
  TypeError, never wrap;
- bytes as a receive buffer is refused; read-only arrays and numpy scalars
  can be sent;
- STAGELINK_CHECK=1: another dtype or shape of the same bytes is an error
  naming both sides;
- a forked child's calls on the parent's communicator raise, its exit
  leaves it alone;
- calls after close() raise ClosedError;
- an exception inside `with` aborts: the failing rank leaves at once and its
  peer gets PeerFailedError, not a timeout.
Run by stagelink_run, pytest in every rank, with the interpreter the
package is installed for; the cases run in this order.
SPDX-License-Identifier: MIT
"""
import builtins
import gc
import os
import signal
import sys
import threading
import time

import pytest

from conftest import check, module_comm, require

np, torch = require("numpy", "torch",
                    why="install python3-numpy and python3-torch")

import stagelink  # noqa: E402


@pytest.fixture(scope="module")
def comm(request, world):
    """One communicator for the cases before test_after_close closes it."""
    with module_comm(request, stagelink.Communicator(tp_size=world // 2)) as c:
        yield c


def pattern(n, seed):
    """n int32 values no other case produces."""
    return torch.arange(n, dtype=torch.int32) * 7 + seed * 1000003


def churn(nbytes):
    """Allocations that reuse freed memory, filled with -1: a transport
    writing into freed memory corrupts these, one reading from it sends
    these instead of the data."""
    return [torch.full((nbytes // 4,), -1, dtype=torch.int32)
            for _ in range(4)]


def barrier(comm, mb, patient=False):
    """Both stages past this point (a byte each way); every TP rank pairs
    with its own peer.  `patient`: waits again after the library's
    deadline (a communicator with a short STAGELINK_TIMEOUT)."""
    one = bytearray(1)
    if comm.is_first_stage:
        reqs = [comm.isend(one, "next", mb), comm.irecv(bytearray(1), "next",
                                                        mb)]
    else:
        reqs = [comm.irecv(bytearray(1), "prev", mb), comm.isend(one, "prev",
                                                                  mb)]
    for r in reqs:
        for _ in range(60 if patient else 1):
            try:
                r.wait()
                break
            except stagelink.TimeoutError:
                if not patient:
                    raise


def test_dropped_send(comm):
    for i, nbytes in enumerate((64 << 10, 96 << 10, 16 << 20)):
        mb = 100 + i
        if comm.is_first_stage:
            comm.isend(pattern(nbytes // 4, mb), microbatch=mb)  # dropped
            gc.collect()
            junk = churn(nbytes)
            barrier(comm, 200 + i)
            del junk
        else:
            barrier(comm, 200 + i)
            got = torch.empty(nbytes // 4, dtype=torch.int32)
            comm.recv(got, microbatch=mb)
            check(torch.equal(got, pattern(nbytes // 4, mb)),
                  "dropped isend of %d bytes: wrong data" % nbytes)


def test_deallocated_output(comm):
    for i, n in enumerate((24000, 1 << 20)):
        mb = 110 + i
        if comm.is_first_stage:
            out = pattern(n, mb).reshape(-1, 8)
            req = comm.isend(out, microbatch=mb)
            out.data = torch.empty(1)  # Megatron's deallocate_output_tensor
            gc.collect()
            junk = churn(n * 4)
            barrier(comm, 210 + i)
            req.wait()
            del junk
        else:
            barrier(comm, 210 + i)
            got = torch.empty(n // 8, 8, dtype=torch.int32)
            comm.recv(got, microbatch=mb)
            check(torch.equal(got.flatten(), pattern(n, mb)),
                  "deallocate_output_tensor while sending %d elements: "
                  "wrong data" % n)


def test_dropped_recv(comm):
    n, mb = 1 << 18, 120
    if comm.is_first_stage:
        barrier(comm, 220)
        comm.send(pattern(n, mb), microbatch=mb)
        barrier(comm, 221)
    else:
        before = comm.counters()["transfers_completed"]
        comm.irecv(torch.empty(n, dtype=torch.int32), microbatch=mb)
        gc.collect()
        junk = churn(n * 4)
        barrier(comm, 220)
        barrier(comm, 221)
        # The dropped receive completes in the background (the barrier's
        # two transfers count too): wait for the counter, bounded.
        end = time.monotonic() + 30
        while (comm.counters()["transfers_completed"] < before + 5 and
               time.monotonic() < end):
            time.sleep(0.01)
        check(comm.counters()["transfers_completed"] >= before + 5,
              "the dropped irecv never completed")
        check(all(bool((j == -1).all()) for j in junk),
              "a dropped irecv wrote into memory it no longer owned")
        del junk


def test_wait_again(comm):
    n, mb = 4096, 130
    if comm.is_first_stage:
        barrier(comm, 230)
        comm.send(pattern(n, mb), microbatch=mb)
        req = comm.irecv(torch.empty(4), peer="next", microbatch=131)
        barrier(comm, 231)
        check(req.cancel() is True, "cancel of a pending receive")
        try:
            req.wait()
            check(False, "a canceled receive completed")
        except stagelink.CanceledError:
            pass
        try:
            req.test()
            check(False, "test() of a canceled request did not raise")
        except stagelink.CanceledError:
            pass
    else:
        got = torch.zeros(n, dtype=torch.int32)
        req = comm.irecv(got, microbatch=mb)
        try:
            req.wait(timeout=0.2)
            check(False, "wait(timeout=0.2) returned before the send")
        except stagelink.TimeoutError as e:
            check(isinstance(e, builtins.TimeoutError) and
                  "stays in flight" in str(e), "TimeoutError: %r" % e)
        check(req.test() is False, "test() of a timed-out request is not "
              "False")
        barrier(comm, 230)
        req.wait()
        check(torch.equal(got, pattern(n, mb)), "wait after a timeout: "
              "wrong data")
        barrier(comm, 231)


def test_interrupted(comm):
    n, mb = 1000, 140
    if comm.is_first_stage:
        barrier(comm, 240)
        comm.send(pattern(n, mb), microbatch=mb)
        return
    got = torch.zeros(n, dtype=torch.int32)
    req = comm.irecv(got, microbatch=mb)
    sent = []
    # Python's own Ctrl-C: a job started in the background of a shell (or
    # under nohup) inherits SIGINT ignored, and Python then keeps it so.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def interrupt():
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Timer(0.3, interrupt).start()
    try:
        req.wait()
        check(False, "the wait returned without the data")
    except KeyboardInterrupt:
        late = time.monotonic() - sent[0]
        print("rank %d: KeyboardInterrupt %.1f ms after SIGINT"
              % (comm.rank, late * 1e3), flush=True)
        check(late < 0.2, "Ctrl-C took %.0f ms to interrupt a wait" %
              (late * 1e3))
    barrier(comm, 240)
    req.wait()
    check(torch.equal(got, pattern(n, mb)), "the interrupted receive, "
          "waited again, has wrong data")


def test_bad_arguments(comm):
    t = torch.zeros(4)
    cases = [
        (lambda: comm.isend(t, peer="nxt"), ValueError, "'nxt'"),
        (lambda: comm.isend(t, microbatch=-1), ValueError, "microbatch=-1"),
        (lambda: comm.isend(t, microbatch=2 ** 32), ValueError,
         "4294967296"),
        (lambda: comm.isend(t, chunk=70000), ValueError, "chunk=70000"),
        (lambda: comm.isend(t, microbatch=1.5), TypeError, "float"),
        (lambda: comm.isend(t, elem_size=0), ValueError, "elem_size"),
        (lambda: comm.isend(t, peer="next" if comm.is_first_stage
                            else "prev", elem_size=3),
         stagelink.InvalidArgumentError,
         "nbytes 16 is not a multiple of elem_size 3"),
        (lambda: comm.isend(torch.zeros(4, 4).t()), ValueError,
         "contiguous"),
        (lambda: comm.isend(object()), TypeError, "buffer"),
        (lambda: comm.isend(torch.zeros(4, dtype=torch.cfloat).conj()),
         ValueError, "resolve_conj()"),
        (lambda: comm.irecv(torch.zeros(4, dtype=torch.cfloat).conj()),
         ValueError, "resolve_conj()"),
        (lambda: comm.isend(torch._neg_view(torch.zeros(4))), ValueError,
         "resolve_neg()"),
        (lambda: comm.irecv(b"abcd"), ValueError, "read-only"),
        (lambda: comm.irecv(np.frombuffer(b"abcdefgh", dtype=np.uint8)),
         ValueError, "read-only"),
        (lambda: stagelink.Communicator(mode="scatter"), ValueError,
         "'scatter'"),
        (lambda: stagelink.Communicator(tp_size=0), ValueError, "tp_size"),
    ]
    for fn, kind, words in cases:
        try:
            fn()
            check(False, "accepted: expected %s with %s" % (kind.__name__,
                                                            words))
        except kind as e:
            check(words in str(e), "%s without %r: %s" % (kind.__name__,
                                                          words, e))


def test_quiet_errors(comm):
    """Errors the caller receives are not also WARN lines on stderr."""
    import tempfile
    peer = "next" if comm.is_first_stage else "prev"
    with tempfile.TemporaryFile() as err:
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(err.fileno(), 2)
        try:
            first = comm.irecv(torch.empty(4), peer=peer, microbatch=160)
            try:
                comm.irecv(torch.empty(4), peer=peer, microbatch=160)
                check(False, "the same tag twice in flight was accepted")
            except stagelink.TagInUseError:
                pass
            try:
                comm.isend(torch.empty(4), peer="prev" if peer == "next"
                           else "next")
                check(False, "a send past the pipeline's end was accepted")
            except stagelink.StagelinkError as e:
                check(e.status == "ERR_NO_PEER", "past the end: %s" % e)
            first.cancel()
            try:
                first.wait()
            except stagelink.StagelinkError:
                pass  # canceled (or its TP peer's cancel came first)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        text = err.read().decode(errors="replace")
    check("WARN" not in text, "errors the caller received were also "
          "logged as WARN: %r" % text)


def test_readonly_sends(comm):
    mb = 150
    arr = np.arange(1000, dtype=np.float32)
    arr.setflags(write=False)
    scalar = np.float64(2.5)
    if comm.is_first_stage:
        comm.send(arr, microbatch=mb)
        comm.send(scalar, microbatch=mb + 1)
        comm.send(b"read-only bytes", microbatch=mb + 2)
    else:
        got = np.zeros(1000, dtype=np.float32)
        comm.recv(got, microbatch=mb)
        check(np.array_equal(got, arr), "read-only array")
        one = np.zeros(1, dtype=np.float64)
        comm.recv(one, microbatch=mb + 1)
        check(one[0] == 2.5, "numpy scalar")
        text = bytearray(15)
        comm.recv(text, microbatch=mb + 2)
        check(bytes(text) == b"read-only bytes", "bytes")


def test_fork(comm):
    """A forked child: a call on the parent's communicator raises, saying
    so, though another thread of the parent was in the library at the fork
    (its lock held: the helper thread may be); its exit (the atexit close)
    and close() leave the parent's alone, whose transfers then arrive."""
    import warnings
    held, release = threading.Event(), threading.Event()

    def hold():
        with comm._lock:
            held.set()
            release.wait(60)
    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # threads
        pid = os.fork()
    if pid == 0:
        code = 3
        try:
            comm.isend(torch.zeros(4), peer="next" if comm.is_first_stage
                       else "prev", microbatch=170)
            code = 1
        except stagelink.StagelinkError as e:
            code = 0 if "forked" in str(e) else 2
        except BaseException:
            pass
        try:
            stagelink.communicator._close_at_exit()  # what its exit runs
            comm.close()
            comm.abort()  # a no-op once closed
            if "closed" not in repr(comm):
                code = 4
        except BaseException:
            code = 4
        os._exit(code)
    release.set()
    holder.join()
    deadline = time.monotonic() + 60
    done, status = 0, -1
    while done == 0 and time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        time.sleep(0.01 if done == 0 else 0)
    if done == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    check(done != 0 and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
          "the forked child: %s (1: the send was accepted, 2: the error did "
          "not say forked, 4: closing raised)"
          % ("status %#x" % status if done else "hung for 60 s"))
    n, mb = 4096, 171
    if comm.is_first_stage:
        comm.send(pattern(n, mb), microbatch=mb)
    else:
        got = torch.empty(n, dtype=torch.int32)
        comm.recv(got, microbatch=mb)
        check(torch.equal(got, pattern(n, mb)), "after the fork: wrong data")


def test_after_close(comm):
    """Calls after close() raise ClosedError; a second close and an abort
    after it do nothing."""
    pending = comm.irecv(torch.empty(4), peer="next" if comm.is_first_stage
                         else "prev", microbatch=999)
    barrier(comm, 998)
    comm.close()
    for what, fn in [("counters", comm.counters),
                     ("isend", lambda: comm.isend(bytearray(4))),
                     ("wait of a request canceled by close", pending.wait),
                     ("test", pending.test), ("get_error", comm.get_error)]:
        try:
            fn()
            check(False, "%s after close() did not raise" % what)
        except stagelink.ClosedError as e:
            check("close" in str(e), "%s: %s" % (what, e))
    comm.close()  # a second close is a no-op
    comm.abort()  # as is an abort after close


def test_library_deadline(world, monkeypatch):
    """STAGELINK_TIMEOUT passes: TimeoutError, then a second wait gets the
    data."""
    monkeypatch.setenv("STAGELINK_TIMEOUT", "1")
    with stagelink.Communicator(tp_size=world // 2) as comm:
        n, mb = 2048, 7
        if comm.is_first_stage:
            barrier(comm, 8, patient=True)
            comm.send(pattern(n, mb), microbatch=mb)
        else:
            got = torch.zeros(n, dtype=torch.int32)
            req = comm.irecv(got, microbatch=mb)
            try:
                req.wait()
                check(False, "a receive nobody sent completed")
            except stagelink.TimeoutError as e:
                check("wait again" in str(e), "library timeout: %s" % e)
            barrier(comm, 8, patient=True)
            req.wait()
            check(torch.equal(got, pattern(n, mb)),
                  "wait after STAGELINK_TIMEOUT: wrong data")


def test_dtype_check(world, monkeypatch):
    """STAGELINK_CHECK=1: the same 12 bytes as f16[6] and f32[3]."""
    monkeypatch.setenv("STAGELINK_CHECK", "1")
    with stagelink.Communicator(tp_size=world // 2) as comm:
        if comm.is_first_stage:
            comm.send(torch.ones(6, dtype=torch.float16), microbatch=1)
            comm.send(torch.ones(2, 3), microbatch=2)
            comm.send(torch.ones(6), microbatch=3)
            comm.send(torch.ones(7, dtype=torch.float16), microbatch=4)
        else:
            try:
                comm.recv(torch.empty(3), microbatch=1)
                check(False, "f16[6] received as f32[3] without an error")
            except stagelink.ShapeMismatchError as e:
                check("float16[6]" in str(e) and "float32[3]" in str(e) and
                      "rank %d" % comm.info["prev_rank"] in str(e),
                      "dtype check sentence: %s" % e)
            try:
                comm.recv(torch.empty(3, 2), microbatch=2)
                check(False, "[2, 3] received as [3, 2] without an error")
            except stagelink.ShapeMismatchError as e:
                check("float32[2, 3]" in str(e) and "float32[3, 2]" in str(e),
                      "shape check sentence: %s" % e)
            got = torch.zeros(6)
            comm.recv(got, microbatch=3)
            check(torch.equal(got, torch.ones(6)), "checked transfer")
            try:
                comm.recv(torch.empty(3), microbatch=4)
                check(False, "a size mismatch passed")
            except stagelink.SizeMismatchError as e:
                check("float16[7]" in str(e), "size mismatch names the "
                      "sender's shape: %s" % e)


def test_exception_in_with(world):
    """The first stage raises inside `with` while its peer waits for it;
    last: the first stage leaves the job after it."""
    start = time.monotonic()
    try:
        with stagelink.Communicator(tp_size=world // 2) as comm:
            first = comm.is_first_stage
            if first:
                barrier(comm, 9)
                raise RuntimeError("the model raised")
            req = comm.irecv(torch.empty(16), microbatch=10)
            barrier(comm, 9)
            req.wait()
            check(False, "a receive from a rank that left completed")
    except stagelink.PeerFailedError as e:
        took = time.monotonic() - start
        check(not first and took < 20, "the peer of the failing rank: "
              "PeerFailedError after %.1f s: %s" % (took, e))
    except stagelink.StagelinkError as e:
        check(False, "the peer of the failing rank got %r" % e)
    except RuntimeError as e:
        took = time.monotonic() - start
        check(first and str(e) == "the model raised" and took < 10,
              "the failing rank left `with` in %.1f s: %r" % (took, e))

