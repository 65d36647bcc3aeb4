"""Which gather rebuilds a scatter/gather boundary faster under Megatron-Core's
own 1F1B schedule: stagelink's (the shard relayed inside the TP group as it
lands) or torch's all_gather_into_tensor on Megatron's TP group (the
config's gather callback, gather="tp_group").  CPU tensors over gloo, or
with STAGELINK_TEST_DEVICE=cuda CUDA tensors over NCCL (tools/lab/gpu-check);
the model is one elementwise scale per stage, so the step is the
boundary.

    stagelink_run -n 4 -- .venv/bin/python tools/lab/bench_megatron_gather.py \\
        [T] [S,B,H] [MICROBATCHES] [STEPS]

Prints, at rank 0, the median and the spread of the step time of each
gather, the steps interleaved (stagelink, tp_group, stagelink, ...) so a
drift of the machine touches both alike.
SPDX-License-Identifier: MIT
"""
import sys

# Before torch's import: the help needs no torch.
if __name__ == "__main__" and sys.argv[1:2] in (["-h"], ["--help"]):
    print("usage: stagelink_run -n 4 -- .venv/bin/python tools/lab/bench_megatron_gather.py [T] [S,B,H] [MICROBATCHES] [STEPS]")
    print(__doc__)
    sys.exit(0)

import os
import statistics
import time
import warnings

warnings.filterwarnings("ignore", module="megatron")

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.enums import ModelType
from megatron.core.pipeline_parallel import schedules
from megatron.core.transformer.transformer_config import TransformerConfig

import stagelink.megatron

DEVICE = torch.device(os.environ.get("STAGELINK_TEST_DEVICE", "cpu"))
if DEVICE.type == "cuda":
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) %
                          torch.cuda.device_count())
else:
    # schedules.py's token counter allocates on CUDA: the tests' CPU shim.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(
        __file__)), "..", "..", "test", "python"))
    import megatron_cpu  # noqa: E402

    megatron_cpu.token_counter()


class Stage(torch.nn.Module):
    def __init__(self, config, first, h):
        super().__init__()
        self.config, self.first = config, first
        self.scale = torch.nn.Parameter(torch.ones(h, device=DEVICE))
        self.model_type = ModelType.encoder_or_decoder
        self.input_tensor = None

    def set_input_tensor(self, input_tensor):
        self.input_tensor = (input_tensor[0] if isinstance(input_tensor, list)
                             else input_tensor)

    def forward(self, x):
        return (x if self.first else self.input_tensor) * self.scale


def main():
    t = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    s, b, h = (int(v) for v in (sys.argv[2] if len(sys.argv) > 2
                                else "256,4,1024").split(","))
    m = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    dist.init_process_group("nccl" if DEVICE.type == "cuda" else "gloo")
    p = dist.get_world_size() // t
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=t, pipeline_model_parallel_size=p)
    config = TransformerConfig(
        num_layers=p, hidden_size=h, num_attention_heads=t,
        tensor_model_parallel_size=t, pipeline_model_parallel_size=p,
        pipeline_dtype=torch.float32, params_dtype=torch.float32,
        use_cpu_initialization=True)
    model = Stage(config, parallel_state.get_pipeline_model_parallel_rank()
                  == 0, h)
    x = torch.randn(s, b, h, device=DEVICE)

    def forward_step(_it, mod):
        out = mod(x)
        return out, lambda o: ((o * o).mean(), {})

    times = {"stagelink": [], "tp_group": []}
    for step in range(steps + 1):  # the first of each is a warm-up
        for gather in times:
            stagelink.megatron.install(gather=gather)
            dist.barrier()
            t0 = time.perf_counter()
            schedules.forward_backward_pipelining_without_interleaving(
                forward_step_func=forward_step, data_iterator=None,
                model=model, num_microbatches=m, seq_length=s,
                micro_batch_size=b, forward_only=False)
            if DEVICE.type == "cuda":
                torch.cuda.synchronize()
            dist.barrier()
            if step > 0:
                times[gather].append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        mib = s * b * h * 4 / 2**20
        print("t=%d p=%d tensor %d x %d x %d fp32 (%.1f MiB) on %s, %d "
              "microbatches, %d steps" % (t, p, s, b, h, mib, DEVICE.type, m,
                                          steps))
        for gather, ts in times.items():
            print("  gather=%-9s median %.1f ms  (min %.1f, max %.1f)"
                  % (gather, statistics.median(ts) * 1e3, min(ts) * 1e3,
                     max(ts) * 1e3))
    stagelink.megatron.uninstall()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
