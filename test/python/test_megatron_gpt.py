"""A small GPT model of megatron-core's own (GPTModel, the local layer
spec) trained one step by megatron-core's 1F1B schedule
(forward_backward_pipelining_without_interleaving, imported, never
transcribed) over stagelink.megatron.install(), on CPU tensors and gloo
process groups: p = WORLD_SIZE / t stages of t TP ranks (tensor-parallel
layers and their all-reduces on gloo).  Sequence parallelism is left to
test_megatron_core.py: megatron-core's local spec refuses it (its torch
LayerNorm; it needs Transformer Engine or Apex).  Every rank's gradients
must equal a single process's run of the whole model (TP 1, no pipeline) with the same
weights: each TP-sharded parameter's shard of it.

CPU shims (megatron_cpu.py, each replacing one upstream line): the
schedules' CUDA token counter, the global memory buffer's CUDA device,
and the CUDA RNG tracker's fork around dropout (0 here).

Usage: stagelink_run -n 4 -- python -m pytest test_megatron_gpt.py --tp T
SPDX-License-Identifier: MIT
"""
import os
import subprocess
import sys
import tempfile
import warnings

import pytest

warnings.filterwarnings("ignore")  # no apex, transformer engine, absl here

try:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import \
        get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.transformer.transformer_config import \
        TransformerConfig
except ImportError as e:
    pytest.skip("%s (tools/make-venv.sh makes .venv with megatron-core)" % e,
                allow_module_level=True)

import megatron_cpu  # noqa: E402
import stagelink.megatron  # noqa: E402
from conftest import check  # noqa: E402

VOCAB, SEQ, B, H, HEADS, M = 64, 8, 2, 16, 4, 3
megatron_cpu.token_counter()
megatron_cpu.memory_buffer()
megatron_cpu.rng_tracker()


# -- the model and its data ------------------------------------------------
def config(t, p, layers):
    return TransformerConfig(
        num_layers=layers, hidden_size=H, num_attention_heads=HEADS,
        ffn_hidden_size=2 * H, tensor_model_parallel_size=t,
        pipeline_model_parallel_size=p,
        attention_dropout=0.0, hidden_dropout=0.0,
        params_dtype=torch.float32, pipeline_dtype=torch.float32,
        use_cpu_initialization=True, deallocate_pipeline_outputs=True,
        moe_token_dispatcher_type="alltoall")


def model(cfg, pre, post):
    return GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(),
                    vocab_size=VOCAB, max_sequence_length=SEQ,
                    pre_process=pre, post_process=post,
                    share_embeddings_and_output_weights=False)


def microbatch(k):
    g = torch.Generator().manual_seed(3000 + k)
    tokens = torch.randint(0, VOCAB, (B, SEQ), generator=g)
    labels = torch.randint(0, VOCAB, (B, SEQ), generator=g)
    position_ids = torch.arange(SEQ).unsqueeze(0).expand(B, SEQ)
    mask = torch.ones(B, 1, SEQ, SEQ, dtype=torch.bool).tril().logical_not()
    return tokens, position_ids, mask, labels


def global_name(name, layer_offset):
    """decoder.layers.<local>.x -> decoder.layers.<global>.x"""
    parts = name.split(".")
    if parts[:2] == ["decoder", "layers"]:
        parts[2] = str(int(parts[2]) + layer_offset)
    return ".".join(parts)


def reference(path_weights, path_grads, layers):
    """One process, TP 1, no pipeline: the whole model's weights (saved for
    the ranks) and its gradients over the same microbatches."""
    # An in-process store: no port to race for with other jobs.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0,
                            world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    torch.manual_seed(7)
    m = model(config(1, 1, layers), True, True)
    torch.save({n: p.detach().clone() for n, p in m.named_parameters()},
               path_weights)
    for k in range(M):
        tokens, pos, mask, labels = microbatch(k)
        (m(tokens, pos, mask, labels=labels).mean() / M).backward()
    torch.save({n: p.grad for n, p in m.named_parameters()}, path_grads)
    dist.destroy_process_group()


def shard(full, param, tp_index, t):
    if getattr(param, "tensor_model_parallel", False) and t > 1:
        return full.chunk(t, dim=param.partition_dim)[tp_index]
    return full


def forward_step(data_iterator, m):
    tokens, pos, mask, labels = next(data_iterator)
    out = m(tokens, pos, mask, labels=labels)

    def loss_func(output):
        loss = output.mean()
        return loss, {"lm loss": loss.detach()}

    return out, loss_func


def run(t, weights, grads):
    world = dist.get_world_size()
    p = world // t
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=t,
                                             pipeline_model_parallel_size=p)
    stage = parallel_state.get_pipeline_model_parallel_rank()
    tp_index = parallel_state.get_tensor_model_parallel_rank()
    cfg = config(t, p, 2 * p)
    m = model(cfg, stage == 0, stage == p - 1)
    offset = stage * (cfg.num_layers // p)
    with torch.no_grad():
        for name, param in m.named_parameters():
            param.copy_(shard(weights[global_name(name, offset)], param,
                              tp_index, t))
    schedules.forward_backward_pipelining_without_interleaving(
        forward_step_func=forward_step,
        data_iterator=iter([microbatch(k) for k in range(M)]), model=m,
        num_microbatches=M, seq_length=SEQ, micro_batch_size=B,
        forward_only=False)
    case = "t=%d p=%d" % (t, p)
    for name, param in m.named_parameters():
        want = shard(grads[global_name(name, offset)], param, tp_index, t)
        check(param.grad is not None and
              torch.allclose(param.grad, want, rtol=1e-4, atol=1e-6),
              "%s: rank %d: %s: gradient differs from the single process's "
              "(max %.3g)" % (case, dist.get_rank(), name,
                              float("nan") if param.grad is None else
                              (param.grad - want).abs().max()))
    return case


@pytest.fixture(scope="module", autouse=True)
def job(gloo_job):
    stagelink.megatron.install()


@pytest.fixture(scope="module")
def single_process(tp):
    """The whole model's weights and gradients, from rank 0's run of this
    file in a process of its own (--reference), for every rank."""
    box = [tempfile.mkdtemp(prefix="stagelink-gpt-")
           if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box)
    paths = [os.path.join(box[0], "weights.pt"),
             os.path.join(box[0], "grads.pt")]
    if dist.get_rank() == 0:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_",
                                    "STAGELINK_", "TORCHELASTIC"))}
        layers = 2 * (dist.get_world_size() // tp)
        subprocess.run([sys.executable, __file__, "--reference"] + paths +
                       [str(layers)], env=env, check=True)
    dist.barrier()
    yield [torch.load(path) for path in paths]
    dist.barrier()
    if dist.get_rank() == 0:
        for path in paths:
            os.unlink(path)
        os.rmdir(box[0])


def test_one_step(tp, single_process):
    run(tp, *single_process)


if __name__ == "__main__" and sys.argv[1:2] == ["--reference"]:
    reference(sys.argv[2], sys.argv[3], int(sys.argv[4]))
