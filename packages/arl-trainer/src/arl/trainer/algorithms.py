"""RL algorithms as pure functions over tensors: advantages, token log probs, the policy loss.

The loss is decoupled PPO (as in AReaL) with a truncated importance weight (TIS): the proximal
policy is the trainer's weights at the start of the step; tokens were sampled by an older
behaviour policy (the rollout engine, possibly several versions back and, with partial rollout,
mixed versions within one response). The PPO ratio is taken against the proximal policy and the
off-policy gap behaviour→proximal is corrected by min(exp(prox − behav), tis_cap).
"""

from __future__ import annotations

import torch


def grpo_advantages(rewards: torch.Tensor, group_index: torch.Tensor, *, norm_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages: each response's reward minus its group's mean (over std if asked).

    rewards: (B,) float; group_index: (B,) long, responses of one prompt share an index.
    """
    num_groups = int(group_index.max().item()) + 1
    counts = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group_index, torch.ones_like(rewards))
    sums = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group_index, rewards)
    mean = sums / counts
    centered = rewards - mean[group_index]
    if not norm_by_std:
        return centered
    sq = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group_index, centered**2)
    # Unbiased std like the reference GRPO; a group of one has no spread.
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))
    return centered / (std[group_index] + eps)


def token_log_probs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log prob of each token given its prefix. Output (B, T); position 0 has no prefix and is 0."""
    logits = logits[:, :-1].float() / temperature
    targets = input_ids[:, 1:]
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    logp = picked - torch.logsumexp(logits, dim=-1)
    return torch.nn.functional.pad(logp, (1, 0))


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def policy_loss(
    logp: torch.Tensor,
    proximal_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    tis_cap: float = 2.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean decoupled-PPO loss with a truncated behaviour importance weight.

    All tensors are (B, T); `advantages` is per token (a response's advantage broadcast); `mask` is 1
    on tokens the policy sampled. Returns the loss and detached diagnostics.
    """
    ratio = torch.exp(logp - proximal_logp)
    clipped = ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    pg = torch.maximum(-advantages * ratio, -advantages * clipped)
    behaviour_weight = torch.exp(proximal_logp - behaviour_logp).clamp(max=tis_cap).detach()
    loss = masked_mean(pg * behaviour_weight, mask)
    with torch.no_grad():
        clip_frac = masked_mean(((ratio - clipped).abs() > 0).float(), mask)
        tis_frac = masked_mean((torch.exp(proximal_logp - behaviour_logp) > tis_cap).float(), mask)
    return loss, {"clip_frac": clip_frac.item(), "tis_clip_frac": tis_frac.item()}
