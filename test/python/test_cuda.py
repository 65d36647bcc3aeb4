"""The package with CUDA tensors, where a GPU and a CUDA-enabled torch
exist (skips with the reason otherwise): transfers ordered on torch's
current stream (the producing kernel is still queued when isend is
called), a side stream passed explicitly, Megatron's
deallocate_output_tensor and a dropped request while in flight; wait()
ordering the current stream as torch's Work.wait() does (a receive
posted on a side stream held busy, consumed on the current stream
alone); every value checked on the host.  t = WORLD_SIZE / 2.
SPDX-License-Identifier: MIT
"""
import gc

import pytest

from conftest import check, module_comm, require_cuda

torch = require_cuda()

import stagelink  # noqa: E402

N = 1 << 22


@pytest.fixture(scope="module")
def comm(request, world):
    with module_comm(request, stagelink.Communicator(tp_size=world // 2)) as c:
        yield c


def test_streams_and_dropped(comm):
    """Ordered on torch's current stream (the producing kernel still
    queued), deallocate_output_tensor and a dropped request in flight, a
    side stream passed explicitly."""
    n = N
    if comm.is_first_stage:
        a = torch.arange(n, device="cuda", dtype=torch.float32) * 3  # queued
        r1 = comm.isend(a, microbatch=1)
        a.data = torch.empty(1, device="cuda")   # deallocate_output_tensor
        comm.isend(torch.full((n,), 7.0, device="cuda"), microbatch=2)  # dropped
        gc.collect()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            b = torch.ones(n, device="cuda") * 5
        r3 = comm.isend(b, microbatch=3, stream=side.cuda_stream)
        for r in (r1, r3):
            r.wait()
    else:
        got = [torch.zeros(n, device="cuda") for _ in range(3)]
        reqs = [comm.irecv(g, microbatch=i + 1) for i, g in enumerate(got)]
        for r in reqs:
            r.wait()
        torch.cuda.current_stream().synchronize()
        want = [torch.arange(n, dtype=torch.float32) * 3,
                torch.full((n,), 7.0), torch.full((n,), 5.0)]
        for i, (g, w) in enumerate(zip(got, want)):
            check(torch.equal(g.cpu(), w),
                  "microbatch %d: wrong values" % (i + 1))


def test_wait_orders_current_stream(comm):
    """Posted on a side stream that is busy for about 0.1 s, waited and
    consumed on the current stream only: the data is there only if wait()
    made the current stream wait for the post's."""
    n = N
    if comm.is_first_stage:
        comm.isend(torch.full((n,), 11.0, device="cuda"), microbatch=4).wait()
        return
    late, busy = torch.zeros(n, device="cuda"), torch.cuda.Stream()
    with torch.cuda.stream(busy):
        torch.cuda._sleep(200_000_000)
        r4 = comm.irecv(late, microbatch=4)
    r4.wait()
    check(torch.equal(late.cpu(), torch.full((n,), 11.0)),
          "wait() did not order the current stream after the receive's "
          "(posted on a busy side stream)")
