"""CUDA paths of the reference policy (bf16) and of activation offload (skipped without a GPU)."""

import gc

import pytest
import torch
from trainer_helpers import random_batch

from arl.trainer import HFPolicy, TrainerConfig
from arl.trainer.algorithm_config import AlgorithmConfig
from arl.trainer.config import OptimConfig

pytestmark = pytest.mark.gpu


def test_bf16_reference_is_the_autocast_policy_at_step_one_and_stays_frozen(tiny_model_dir):
    cfg = TrainerConfig(
        optim=OptimConfig(lr=1e-2, grad_clip=1e9),
        max_tokens_per_microbatch=40,
        algorithm=AlgorithmConfig(kl_coef=0.1),
    )
    policy = HFPolicy(tiny_model_dir, cfg, device="cuda")
    assert policy.compute_dtype == torch.bfloat16
    ref = policy.ref_packed.hf
    linear = [
        m.weight
        for m in ref.modules()
        if isinstance(m, torch.nn.Linear) and m.weight is not ref.get_input_embeddings().weight
    ]
    assert linear and all(w.dtype == torch.bfloat16 for w in linear)
    # the residual stream stays fp32, as under autocast
    assert ref.get_input_embeddings().weight.dtype == torch.float32
    ref_bytes = sum(p.numel() * p.element_size() for p in ref.parameters())
    policy_bytes = sum(p.numel() * p.element_size() for p in policy.model.parameters())
    assert ref_bytes < 0.8 * policy_bytes
    batch = random_batch(seed=3)
    gap = (policy.reference_log_probs(batch) - policy.log_probs(batch)).abs().max().item()
    assert gap <= 1e-4, gap  # the same bf16 matmul inputs as the policy's autocast forward
    frozen = {n: p.detach().clone() for n, p in ref.named_parameters()}
    steps = [policy.train_step(random_batch(seed=s), mini_batch_rows=12) for s in range(1, 5)]
    assert abs(steps[0]["kl_ref_mean"]) <= 1e-5  # 0 up to the training forward's kernels
    assert steps[-1]["kl_ref_mean"] > 1e-4
    assert all(s["peak_mem_ref_gib"] > 0 and s["ref_s"] > 0 for s in steps)
    for n, p in ref.named_parameters():
        assert torch.equal(p, frozen[n]), n


def test_fsdp_bf16_reference_on_cuda(tiny_model_dir, tmp_path):
    from trainer_helpers import fsdp_reference_gpu

    from arl.trainer.distributed import spawn_local

    world = min(2, torch.cuda.device_count())
    spawn_local(fsdp_reference_gpu, world, tiny_model_dir, tmp_path, backend="nccl")
    out = torch.load(tmp_path / "fsdp_gpu.pt", weights_only=False)
    assert out["dtypes"] == {"torch.bfloat16"}
    assert (out["ref"] - out["own"]).abs().max() <= 1e-4  # FSDP's bf16 mixed precision = the bf16 reference
    assert abs(out["kls"][0]) <= 1e-5 and out["kls"][-1] > 1e-4
    assert out["metrics"]["peak_mem_ref_gib"] > 0


def _mid_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(cfg)


def _batch(rows=4, length=1024, vocab=2048):
    from arl.queue.types import Response, Sample
    from arl.trainer import assemble_batch

    g = torch.Generator().manual_seed(0)
    responses = [
        Response(
            response_ids=torch.randint(1, vocab, (length - 16,), generator=g).tolist(),
            response_mask=[1] * (length - 16),
            response_logprobs=[-1.0] * (length - 16),
            weight_versions=[0] * (length - 16),
            reward=float(i % 2),
        )
        for i in range(rows)
    ]
    return assemble_batch(
        [Sample(uid="s", prompt_ids=list(range(1, 17)), responses=responses, start_version=0, end_version=0)],
        pad_token_id=0,
    )


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_activation_offload_on_cuda_same_update_less_memory(checkpointing):
    import contextlib
    import copy

    from arl.trainer.offload import HostActivationOffload
    from arl.trainer.packed import pack_rows

    batch = _batch()
    base = _mid_model()
    results = {}
    for run, offload in (("off", False), ("off_again", False), ("on", True)):
        gc.collect()  # the previous run's policy must not be freed inside this run's measured forward
        torch.cuda.empty_cache()
        cfg = TrainerConfig(
            optim=OptimConfig(lr=1e-4),
            max_tokens_per_microbatch=8192,
            activation_checkpointing=checkpointing,
            activation_offload=offload,
        )
        policy = HFPolicy(copy.deepcopy(base), cfg, device="cuda")
        mb = pack_rows(batch, [0, 1, 2, 3]).to(policy.device)
        with torch.no_grad(), policy._autocast():
            policy.packed(mb)  # warm-up: lazy CUDA workspaces are not activations
        # Memory held between forward and backward of one micro-batch: the saved activations.
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with policy._autocast(), HostActivationOffload() if offload else contextlib.nullcontext():
            logp, _ = policy.packed(mb)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - before
        logp.sum().backward()
        grads = {n: p.grad.detach().clone() for n, p in policy.model.named_parameters() if p.grad is not None}
        policy.model.zero_grad(set_to_none=True)
        metrics = policy.train_step(batch, mini_batch_rows=4)
        results[run] = (metrics, grads, held)
        del policy, mb, logp
    (m_off, g_off, held_off), (_, g_again, _), (m_on, g_on, held_on) = (
        results["off"],
        results["off_again"],
        results["on"],
    )
    assert m_on["loss"] == pytest.approx(m_off["loss"], rel=1e-6, abs=1e-7)
    assert g_on.keys() == g_off.keys() and g_off
    for n, g in g_off.items():
        # Gradients, not Adam-updated weights. The bf16 backward is not bit-reproducible on CUDA (the varlen
        # flash backward and the embedding backward accumulate with atomics; a restored activation is a
        # fresh contiguous tensor, which can pick another GEMM algorithm). Measured on an H200: two plain
        # runs differ by ~1e-5–3e-4 relative per tensor, offload vs plain by up to 8e-4 (q_proj.bias, full
        # checkpointing). A wrong or stale activation is off by O(1); 1e-3 relative (8× under bf16's
        # resolution) above the run-to-run noise separates the two.
        noise = (g_again[n] - g).norm()
        assert (g_on[n] - g).norm() <= 2 * noise + 1e-3 * g.norm() + 1e-12, (n, noise, g.norm())
    assert m_on["offloaded_gib"] > 0 and "offloaded_gib" not in m_off
    assert held_on < held_off / 2, (held_on, held_off)
