"""The RL algorithm as configuration, and the one function that turns it into a per-token loss.

`AlgorithmConfig` names every algorithmic choice (policy loss, clipping, off-policy corrections, KL,
entropy, advantages, dynamic sampling, LR schedule, proximal policy); `compute_token_loss` composes
the pure functions of `losses`, `kl` into a per-token loss for one micro-batch's flat loss tokens.
The trainer aggregates that per-token loss (token-mean, seq-mean-token-mean, ...) with global
denominators; `advantages`, `proximal`, `dynamic_sampling` and `schedule` serve the other knobs.
"""

from __future__ import annotations

from typing import Literal

import msgspec
import torch

from arl.trainer.advantages import AdvantageEstimator
from arl.trainer.errors import AlgorithmError
from arl.trainer.kl import KLEstimator, kl_estimate
from arl.trainer.losses import (
    SeqISAgg,
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
from arl.trainer.proximal import ProximalMode
from arl.trainer.segments import check_flat, resolve_num_seqs, seq_count

# Conventions where the literature has two forms are explicit fields below; which default and why
# (with the measured runs): docs/design/loss-conventions.md.


# Metrics of compute_token_loss that are counts (sum them over micro-batches); the others are token means.
COUNT_METRICS = frozenset({"num_tokens", "num_seqs", "seq_is_truncated_count", "seq_is_masked_count"})


class AlgorithmConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The policy-optimisation algorithm. Defaults are today's arl: GRPO + decoupled PPO with token TIS."""

    # "ppo": token-level ratio π_θ/π_prox, clipped per token (decoupled PPO).
    # "gspo": sequence-level ratio (geometric mean of token ratios), clipped per sequence (GSPO);
    # exact GSPO with actor.loss_agg_mode = seq-mean-token-mean; GSPO's paper uses clip ratios ~3e-4/4e-4.
    policy_loss: Literal["ppo", "gspo"] = "ppo"
    # Lower clip: the ratio is clipped at 1 − clip_ratio_low.
    clip_ratio_low: float = 0.2
    # Upper clip: the ratio is clipped at 1 + clip_ratio_high (DAPO's clip-higher when > clip_ratio_low).
    clip_ratio_high: float = 0.28
    # Dual-clip constant c > 1: for negative advantages the loss is capped at −A·c. None = off.
    dual_clip_c: float | None = None
    # Cap of the per-token behaviour→proximal importance weight min(exp(prox − behav), cap) (TIS).
    # None = untruncated. Not used when seq_is = "truncate" (the sequence weight replaces it).
    tis_cap: float | None = 2.0
    # Sequence-level off-policy correction from the behaviour→proximal ratios of a sequence's tokens:
    # "off": token TIS only; "truncate": one weight per sequence, min(W, seq_is_high), replaces the
    # token weight; "mask": token TIS, and sequences with W outside [seq_is_low, seq_is_high] are
    # dropped from the loss (their tokens contribute 0, counted in metrics as seq_is_masked_count).
    seq_is: Literal["off", "truncate", "mask"] = "off"
    # seq_is = "mask": whether a dropped sequence also leaves the loss denominators (token-mean's token
    # count, seq-mean's sequence count): "remove" (the common convention: the step is the mean over the
    # kept sequences) or "keep" (arl before issue #29: dropped sequences count as zeros, so every drop
    # shrinks the step). "remove" needs the proximal log probs before the update, so it does not
    # combine with proximal_mode "reuse" / "loglinear" (rejected).
    seq_is_mask_denominator: Literal["remove", "keep"] = "remove"
    # How a sequence's weight W combines its token ratios: "geo_mean" (exp of the mean log ratio,
    # length-normalised) or "product" (exp of the sum: the exact sequence ratio, huge on long sequences).
    seq_is_agg: SeqISAgg = "geo_mean"
    # Lower bound of W for seq_is = "mask" (0 = no lower bound).
    seq_is_low: float = 0.5
    # Upper bound of W: the truncation cap for "truncate", the mask's upper bound for "mask".
    seq_is_high: float = 2.0
    # Weight of the KL(π_θ ‖ π_ref) penalty to a reference policy; 0 = no KL (no reference forward needed).
    kl_coef: float = 0.0
    # KL estimator per token: "k1" (log ratio), "k2" (½ log ratio²), "k3" (r − 1 − log r, ≥ 0),
    # "low_var_kl" (clamped k3).
    # Default "low_var_kl", chosen by measurement (docs/design/loss-conventions.md): with two updates per
    # step on stale samples raw k3 spiked (gradient norm 226× and 517× the median in 2 of 6 runs), and it
    # bought little KL for the reward it gave up.
    kl_estimator: KLEstimator = "low_var_kl"
    # Clamps of "low_var_kl" (clamped k3): log r = log π_ref − log π to ±kl_log_ratio_clamp, the value to
    # ±kl_value_clamp; a clamped token carries no KL gradient. "k3" is the same estimator unclamped.
    kl_log_ratio_clamp: float = 20.0
    kl_value_clamp: float = 10.0
    # Where the KL goes: "loss" adds kl_coef·KL_t to each token's loss; "reward" subtracts
    # kl_coef·Σ_t KL_t from the response's reward before advantages (advantages.kl_penalized_rewards).
    kl_in: Literal["loss", "reward"] = "loss"
    # Entropy bonus: the loss gets −entropy_coef·H_t per token (entropy is always a metric when given). 0 = off.
    entropy_coef: float = 0.0
    # loss_agg_mode = seq-mean-token-sum-norm (Dr. GRPO): the normaliser of Σ_tokens loss / (seqs × L).
    # "constant": L = norm_len, else TrainerConfig.loss_agg_norm_len (the generation budget, the
    # rollout's max_tokens, when the app passes it), else (neither given) the batch's longest response;
    # "batch_max": L = each mini-batch's longest response (arl before issue #29), whatever is given.
    norm_len_mode: Literal["constant", "batch_max"] = "constant"
    # The constant L for norm_len_mode = "constant" (None: TrainerConfig.loss_agg_norm_len).
    norm_len: int | None = None
    # Advantages from outcome rewards per group: "grpo" (mean/std), "dr_grpo" (mean only), "rloo" (leave-one-out).
    advantage_estimator: AdvantageEstimator = "grpo"
    # DAPO dynamic sampling: drop groups whose responses all have the same reward (zero advantage), counted.
    dynamic_sampling: bool = False
    # LR warmup: the LR ramps linearly over this many optimizer updates ((step + 1) / warmup_steps).
    lr_warmup_steps: int = 0
    # LR after warmup: "constant" or "cosine" decay to lr_min_ratio × lr over lr_decay_steps updates.
    lr_schedule: Literal["constant", "cosine"] = "constant"
    # Floor of the cosine decay as a fraction of the peak LR.
    lr_min_ratio: float = 0.0
    # Updates (after warmup) over which the cosine decays; required for "cosine"; the LR stays at the floor after.
    lr_decay_steps: int | None = None
    # Proximal policy of decoupled PPO: "recompute" (forward pass at the step's start), "bypass"
    # (the rollout's log probs), "reuse" (the first update's own detached log probs), "loglinear"
    # (AReaL's interpolation between behaviour and current log probs by per-token weight versions).
    proximal_mode: ProximalMode = "recompute"

    def __post_init__(self) -> None:
        if self.clip_ratio_low < 0 or self.clip_ratio_high < 0 or self.clip_ratio_low >= 1:
            raise AlgorithmError(
                f"clip ratios must satisfy 0 <= clip_ratio_low < 1 and clip_ratio_high >= 0, "
                f"got {self.clip_ratio_low}, {self.clip_ratio_high}"
            )
        if self.dual_clip_c is not None and self.dual_clip_c <= 1.0:
            raise AlgorithmError(f"dual_clip_c must be > 1 (or None), got {self.dual_clip_c}")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise AlgorithmError(f"tis_cap must be > 0 (or None), got {self.tis_cap}")
        if not 0.0 <= self.seq_is_low <= self.seq_is_high or self.seq_is_high <= 0:
            raise AlgorithmError(
                f"need 0 <= seq_is_low <= seq_is_high and seq_is_high > 0, got {self.seq_is_low}, {self.seq_is_high}"
            )
        if self.kl_log_ratio_clamp <= 0 or self.kl_value_clamp <= 0:
            raise AlgorithmError(
                "kl_log_ratio_clamp and kl_value_clamp must be > 0, "
                f"got {self.kl_log_ratio_clamp}, {self.kl_value_clamp}"
            )
        if self.norm_len is not None and self.norm_len <= 0:
            raise AlgorithmError(f"norm_len must be > 0 (or None), got {self.norm_len}")
        if (
            self.seq_is == "mask"
            and self.seq_is_mask_denominator == "remove"
            and self.proximal_mode in ("reuse", "loglinear")
        ):
            raise AlgorithmError(
                f"seq_is = 'mask' with seq_is_mask_denominator = 'remove' needs the proximal log probs before the "
                f"update; proximal_mode = {self.proximal_mode!r} makes them during it: use seq_is_mask_denominator = "
                f"'keep' or proximal_mode 'recompute' / 'bypass'"
            )
        if self.kl_coef < 0 or self.entropy_coef < 0:
            raise AlgorithmError(
                f"kl_coef and entropy_coef must be >= 0, got {self.kl_coef}, {self.entropy_coef}"
            )
        if self.lr_warmup_steps < 0:
            raise AlgorithmError(f"lr_warmup_steps must be >= 0, got {self.lr_warmup_steps}")
        if not 0.0 <= self.lr_min_ratio <= 1.0:
            raise AlgorithmError(f"lr_min_ratio must be in [0, 1], got {self.lr_min_ratio}")
        if self.lr_schedule == "cosine" and (self.lr_decay_steps is None or self.lr_decay_steps <= 0):
            raise AlgorithmError(
                "lr_schedule = 'cosine' needs lr_decay_steps > 0 (updates over which to decay)"
            )

    @property
    def needs_ref_logp(self) -> bool:
        """Whether the trainer must compute reference-policy log probs."""
        return self.kl_coef > 0

    def resolve_norm_len(self, budget: int | None) -> int | None:
        """seq-mean-token-sum-norm's constant L given the generation budget (TrainerConfig.loss_agg_norm_len);
        None = the mini-batch's longest response (`loss_agg.Denominators.from_loss_mask`)."""
        if self.norm_len_mode == "batch_max":
            return None
        return self.norm_len if self.norm_len is not None else budget

    def kl(self, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        """Per-token KL by this config's estimator and clamps."""
        return kl_estimate(
            self.kl_estimator,
            logp,
            ref_logp,
            log_ratio_clamp=self.kl_log_ratio_clamp,
            value_clamp=self.kl_value_clamp,
        )


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
