"""arl-trainer: the consumer side of arl's fully asynchronous RL.

Batch assembly from queue samples, GRPO advantages, decoupled-PPO loss with truncated importance
weights, packed micro-batched training (varlen attention, chunked log-prob head, bf16 mixed
precision) on one device (`HFPolicy`) or sharded with FSDP2 (`arl.trainer.fsdp.FSDPPolicy`),
checkpoints, and weight publishing through arl-sync.
"""

from arl.trainer.algorithms import grpo_advantages, policy_loss, token_log_probs
from arl.trainer.backend import HFPolicy
from arl.trainer.batch import TrainBatch, assemble_batch
from arl.trainer.config import OptimConfig, TrainerConfig
from arl.trainer.engine import PackedPolicy
from arl.trainer.publisher import RolloutControl, WeightPublisher
from arl.trainer.trainer import SampleSource, Trainer

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
