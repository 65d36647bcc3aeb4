"""CPU shims for running the installed megatron-core without CUDA, each
replacing one upstream line and nothing else; a test installs the ones it
needs and names them.
SPDX-License-Identifier: MIT
"""
import contextlib
import functools
import operator
import types

import torch


class _CpuZeros(types.ModuleType):
    """A module's `torch`: torch, but zeros(device="cuda") on the CPU."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def zeros(*args, **kw):
        if str(kw.get("device", "")).startswith("cuda"):
            kw["device"] = "cpu"
        return torch.zeros(*args, **kw)


def token_counter():
    """pipeline_parallel/schedules.py `total_num_tokens = torch.zeros([],
    dtype=torch.int, device="cuda")` (both schedules): on the CPU."""
    from megatron.core.pipeline_parallel import schedules
    schedules.torch = _CpuZeros("torch")


def memory_buffer():
    """utils.py GlobalMemoryBuffer.get_tensor's
    `device=torch.cuda.current_device()` (attention's matmul buffer): a
    CPU tensor."""
    import megatron.core.utils as mcore_utils

    def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
        n = functools.reduce(operator.mul, tensor_shape, 1)
        buf = self.buffer.get((name, dtype))
        if buf is None or buf.numel() < n:
            buf = self.buffer[(name, dtype)] = torch.empty(n, dtype=dtype)
        return buf[0:n].view(*tensor_shape)

    mcore_utils.GlobalMemoryBuffer.get_tensor = get_tensor


class _NoRngTracker:
    def fork(self, name="model-parallel-rng"):
        return contextlib.nullcontext()


def rng_tracker():
    """tensor_parallel/random.py `get_cuda_rng_tracker().fork()` (around
    dropout, 0 in these tests): a fork that changes no RNG state."""
    import megatron.core.tensor_parallel as tensor_parallel
    import megatron.core.tensor_parallel.random as tp_random
    tp_random.get_cuda_rng_tracker = lambda *a, **k: _NoRngTracker()
    tensor_parallel.get_cuda_rng_tracker = tp_random.get_cuda_rng_tracker
