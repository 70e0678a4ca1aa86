"""Trainer configuration (msgspec; loaded from TOML by the app, each field documented)."""

from __future__ import annotations

from typing import Literal

import msgspec


class OptimConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0


class TrainerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How the trainer turns samples into updates."""

    # Prompts (samples) per optimizer step; a step of `required` samples makes required/ppo_mini_batch_size updates.
    ppo_mini_batch_size: int = 8
    # Mini-batches per trainer step (reference: async_training.require_batches).
    require_batches: int = 1
    # Updates between weight syncs to the rollout side.
    trigger_parameter_sync_step: int = 1
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    # Cap of the behaviour→proximal importance weight (truncated IS).
    tis_cap: float = 2.0
    # GRPO: divide centered rewards by the group's std.
    norm_adv_by_std: bool = True
    # Sampling temperature of the rollout (logits are divided by it before log probs).
    temperature: float = 1.0
    # Hard bound on (current version − oldest token version) per sample; None = no bound.
    max_version_lag: int | None = None
    # What to do with a sample over the bound: drop it (counted in metrics) or train on it anyway (counted).
    on_version_lag: Literal["drop", "keep"] = "drop"
    # Seconds to wait for a batch before declaring the rollout side stuck.
    batch_timeout_s: float = 600.0
    # MoE models: "rollout" replays the experts the engine chose for each sampled token
    # (arl.trainer.router_replay); "off" routes again (the mismatch is still measured when routes exist).
    router_replay: Literal["off", "rollout"] = "off"
    optim: OptimConfig = msgspec.field(default_factory=OptimConfig)
