"""The concurrency funnel of the reference design, computed in one place.

required      = require_batches × ppo_mini_batch_size          (samples one trainer step consumes)
max_required  = required × (staleness_threshold + 1) × trigger_parameter_sync_step
                                                              (samples the rollouter may produce per sync)
max_concurrent = min(replicas × per_replica, max_required)    (prompts generating at once)
max_queue     = max_required                                  (queue bound)
A "sample" is one prompt with its n responses.
"""

from __future__ import annotations

import msgspec


class Budget(msgspec.Struct, frozen=True, kw_only=True):
    required: int
    max_required: int
    max_concurrent: int
    max_queue: int


def compute_budget(
    *,
    require_batches: int,
    ppo_mini_batch_size: int,
    staleness_threshold: float,
    trigger_parameter_sync_step: int,
    replicas: int,
    per_replica: int,
) -> Budget:
    """Apply the reference formulas; arguments are validated so a bad config fails by name."""
    for name, value in (
        ("async_training.require_batches", require_batches),
        ("actor.ppo_mini_batch_size", ppo_mini_batch_size),
        ("async_training.trigger_parameter_sync_step", trigger_parameter_sync_step),
        ("rollout.replicas", replicas),
        ("rollout.max_concurrent_per_replica", per_replica),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if staleness_threshold < 0:
        raise ValueError(f"async_training.staleness_threshold must be >= 0, got {staleness_threshold}")
    required = require_batches * ppo_mini_batch_size
    max_required = int(required * (staleness_threshold + 1) * trigger_parameter_sync_step)
    return Budget(
        required=required,
        max_required=max_required,
        max_concurrent=min(replicas * per_replica, max_required),
        max_queue=max_required,
    )
