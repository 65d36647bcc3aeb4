"""The package with CUDA tensors, where a GPU and a CUDA-enabled torch
exist (skips with the reason otherwise): transfers ordered on torch's
current stream (the producing kernel is still queued when isend is
called), a side stream passed explicitly, Megatron's
deallocate_output_tensor and a dropped request while in flight; every
value checked on the host.  t = WORLD_SIZE / 2.
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
            check(torch.equal(g.cpu(), w), "microbatch %d: wrong values" % (i + 1))
print("rank %d: %s" % (comm.rank, "all checks passed" if not failures else
                       "%d failed" % len(failures)), flush=True)
sys.exit(1 if failures else 0)
