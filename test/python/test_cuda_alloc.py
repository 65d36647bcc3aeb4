"""CUDA tensors from each of PyTorch's allocators (the one
PYTORCH_CUDA_ALLOC_CONF selects: the caching allocator, with
expandable_segments, or backend:cudaMallocAsync), sent and received as
views at odd byte offsets into larger blocks, with blocks freed and
reallocated between rounds so that addresses are reused (what UCX's
cuda_ipc handle cache and stagelink's registrations must survive); every
value checked.  Skips with the reason without a GPU.  t = WORLD_SIZE / 2.
SPDX-License-Identifier: MIT
"""
import os
import sys

from cuda_or_skip import require_cuda

torch = require_cuda()

import stagelink

failures = []
SIZES = (1, 7, 4097, (1 << 20) + 3, (16 << 20) + 1)
ROUNDS = 6

world = int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) %
                      torch.cuda.device_count())


def pattern(n, salt):
    return ((torch.arange(n, device="cuda", dtype=torch.int64) * 7 + salt)
            % 251).to(torch.uint8)


with stagelink.Communicator(tp_size=world // 2) as comm:
    mb = 0
    for r in range(ROUNDS):
        blocks = []
        for n in SIZES:
            offset = 2 * r + 1  # odd, and another each round
            block = torch.empty(n + 64, dtype=torch.uint8, device="cuda")
            view = block[offset:offset + n]
            blocks.append(block)
            if comm.is_first_stage:
                view.copy_(pattern(n, r + n))
                comm.send(view, microbatch=mb)
            else:
                view.fill_(0)
                comm.recv(view, microbatch=mb)
                want = pattern(n, r + n)
                if not torch.equal(view, want):
                    bad = (view != want).nonzero()[0].item()
                    failures.append("round %d, %d bytes at offset %d: byte %d "
                                    "is %d, want %d" % (
                                        r, n, offset, bad, view[bad].item(),
                                        want[bad].item()))
                    print("FAIL:", failures[-1], flush=True)
            mb += 1
        del blocks, view, block
        if r % 2:
            torch.cuda.empty_cache()  # back to the driver: new mappings
    print("rank %d: %s allocator, %d rounds of %d views: %s" % (
        comm.rank, torch.cuda.get_allocator_backend(),
        ROUNDS, len(SIZES), "ok" if not failures else "%d FAILED"
        % len(failures)), flush=True)
sys.exit(1 if failures else 0)
