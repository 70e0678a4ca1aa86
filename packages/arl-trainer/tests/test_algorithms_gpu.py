"""The algorithm functions on CUDA give the CPU results (no host tensors mixed in, no dtype drift).

Skipped without CUDA (see the repository conftest). On the device:

    PYTHONPATH=packages/arl-queue/src:packages/arl-sync/src:packages/arl-trainer/src \\
        python3 -m pytest -q -m gpu packages/arl-trainer/tests/test_algorithms_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from arl.trainer.advantages import compute_advantages, kl_penalized_rewards
from arl.trainer.algorithm_config import AlgorithmConfig
from arl.trainer.dynamic_sampling import informative_groups
from arl.trainer.kl import kl_estimate
from arl.trainer.proximal import loglinear_proximal
from arl.trainer.token_loss import compute_token_loss

pytestmark = pytest.mark.gpu

CONFIGS = [
    AlgorithmConfig(),
    AlgorithmConfig(
        dual_clip_c=1.5, seq_is="mask", seq_is_low=0.6, seq_is_high=1.8, entropy_coef=0.01, kl_coef=0.05
    ),
    AlgorithmConfig(
        policy_loss="gspo",
        clip_ratio_low=3e-4,
        clip_ratio_high=4e-4,
        seq_is="truncate",
        seq_is_agg="product",
        seq_is_high=1.5,
        kl_coef=0.02,
        kl_estimator="low_var_kl",
    ),
]


def batch(n_seqs: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 200, (n_seqs,), generator=g)
    seq_index = torch.repeat_interleave(torch.arange(n_seqs), lengths)
    n = seq_index.numel()
    behav = torch.randn(n, generator=g) * 0.3 - 1.0
    prox = behav + (torch.randn(n_seqs, generator=g) * 0.5)[seq_index] + torch.randn(n, generator=g) * 0.05
    logp = prox + torch.randn(n, generator=g) * 0.3
    adv = torch.randn(n_seqs, generator=g)[seq_index]
    entropy = torch.rand(n, generator=g) * 2
    ref = prox + torch.randn(n, generator=g) * 0.2
    return logp, prox, behav, adv, seq_index, entropy, ref


@pytest.mark.parametrize("cfg", CONFIGS, ids=["default", "ppo-all", "gspo-all"])
def test_compute_token_loss_cuda_equals_cpu(cfg):
    tensors = batch()
    results = {}
    for device in ("cpu", "cuda"):
        logp, prox, behav, adv, seq_index, entropy, ref = (t.to(device) for t in tensors)
        logp = logp.clone().requires_grad_()
        loss, metrics = compute_token_loss(
            cfg, logp, prox, behav, adv, seq_index, entropy=entropy, ref_logp=ref, num_seqs=64
        )
        loss.sum().backward()
        assert loss.device.type == device
        results[device] = (loss.detach().cpu(), logp.grad.cpu(), metrics)
    (l_cpu, g_cpu, m_cpu), (l_gpu, g_gpu, m_gpu) = results["cpu"], results["cuda"]
    assert torch.allclose(l_cpu, l_gpu, rtol=1e-5, atol=1e-6)
    assert torch.allclose(g_cpu, g_gpu, rtol=1e-5, atol=1e-6)
    for key in m_cpu:
        assert m_gpu[key] == pytest.approx(m_cpu[key], rel=1e-4, abs=1e-6), key


def test_bf16_log_probs_on_cuda():
    logp, prox, behav, adv, seq_index, entropy, ref = (t.cuda() for t in batch(seed=1))
    lp16 = logp.bfloat16().requires_grad_()
    loss, _ = compute_token_loss(
        CONFIGS[1],
        lp16,
        prox.bfloat16(),
        behav.bfloat16(),
        adv,
        seq_index,
        entropy=entropy.bfloat16(),
        ref_logp=ref.bfloat16(),
    )
    loss.sum().backward()
    assert loss.dtype == torch.float32 and lp16.grad.dtype == torch.bfloat16 and torch.isfinite(loss).all()


def test_advantages_proximal_kl_and_dynamic_sampling_on_cuda():
    g = torch.Generator().manual_seed(2)
    rewards = (torch.rand(32, generator=g) > 0.5).float()
    groups = torch.arange(8).repeat_interleave(4)
    for est in ("grpo", "dr_grpo", "rloo"):
        cpu = compute_advantages(est, rewards, groups)
        gpu = compute_advantages(est, rewards.cuda(), groups.cuda())
        assert torch.allclose(cpu, gpu.cpu(), atol=1e-6), est
    assert torch.equal(
        informative_groups(rewards, groups), informative_groups(rewards.cuda(), groups.cuda()).cpu()
    )
    logp, prox, behav, _, seq_index, _, ref = batch(n_seqs=32, seed=3)
    token_kl = kl_estimate("k3", logp, ref)
    shaped = kl_penalized_rewards(rewards, token_kl, seq_index, 0.1)
    assert torch.allclose(
        shaped, kl_penalized_rewards(rewards.cuda(), token_kl.cuda(), seq_index.cuda(), 0.1).cpu(), atol=1e-5
    )
    versions = torch.randint(0, 4, logp.shape, generator=g)
    cpu = loglinear_proximal(behav, logp, versions, 3, current_version=4)
    gpu = loglinear_proximal(behav.cuda(), logp.cuda(), versions.cuda(), 3, current_version=4)
    assert torch.allclose(cpu, gpu.cpu(), atol=1e-6)
