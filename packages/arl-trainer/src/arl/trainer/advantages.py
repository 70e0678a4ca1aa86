"""Outcome-reward advantages for groups of responses to one prompt, and KL-in-reward shaping.

- `grpo_advantages`: reward minus the group mean, over the group's (unbiased) std (GRPO); with
  `norm_by_std=False` it is Dr. GRPO's unnormalised form.
- `rloo_advantages`: reward minus the mean of the *other* responses of the group (REINFORCE
  leave-one-out) = n/(n−1) · (r − mean); a group of one has no baseline and gets 0.
- `kl_penalized_rewards`: KL to a reference policy as a reward penalty (verl's `use_kl_in_reward`):
  each response's reward minus `kl_coef` × its summed per-token KL, applied before advantages.
All inputs are 1-D per response: rewards (B,), group_index (B,) long with one index per prompt.
"""

from __future__ import annotations

import torch

from arl.trainer.algorithm_config import AdvantageEstimator
from arl.trainer.errors import AlgorithmError
from arl.trainer.segments import check_flat, resolve_num_seqs, seq_count, seq_sum


def _group_stats(rewards: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    check_flat(group_index, ("rewards", rewards))
    num_groups = resolve_num_seqs(group_index, None)
    counts = seq_count(group_index, num_groups, rewards.dtype)
    sums = seq_sum(rewards, group_index, num_groups)
    return counts, sums


def grpo_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, *, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative advantages: each response's reward minus its group's mean (over std if asked).

    rewards: (B,) float; group_index: (B,) long, responses of one prompt share an index.
    """
    counts, sums = _group_stats(rewards, group_index)
    mean = sums / counts
    centered = rewards - mean[group_index]
    if not norm_by_std:
        return centered
    sq = seq_sum(centered**2, group_index, counts.shape[0])
    # Unbiased std like the reference GRPO; a group of one has no spread.
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))
    return centered / (std[group_index] + eps)


def rloo_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline: r_i − mean_{j≠i} r_j within each group; 0 for a group of one."""
    counts, sums = _group_stats(rewards, group_index)
    n = counts[group_index]
    others = (sums[group_index] - rewards) / (n - 1).clamp(min=1)
    return torch.where(n > 1, rewards - others, torch.zeros_like(rewards))


def compute_advantages(
    estimator: AdvantageEstimator, rewards: torch.Tensor, group_index: torch.Tensor
) -> torch.Tensor:
    """Per-response advantages by the named estimator (grpo | dr_grpo | rloo)."""
    if estimator == "grpo":
        return grpo_advantages(rewards, group_index, norm_by_std=True)
    if estimator == "dr_grpo":
        return grpo_advantages(rewards, group_index, norm_by_std=False)
    if estimator == "rloo":
        return rloo_advantages(rewards, group_index)
    raise AlgorithmError(f"unknown advantage estimator {estimator!r}; expected grpo, dr_grpo or rloo")


def kl_penalized_rewards(
    rewards: torch.Tensor, token_kl: torch.Tensor, seq_index: torch.Tensor, kl_coef: float
) -> torch.Tensor:
    """Rewards (S,) minus kl_coef × Σ_t KL_t of each response; token_kl (N,) flat, seq_index (N,) in 0..S-1.

    With outcome rewards and GRPO/RLOO advantages (one advantage per response) this equals putting
    −kl_coef·KL_t into every token's reward, as verl's KL-in-reward does. The result is detached:
    a reward is a constant to the policy gradient.
    """
    if rewards.dim() != 1:
        raise AlgorithmError(f"rewards must be 1-D (S,), got shape {tuple(rewards.shape)}")
    check_flat(seq_index, ("token_kl", token_kl))
    penalty = seq_sum(token_kl.detach().to(rewards.dtype), seq_index, rewards.shape[0])
    return rewards - kl_coef * penalty
