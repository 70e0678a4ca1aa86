"""The one function that turns an `AlgorithmConfig` into a per-token loss for one micro-batch.

`compute_token_loss` composes the pure functions of `losses` and `kl` over a micro-batch's flat loss
tokens. The trainer aggregates that per-token loss (token-mean, seq-mean-token-mean, ...) with global
denominators; `advantages`, `proximal`, `dynamic_sampling` and `schedule` serve the other knobs.
"""

from __future__ import annotations

import torch

from arl.trainer.algorithm_config import AlgorithmConfig
from arl.trainer.errors import AlgorithmError
from arl.trainer.losses import (
    clip_active,
    clipped_surrogate,
    entropy_bonus,
    gspo_ratio,
    ppo_ratio,
    sequence_log_is_weight,
    sequence_mask,
    sequence_truncated_weight,
    token_is_weight,
)
from arl.trainer.segments import check_flat, resolve_num_seqs, seq_count

# Metrics of compute_token_loss that are counts (sum them over micro-batches); the others are token means.
COUNT_METRICS = frozenset({"num_tokens", "num_seqs", "seq_is_truncated_count", "seq_is_masked_count"})


def sequence_keep_rows(
    cfg: AlgorithmConfig, proximal_logp: torch.Tensor, behaviour_logp: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor | None:
    """(B,) bool: the rows (sequences) that seq_is = "mask" keeps, decided exactly as compute_token_loss
    decides them; None when nothing is masked (seq_is is not "mask"). Inputs are (B, T), the loss mask
    1 on trained tokens. With seq_is_mask_denominator = "remove", the trainer multiplies the loss mask
    by this before counting the denominators, so dropped sequences leave them."""
    if cfg.seq_is != "mask":
        return None
    rows, cols = (loss_mask > 0).nonzero(as_tuple=True)
    b = loss_mask.shape[0]
    dtype = torch.promote_types(proximal_logp.dtype, torch.float32)
    log_w = sequence_log_is_weight(
        proximal_logp[rows, cols].to(dtype), behaviour_logp[rows, cols].to(dtype), rows, b, cfg.seq_is_agg
    )
    return sequence_mask(log_w, cfg.seq_is_low, cfg.seq_is_high)


def compute_token_loss(
    cfg: AlgorithmConfig,
    logp: torch.Tensor,
    proximal_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    seq_index: torch.Tensor,
    *,
    entropy: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    num_seqs: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token loss (N,) of one micro-batch and its detached metrics.

    Inputs are flat over the N loss tokens: `logp` (current policy, differentiable), `proximal_logp`
    and `behaviour_logp` (constants), `advantages` (each token carries its response's advantage),
    `seq_index` (local sequence 0..S-1 of each token; sequences must be whole in the micro-batch),
    optional `entropy` (per-token entropy of the current policy) and `ref_logp` (reference policy).
    `num_seqs` (S) avoids a host sync when given.

    loss_t = w_t · max(−A·r_t, −A·clip(r_t)) [dual-clipped] − entropy_coef·H_t + kl_coef·KL_t, where
    w_t is the behaviour→proximal weight and r_t the PPO or GSPO ratio; with seq_is = "mask" a
    dropped sequence's tokens are 0 in every term. The per-token values are aggregated by the trainer.

    Metrics: `num_tokens`, `num_seqs`, `seq_is_truncated_count`, `seq_is_masked_count` are counts
    (sum them over micro-batches); the rest are means over this micro-batch's tokens (average them
    weighted by num_tokens): pg_loss, clip_frac (tokens whose clipped branch is taken: the gradient is
    cut), clip_band_frac (tokens whose ratio is outside [1 − low, 1 + high], any advantage sign),
    dual_clip_frac, tis_clip_frac, is_weight_mean,
    ratio_mean, ppo_kl (mean of log π_prox − log π_θ), and entropy / kl when those inputs are given.
    """
    check_flat(
        seq_index,
        ("logp", logp),
        ("proximal_logp", proximal_logp),
        ("behaviour_logp", behaviour_logp),
        ("advantages", advantages),
        ("entropy", entropy),
        ("ref_logp", ref_logp),
    )
    if cfg.entropy_coef > 0 and entropy is None:
        raise AlgorithmError("entropy_coef > 0 needs the per-token entropy")
    if cfg.kl_coef > 0 and cfg.kl_in == "loss" and ref_logp is None:
        raise AlgorithmError("kl_coef > 0 with kl_in = 'loss' needs ref_logp (reference policy log probs)")
    s = resolve_num_seqs(seq_index, num_seqs)
    # Ratios and exp() in at least fp32: bf16 log probs would put ~1% noise on every ratio.
    dtype = torch.promote_types(logp.dtype, torch.float32)
    logp = logp.to(dtype)
    proximal_logp = proximal_logp.detach().to(dtype)
    behaviour_logp = behaviour_logp.detach().to(dtype)
    advantages = advantages.detach().to(dtype)
    entropy = entropy.to(dtype) if entropy is not None else None
    ref_logp = ref_logp.detach().to(dtype) if ref_logp is not None else None

    if cfg.policy_loss == "ppo":
        ratio = ppo_ratio(logp, proximal_logp)
    elif cfg.policy_loss == "gspo":
        ratio = gspo_ratio(logp, proximal_logp, seq_index, s)
    else:
        raise AlgorithmError(f"unknown policy_loss {cfg.policy_loss!r}; expected ppo or gspo")
    pg, outside, dual_active = clipped_surrogate(
        ratio,
        advantages,
        clip_ratio_low=cfg.clip_ratio_low,
        clip_ratio_high=cfg.clip_ratio_high,
        dual_clip_c=cfg.dual_clip_c,
    )
    clipped_branch = clip_active(
        ratio, advantages, clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high
    )

    zero_seqs = torch.zeros(s, dtype=torch.bool, device=seq_index.device)
    seq_truncated, seq_masked = zero_seqs, zero_seqs
    keep: torch.Tensor | None = None
    if cfg.seq_is == "truncate":
        log_w = sequence_log_is_weight(proximal_logp, behaviour_logp, seq_index, s, cfg.seq_is_agg)
        w_seq, seq_truncated = sequence_truncated_weight(log_w, cfg.seq_is_high)
        weight = w_seq[seq_index]
        tis_truncated = torch.zeros_like(outside)
    else:
        weight, tis_truncated = token_is_weight(proximal_logp, behaviour_logp, cfg.tis_cap)
        if cfg.seq_is == "mask":
            log_w = sequence_log_is_weight(proximal_logp, behaviour_logp, seq_index, s, cfg.seq_is_agg)
            keep_seq = sequence_mask(log_w, cfg.seq_is_low, cfg.seq_is_high)
            seq_masked = ~keep_seq
            keep = keep_seq[seq_index].to(weight.dtype)
            weight = weight * keep
        elif cfg.seq_is != "off":
            raise AlgorithmError(f"unknown seq_is {cfg.seq_is!r}; expected off, truncate or mask")

    pg_weighted = pg * weight
    loss = pg_weighted
    kl = cfg.kl(logp, ref_logp) if ref_logp is not None else None
    if cfg.entropy_coef > 0 and entropy is not None:  # checked above: entropy is given
        bonus = entropy_bonus(entropy, cfg.entropy_coef)
        loss = loss + (bonus if keep is None else bonus * keep)
    if cfg.kl_coef > 0 and cfg.kl_in == "loss" and kl is not None:  # checked above: ref_logp is given
        term = cfg.kl_coef * kl
        loss = loss + (term if keep is None else term * keep)

    with torch.no_grad():
        n = seq_index.shape[0]
        present = seq_count(seq_index, s) > 0
        # Counts first, then sums that become token means; one device→host copy for all of them.
        counts = {
            "num_seqs": present.sum(),
            "seq_is_truncated_count": (seq_truncated & present).sum(),
            "seq_is_masked_count": (seq_masked & present).sum(),
        }
        sums = {
            "pg_loss": pg_weighted.detach().sum(),
            "clip_frac": clipped_branch.sum(),
            "clip_band_frac": outside.sum(),
            "dual_clip_frac": dual_active.sum(),
            "tis_clip_frac": tis_truncated.sum(),
            "is_weight_mean": weight.sum(),
            "ratio_mean": ratio.detach().sum(),
            "ppo_kl": (proximal_logp - logp.detach()).sum(),
        }
        if entropy is not None:
            sums["entropy"] = entropy.detach().sum()
        if kl is not None:
            sums["kl"] = kl.detach().sum()
        values = torch.stack([v.to(torch.float64) for v in (*counts.values(), *sums.values())]).tolist()
    metrics = {"num_tokens": float(n)}
    metrics.update(zip(counts, values[: len(counts)], strict=True))
    metrics.update((k, v / max(n, 1)) for k, v in zip(sums, values[len(counts) :], strict=True))
    return loss, metrics


def merge_loss_metrics(per_micro_batch: list[dict[str, float]]) -> dict[str, float]:
    """Combine compute_token_loss metrics of several micro-batches (or ranks' merged metrics).

    Counts are summed; token means are averaged weighted by each micro-batch's `num_tokens`, over
    the micro-batches that report the key (entropy/kl appear only where their inputs were given).
    """
    out: dict[str, float] = {}
    weights: dict[str, float] = {}
    for m in per_micro_batch:
        n = m.get("num_tokens", 0.0)
        for key, value in m.items():
            if key in COUNT_METRICS:
                out[key] = out.get(key, 0.0) + value
            else:
                out[key] = out.get(key, 0.0) + value * n
                weights[key] = weights.get(key, 0.0) + n
    for key, w in weights.items():
        out[key] = out[key] / w if w > 0 else 0.0
    return out
