"""Policy-loss building blocks over flat loss tokens: ratios, clipped surrogates, importance weights.

Layout: every tensor is flat over the N loss tokens of a micro-batch; `seq_index` (N,) long says
which local sequence (0..S-1) each token belongs to. A sequence must lie whole inside one
micro-batch for the sequence-level pieces (GSPO, sequence IS weights). Functions return per-token
values; aggregation (token-mean, seq-mean-token-mean, ...) and global denominators are the
trainer's. Everything is elementwise on token tensors, so the token pieces also work on (B, T).

- PPO ratio r_t = π_θ/π_prox; GSPO ratio s_i = exp(mean_t log(π_θ/π_prox)) per sequence
  (Zheng et al. 2025, "Group Sequence Policy Optimization"), broadcast to tokens in its GSPO-token
  form sg[s_i]·π_θ(y_t)/sg[π_θ(y_t)] so that seq-mean-token-mean aggregation gives GSPO's gradient.
- Clipped surrogate max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)) with optional dual-clip (Ye et al.
  2020): for A < 0 the loss is capped at −A·c (c > 1).
- Behaviour importance weights (decoupled PPO, off-policy correction behaviour → proximal),
  detached: per token min(exp(prox − behav), cap) (TIS); per sequence exp of the mean (geometric
  mean) or sum (product) of the token log ratios, truncated at `high` or used to mask whole
  sequences outside [low, high].
"""

from __future__ import annotations

import torch

from arl.trainer.algorithm_config import SeqISAgg
from arl.trainer.errors import AlgorithmError
from arl.trainer.segments import seq_mean, seq_sum


def ppo_ratio(logp: torch.Tensor, proximal_logp: torch.Tensor) -> torch.Tensor:
    """Token ratio π_θ/π_prox = exp(logp − proximal_logp); differentiable in logp."""
    return torch.exp(logp - proximal_logp.detach())


def gspo_log_ratio(
    logp: torch.Tensor, proximal_logp: torch.Tensor, seq_index: torch.Tensor, num_seqs: int
) -> torch.Tensor:
    """Per-sequence log s_i = mean over the sequence's tokens of (logp − proximal_logp) -> (S,), detached."""
    return seq_mean((logp - proximal_logp).detach(), seq_index, num_seqs)


def gspo_ratio(
    logp: torch.Tensor, proximal_logp: torch.Tensor, seq_index: torch.Tensor, num_seqs: int
) -> torch.Tensor:
    """GSPO-token ratio (N,): value s_i of the token's sequence, gradient s_i·∇log π_θ(y_t).

    Averaged over a sequence's tokens, the gradient is s_i · mean_t ∇log π_θ(y_t) = ∇s_i, GSPO's
    sequence-level gradient; so with seq-mean-token-mean aggregation this is exactly GSPO.
    """
    log_s = gspo_log_ratio(logp, proximal_logp, seq_index, num_seqs)[seq_index]
    return torch.exp(log_s + logp - logp.detach())


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    dual_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's pessimistic clipped loss per token, with optional dual-clip for negative advantages.

    loss = max(−A·r, −A·clip(r, 1 − low, 1 + high)); with dual-clip, where A < 0 the loss is
    min(loss, −A·c), which bounds how far a very large ratio can push a bad token down.
    Returns (loss, ratio_outside_clip_range, dual_clip_active), the masks as bools.
    """
    clipped = ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    loss = torch.maximum(-advantages * ratio, -advantages * clipped)
    outside = (ratio - clipped).abs() > 0
    if dual_clip_c is None:
        return loss, outside, torch.zeros_like(outside)
    if dual_clip_c <= 1.0:
        raise AlgorithmError(f"dual_clip_c must be > 1, got {dual_clip_c}")
    cap = -advantages * dual_clip_c
    negative = advantages < 0
    dual_active = negative & (loss > cap)
    loss = torch.where(negative, torch.minimum(loss, cap), loss)
    return loss, outside, dual_active


def clip_active(
    ratio: torch.Tensor, advantages: torch.Tensor, *, clip_ratio_low: float, clip_ratio_high: float
) -> torch.Tensor:
    """Tokens where PPO's clipped branch is the one taken (bool): −A·clip(r) > −A·r, before dual-clip.

    This is the usual `clip_frac` (its gradient is cut by the clip): a ratio outside the band counts
    only when the clip binds in the pessimistic direction (r > 1 + high with A > 0, r < 1 − low with
    A < 0) and never with A = 0. The band-outside count, whatever the advantage's sign, is
    `clipped_surrogate`'s second output (metric `clip_band_frac`).
    """
    clipped = ratio.detach().clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    return -advantages * clipped > -advantages * ratio.detach()


def token_is_weight(
    proximal_logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated behaviour→proximal weight min(exp(prox − behav), cap) per token (detached).

    cap=None leaves the weight untruncated. Returns (weight, truncated) with `truncated` a bool mask.
    """
    raw = torch.exp((proximal_logp - behaviour_logp).detach())
    if cap is None:
        return raw, torch.zeros_like(raw, dtype=torch.bool)
    return raw.clamp(max=cap), raw > cap


def sequence_log_is_weight(
    proximal_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    seq_index: torch.Tensor,
    num_seqs: int,
    agg: SeqISAgg = "geo_mean",
) -> torch.Tensor:
    """log of each sequence's behaviour→proximal weight -> (S,), detached.

    geo_mean: mean_t (prox − behav) (length-normalised, the geometric mean of token ratios);
    product: Σ_t (prox − behav) (the exact sequence likelihood ratio; explodes on long sequences).
    """
    delta = (proximal_logp - behaviour_logp).detach()
    if agg == "geo_mean":
        return seq_mean(delta, seq_index, num_seqs)
    if agg == "product":
        return seq_sum(delta, seq_index, num_seqs)
    raise AlgorithmError(f"unknown sequence IS aggregation {agg!r}; expected geo_mean or product")


def sequence_truncated_weight(log_w: torch.Tensor, high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """min(exp(log_w), high) per sequence; returns (weight (S,), truncated (S,) bool)."""
    # Compare in log space: exp of a product-weight can overflow to inf.
    log_high = torch.log(torch.tensor(high, dtype=log_w.dtype, device=log_w.device))
    truncated = log_w > log_high
    return torch.exp(torch.minimum(log_w, log_high)), truncated


def sequence_mask(log_w: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Keep (True) the sequences whose weight exp(log_w) lies in [low, high] -> (S,) bool."""
    if not 0.0 <= low <= high:
        raise AlgorithmError(f"sequence IS bounds must satisfy 0 <= low <= high, got low={low}, high={high}")
    lo = float("-inf") if low == 0.0 else torch.log(torch.tensor(low, dtype=torch.float64)).item()
    hi = torch.log(torch.tensor(high, dtype=torch.float64)).item()
    return (log_w >= lo) & (log_w <= hi)


def entropy_bonus(entropy: torch.Tensor, coef: float) -> torch.Tensor:
    """Per-token loss term −coef·H_t (adding it rewards higher entropy)."""
    return -coef * entropy
