"""The RL algorithm as configuration: `AlgorithmConfig` names every algorithmic choice.

Policy loss, clipping, off-policy corrections, KL, entropy, advantages, dynamic sampling, LR schedule,
proximal policy. This module does not import torch, so a run's configuration is read and checked
without it; `token_loss.compute_token_loss` turns the config into a per-token loss.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import msgspec

from arl.trainer.errors import AlgorithmError

if TYPE_CHECKING:
    import torch

# The named choices (the modules that implement them import these names).
AdvantageEstimator = Literal["grpo", "dr_grpo", "rloo"]
KLEstimator = Literal["k1", "k2", "k3", "low_var_kl"]
SeqISAgg = Literal["geo_mean", "product"]
ProximalMode = Literal["auto", "recompute", "bypass", "reuse", "loglinear"]

# Conventions where the literature has two forms are explicit fields below; which default and why
# (with the measured runs): docs/design/loss-conventions.md.


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
    # (AReaL's interpolation between behaviour and current log probs by per-token weight versions),
    # "auto" (reuse in a step of one optimizer update, where it equals recompute without its forward
    # pass; recompute otherwise: see `resolve_proximal_mode`).
    proximal_mode: ProximalMode = "auto"

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

    def resolve_proximal_mode(self, updates: int) -> ProximalMode:
        """The proximal mode a step of `updates` optimizer updates runs: "auto" becomes "reuse" where
        that is exact and "recompute" elsewhere; any other mode is itself.

        With one update every micro-batch's forward runs on the step's starting weights, so its detached
        log probs are the recomputed ones and the no-grad pass is saved. Recompute stays where the
        proximal log probs are needed before the update: more than one update (later ones run on moved
        weights), seq_is = "mask" with "remove" (its denominators) and KL in the reward (its penalty)."""
        if self.proximal_mode != "auto":
            return self.proximal_mode
        needed_before = (self.seq_is == "mask" and self.seq_is_mask_denominator == "remove") or (
            self.needs_ref_logp and self.kl_in == "reward"
        )
        return "reuse" if updates == 1 and not needed_before else "recompute"

    def resolve_norm_len(self, budget: int | None) -> int | None:
        """seq-mean-token-sum-norm's constant L given the generation budget (TrainerConfig.loss_agg_norm_len);
        None = the mini-batch's longest response (`loss_agg.Denominators.from_loss_mask`)."""
        if self.norm_len_mode == "batch_max":
            return None
        return self.norm_len if self.norm_len is not None else budget

    def kl(self, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        """Per-token KL by this config's estimator and clamps."""
        from arl.trainer.kl import kl_estimate

        return kl_estimate(
            self.kl_estimator,
            logp,
            ref_logp,
            log_ratio_clamp=self.kl_log_ratio_clamp,
            value_clamp=self.kl_value_clamp,
        )
