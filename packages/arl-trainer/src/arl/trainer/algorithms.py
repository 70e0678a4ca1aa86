"""RL algorithms as pure functions over tensors: advantages, token log probs, the policy loss.

The loss is decoupled PPO (as in AReaL) with a truncated importance weight (TIS): the proximal
policy is the trainer's weights at the start of the step; tokens were sampled by an older
behaviour policy (the rollout engine, possibly several versions back and, with partial rollout,
mixed versions within one response). The PPO ratio is taken against the proximal policy and the
off-policy gap behaviour→proximal is corrected by min(exp(prox − behav), tis_cap).

This is the padded (B, T) + mask form kept for existing callers; the configurable variants (GSPO,
dual-clip, sequence IS, KL, entropy) over flat tokens are `arl.trainer.algorithm_config.compute_token_loss`.
"""

from __future__ import annotations

import torch

from arl.trainer.advantages import grpo_advantages
from arl.trainer.losses import clip_active, clipped_surrogate, ppo_ratio, token_is_weight

__all__ = ["grpo_advantages", "masked_mean", "policy_loss", "token_log_probs"]


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
    ratio = ppo_ratio(logp, proximal_logp)
    pg, outside, _ = clipped_surrogate(
        ratio, advantages, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high
    )
    behaviour_weight, truncated = token_is_weight(proximal_logp, behaviour_logp, tis_cap)
    loss = masked_mean(pg * behaviour_weight, mask)
    with torch.no_grad():
        active = clip_active(
            ratio, advantages, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high
        )
        clip_frac = masked_mean(active.float(), mask)  # the clipped branch is taken (issue #29)
        band_frac = masked_mean(outside.float(), mask)  # the ratio is outside the band
        tis_frac = masked_mean(truncated.float(), mask)
    return loss, {
        "clip_frac": clip_frac.item(),
        "clip_band_frac": band_frac.item(),
        "tis_clip_frac": tis_frac.item(),
    }
