"""Learning-rate schedule: linear warmup, then constant or cosine decay to a floor.

`lr_factor(step, ...)` is the multiplier of the peak LR for the update with 0-based index `step`;
`WarmupCosine` is the same as a picklable callable whose state (its parameters) travels in
`LambdaLR.state_dict()`; `make_lr_scheduler` builds the `LambdaLR` from an `AlgorithmConfig`.

Shape: during warmup (step < W) the factor is (step + 1) / W, so the first update already moves
and update W − 1 runs at the peak; after warmup, cosine decays from 1 at step W to `min_ratio` at
step W + D and stays there; "constant" stays at 1.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import torch

from arl.trainer.errors import AlgorithmError

if TYPE_CHECKING:
    from arl.trainer.algorithm_config import AlgorithmConfig


def lr_factor(
    step: int,
    *,
    warmup_steps: int = 0,
    schedule: Literal["constant", "cosine"] = "constant",
    decay_steps: int | None = None,
    min_ratio: float = 0.0,
) -> float:
    """Multiplier of the peak LR at update `step` (0-based)."""
    if step < 0:
        raise AlgorithmError(f"step must be >= 0, got {step}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise AlgorithmError(f"unknown lr schedule {schedule!r}; expected constant or cosine")
    if decay_steps is None or decay_steps <= 0:
        raise AlgorithmError("cosine schedule needs decay_steps > 0")
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class WarmupCosine:
    """`lr_factor` with fixed parameters, as an object so LambdaLR saves and restores it."""

    def __init__(
        self,
        warmup_steps: int = 0,
        schedule: Literal["constant", "cosine"] = "constant",
        decay_steps: int | None = None,
        min_ratio: float = 0.0,
    ) -> None:
        self.warmup_steps = warmup_steps
        self.schedule = schedule
        self.decay_steps = decay_steps
        self.min_ratio = min_ratio
        lr_factor(0, **self._kwargs())  # validate now, not at the first step

    def _kwargs(self) -> dict[str, Any]:
        return {
            "warmup_steps": self.warmup_steps,
            "schedule": self.schedule,
            "decay_steps": self.decay_steps,
            "min_ratio": self.min_ratio,
        }

    def __call__(self, step: int) -> float:
        return lr_factor(step, **self._kwargs())


def make_lr_scheduler(
    optimizer: torch.optim.Optimizer, cfg: AlgorithmConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR over every param group; call `.step()` after each optimizer update.

    Its `state_dict()` holds the step count and the schedule's parameters; resume with
    `load_lr_scheduler_state` (or load the optimizer's state after building the scheduler: building
    it sets each group's LR to lr × factor(0)).
    """
    fn = WarmupCosine(cfg.lr_warmup_steps, cfg.lr_schedule, cfg.lr_decay_steps, cfg.lr_min_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=fn)


def load_lr_scheduler_state(scheduler: torch.optim.lr_scheduler.LambdaLR, state: dict[str, Any]) -> None:
    """Restore a scheduler's state and set its optimizer's LRs to the restored step's values.

    `LambdaLR.load_state_dict` alone restores the step count but leaves the optimizer's current LR
    as it was; this makes the next update use the resumed schedule whatever the load order was.
    """
    scheduler.load_state_dict(state)
    for group, base_lr, fn in zip(
        scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True
    ):
        group["lr"] = base_lr * fn(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
