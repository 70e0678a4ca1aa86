"""The packages' configs of a run, built from the app's sections (no field copied by hand).

Each builder takes the section fields the package declares (`borrow.pick`) and adds only what the
app derives: the values a section does not hold (a replica's seed, the trainer's batch timeout), and
the links between sections (the trainer takes its log probs at `rollout.temperature`; Dr. GRPO's
constant `loss_agg_norm_len` defaults to the generation budget `rollout.max_tokens`). Pure: nothing
starts, so validation builds them at load to run the packages' own checks.
"""

from __future__ import annotations

from typing import Any

from arl.rollout.budget import Budget, compute_budget
from arl.rollout.engines.torch_engine_config import TorchEngineConfig
from arl.rollout.engines.vllm_engine import VllmEngineConfig
from arl.sync import SyncConfig
from arl.trainer.config import TrainerConfig
from arl_train.borrow import pick
from arl_train.placement import layout_of
from arl_train.sections import AppConfig


def package_value(key: str, value: Any) -> Any:
    """A borrowed field's value as its package takes it, where the app spells it differently in TOML."""
    if key == "async_training.max_version_lag" and value == -1:
        return None  # -1: no bound (TOML has no null); other negatives go to the package, which refuses them
    return value


def run_budget(config: AppConfig) -> Budget:
    """The reference concurrency/staleness budget for this run's settings."""
    at = config.async_training
    return compute_budget(
        require_batches=at.require_batches,
        ppo_mini_batch_size=config.actor.ppo_mini_batch_size,
        staleness_threshold=at.staleness_threshold,
        trigger_parameter_sync_step=at.trigger_parameter_sync_step,
        replicas=config.rollout.replicas,
        per_replica=config.rollout.max_concurrent_per_replica,
    )


def trainer_config(config: AppConfig, batch_timeout_s: float | None = None) -> TrainerConfig:
    """arl-trainer's `TrainerConfig` of this run; `batch_timeout_s` is the run's derived batch wait
    (`arl_train.timeouts`; None: `trainer.batch_timeout_s` as set)."""
    actor, at = config.actor, config.async_training
    fields = pick(actor, TrainerConfig) | pick(at, TrainerConfig) | pick(config.trainer, TrainerConfig)
    fields |= {
        "temperature": config.rollout.temperature,  # the log probs of the tokens as they were sampled
        "max_version_lag": package_value("async_training.max_version_lag", at.max_version_lag),
        # Issue #29: Dr. GRPO's constant normaliser is the generation budget unless set.
        "loss_agg_norm_len": actor.loss_agg_norm_len
        if actor.loss_agg_norm_len is not None
        else config.rollout.max_tokens,
        # The state's way out overlaps the replicas' wake only where they sleep (colocated, time-sliced);
        # there the app settles it before their KV caches wake (ColocatedControl / TimeSlicedControl).
        "optimizer_offload_overlap": actor.optimizer_offload
        and actor.optimizer_offload_overlap
        and layout_of(config).sleeps,
    }
    if batch_timeout_s is not None:
        fields["batch_timeout_s"] = batch_timeout_s
    return TrainerConfig(**fields)


def engine_config(config: AppConfig, model_path: str, index: int, initial_version: int) -> tuple[str, Any]:
    """(engine kind, engine config) of replica `index`: what its `EngineActor` builds."""
    r = config.rollout
    own = {"model_path": model_path, "seed": config.seed + index, "initial_version": initial_version}
    if r.engine == "vllm":
        return "vllm", VllmEngineConfig(
            **pick(r, VllmEngineConfig)
            | own
            | {
                "engine_args": dict(r.engine_args),
                "tensor_parallel_size": config.resources.tensor_parallel_size if r.device == "cuda" else 1,
                # Synchronous colocated and time_sliced replicas sleep while the trainer trains.
                "enable_sleep_mode": layout_of(config).sleeps and r.device == "cuda",
            }
        )
    return "torch", TorchEngineConfig(**pick(r, TorchEngineConfig) | own)


def sync_config(config: AppConfig, world_size: int = 1) -> SyncConfig:
    """arl-sync's `SyncConfig` of the trainer's sender(s) (`sync.transport` resolved at load)."""
    s = config.sync
    # FSDPPolicy casts each shard before its gather; one device casts while packing.
    same = world_size > 1 or config.rollout.dtype == config.model.dtype
    return SyncConfig(
        **pick(s, SyncConfig)
        | {"bucket_bytes": s.bucket_mb << 20, "cast_dtype": None if same else config.rollout.dtype}
    )
