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
import os
import sys

from cuda_or_skip import require_cuda

torch = require_cuda()

import stagelink

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


world = int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) %
                      torch.cuda.device_count())
n = 1 << 22
with stagelink.Communicator(tp_size=world // 2) as comm:
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
        r4 = comm.isend(torch.full((n,), 11.0, device="cuda"), microbatch=4)
        for r in (r1, r3, r4):
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
            check(torch.equal(g.cpu(), w), "microbatch %d: wrong values" % (i + 1))
        # Posted on a side stream that is busy for about 0.1 s, waited and
        # consumed on the current stream only: the data is there only if
        # wait() made the current stream wait for the post's.
        late, busy = torch.zeros(n, device="cuda"), torch.cuda.Stream()
        with torch.cuda.stream(busy):
            torch.cuda._sleep(200_000_000)
            r4 = comm.irecv(late, microbatch=4)
        r4.wait()
        check(torch.equal(late.cpu(), torch.full((n,), 11.0)),
              "wait() did not order the current stream after the receive's "
              "(posted on a busy side stream)")
print("rank %d: %s" % (comm.rank, "all checks passed" if not failures else
                       "%d failed" % len(failures)), flush=True)
sys.exit(1 if failures else 0)
