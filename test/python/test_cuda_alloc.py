"""CUDA tensors from each of PyTorch's allocators (the one
PYTORCH_CUDA_ALLOC_CONF selects: the caching allocator, with
expandable_segments, or backend:cudaMallocAsync), sent and received as
views at odd byte offsets into larger blocks, with blocks freed and
reallocated between rounds so that addresses are reused (what UCX's
cuda_ipc handle cache and stagelink's registrations must survive); every
value checked.  Skips with the reason without a GPU.  t = WORLD_SIZE / 2.
SPDX-License-Identifier: MIT
"""
import pytest

from conftest import check, module_comm, require_cuda

torch = require_cuda()

import stagelink  # noqa: E402

SIZES = (1, 7, 4097, (1 << 20) + 3, (16 << 20) + 1)
ROUNDS = 6


def pattern(n, salt):
    return ((torch.arange(n, device="cuda", dtype=torch.int64) * 7 + salt)
            % 251).to(torch.uint8)


@pytest.fixture(scope="module")
def comm(request, world):
    with module_comm(request, stagelink.Communicator(tp_size=world // 2)) as c:
        yield c


@pytest.mark.parametrize("r", range(ROUNDS))
def test_views_at_odd_offsets(comm, r):
    """One round: every size as a view at an odd offset (another each
    round) into a larger block; every other round the blocks go back to
    the driver, so the next round's addresses are new mappings."""
    print("allocator:", torch.cuda.get_allocator_backend())
    blocks = []
    for k, n in enumerate(SIZES):
        offset = 2 * r + 1
        block = torch.empty(n + 64, dtype=torch.uint8, device="cuda")
        view = block[offset:offset + n]
        blocks.append(block)
        mb = r * len(SIZES) + k
        if comm.is_first_stage:
            view.copy_(pattern(n, r + n))
            comm.send(view, microbatch=mb)
        else:
            view.fill_(0)
            comm.recv(view, microbatch=mb)
            want = pattern(n, r + n)
            bad = (view != want).nonzero()
            check(bad.numel() == 0, "round %d, %d bytes at offset %d: byte "
                  "%s differs" % (r, n, offset,
                                  bad[0].item() if bad.numel() else "-"))
    del blocks, view, block
    if r % 2:
        torch.cuda.empty_cache()  # back to the driver: new mappings
