"""arl-trainer: the consumer side of arl's fully asynchronous RL.

Batch assembly from queue samples, GRPO advantages, decoupled-PPO loss with truncated importance
weights, packed micro-batched training (varlen attention, chunked log-prob head, bf16 mixed
precision) on one device (`HFPolicy`) or sharded with FSDP2 (`arl.trainer.fsdp.FSDPPolicy`),
checkpoints, and weight publishing through arl-sync.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Loaded on first use, so that the light modules (`config`, `algorithm_config`, `errors`) import without
# torch: a run's configuration is read and checked in processes that never train.
_EXPORTS = {
    "grpo_advantages": "algorithms",
    "policy_loss": "algorithms",
    "token_log_probs": "algorithms",
    "HFPolicy": "backend",
    "TrainBatch": "batch",
    "assemble_batch": "batch",
    "OptimConfig": "config",
    "TrainerConfig": "config",
    "PackedPolicy": "engine",
    "RolloutControl": "publisher",
    "WeightPublisher": "publisher",
    "SampleSource": "trainer",
    "Trainer": "trainer",
}

__all__ = [
    "HFPolicy",
    "OptimConfig",
    "PackedPolicy",
    "RolloutControl",
    "SampleSource",
    "TrainBatch",
    "Trainer",
    "TrainerConfig",
    "WeightPublisher",
    "assemble_batch",
    "grpo_advantages",
    "policy_loss",
    "token_log_probs",
]

if TYPE_CHECKING:
    from arl.trainer.algorithms import grpo_advantages, policy_loss, token_log_probs
    from arl.trainer.backend import HFPolicy
    from arl.trainer.batch import TrainBatch, assemble_batch
    from arl.trainer.config import OptimConfig, TrainerConfig
    from arl.trainer.engine import PackedPolicy
    from arl.trainer.publisher import RolloutControl, WeightPublisher
    from arl.trainer.trainer import SampleSource, Trainer


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'arl.trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"arl.trainer.{module}"), name)
    globals()[name] = value
    return value
