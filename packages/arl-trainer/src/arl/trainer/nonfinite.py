"""What an update does when its gradient is NaN or inf: skip it, and stop a run that keeps producing them.

One optimizer step on a non-finite gradient norm makes every weight NaN (the clip scales each gradient
by max_norm / NaN), the next sync sends those weights to every replica, and the run goes on generating
and "training" at full speed on nothing: the step times look normal and only the loss says otherwise.
So an update whose global gradient norm is not finite is skipped (its gradients dropped, the weights
and the optimizer state left as they were), as verl and Megatron do; a few in a row (a bad batch, a
loss spike) are survivable. More than `max_consecutive` in a row means the cause is not one batch
(a broken kernel, corrupted memory, a diverged model), and the step raises `NonFiniteGradientError`
instead of skipping forever.
"""

from __future__ import annotations

import math

from arl.trainer.errors import NonFiniteGradientError


class NonFiniteGuard:
    """Decides, update by update, whether the optimizer may step on this gradient."""

    def __init__(self, max_consecutive: int) -> None:
        if max_consecutive < 0:
            raise ValueError(f"max_consecutive must be >= 0, got {max_consecutive}")
        self.max_consecutive = max_consecutive
        #: Updates skipped so far in this policy's life, and the current run of them.
        self.skipped_total = 0
        self.consecutive = 0
        self.updates = 0

    def admit(self, grad_norm: float, loss: float, version: float = 0.0) -> bool:
        """True when the optimizer may step on a gradient of norm `grad_norm`; False to skip the update.
        Raises `NonFiniteGradientError` when this update would be one skip more than `max_consecutive`."""
        self.updates += 1
        if math.isfinite(grad_norm):
            self.consecutive = 0
            return True
        self.consecutive += 1
        self.skipped_total += 1
        if self.consecutive > self.max_consecutive:
            raise NonFiniteGradientError(
                f"the gradient norm was {grad_norm} (loss {loss}) in {self.consecutive} updates in a row, "
                f"the last one the policy's update {self.updates} at weight version {version:g}; each was "
                f"skipped, the weights are those before the first of them. One in a row is a bad batch; "
                f"this many is a broken step (kernels, memory, mixed precision, a diverged model). "
                f"actor.optim.max_nonfinite_skips = {self.max_consecutive} sets how many are skipped."
            )
        return False
