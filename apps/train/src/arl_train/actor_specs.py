"""What each actor of a run is given: its spec, derived once from the config by the plan.

The rollout and trainer actors take a spec, never the whole `AppConfig`: the packages' configs as the
run builds them (`package_configs`), their slice of the layout, the run's timeouts and budget (derived
once, `arl_train.timeouts`: a Harbor task set is read by the plan alone), and the paths. Pure: tests
check specs without Ray. `TrainerShape` is the trainer's row of the layout table: which policy, who
sends the weights, which GPU-sharing schedule (`arl_train.actors` builds a trainer rank from it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import msgspec

from arl.harbor.types import HarborConfig
from arl.proxy.types import SamplingParams
from arl.rollout.budget import Budget
from arl.sync import SyncConfig
from arl.trainer.config import TrainerConfig
from arl_train.harbor_section import TaskSource, harbor_config, task_source
from arl_train.package_configs import run_budget, sync_config, trainer_config
from arl_train.placement import Layout
from arl_train.sections import AppConfig
from arl_train.shared_gpu import concurrent_oom_advice
from arl_train.timeouts import RunTimeouts


class RolloutSpec(msgspec.Struct, frozen=True, kw_only=True):
    """The rollout actor's part of the run."""

    model_path: str
    tasks: TaskSource
    # Harbor trials' config (trials_dir resolved); read only when a task's agent loop is "harbor".
    harbor: HarborConfig
    sampling: SamplingParams
    # Responses per prompt (the GRPO group).
    n: int
    budget: Budget
    partial_rollout: bool
    drain_timeout_s: float
    generate_timeout_s: float
    # Agent-loop worker processes (0: the agent loops run on the rollout actor's event loop).
    agent_workers: int
    seed: int
    # Sync receivers of one replica (its TP workers), for the count a pause reports.
    receivers_per_replica: int


class TrainerShape(msgspec.Struct, frozen=True, kw_only=True):
    """The trainer's row of the layout table: how a rank is built."""

    # "single": one process (HFPolicy); "fsdp": FSDP2 ranks, rank 0 leading, ranks 1.. following.
    policy: Literal["single", "fsdp"]
    # "rank0": rank 0 sends to every replica; "per_rank": each rank sends to the replica on its own GPU.
    sender: Literal["rank0", "per_rank"]
    # How the trainer shares the GPUs with the replicas: "split" (it does not), "colocated" (taking turns,
    # the replicas sleep while it trains), "time_sliced" (they yield the GPU at each batch), "concurrent"
    # (both resident at once).
    schedule: Literal["split", "colocated", "time_sliced", "concurrent"]


class TrainerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A trainer rank's part of the run (the same for every rank; the rank itself is separate)."""

    model_path: str
    shape: TrainerShape
    # arl-trainer's config, its batch wait raised to the run's (`RunTimeouts.batch_s`).
    trainer: TrainerConfig
    # arl-sync's config of the rank's sender.
    sync: SyncConfig
    layout: Layout
    # The rank's device: "cuda" (Ray gives every GPU rank its own GPU) or `actor.device`.
    device: str
    # The trainer's parameter dtype, and the rollout's (FSDP ranks cast each shard to it as they gather).
    dtype: str
    rollout_dtype: str
    seed: int
    # The KL's reference policy folder (None: a resumed checkpoint that recorded none).
    reference_path: str | None
    # The checkpoint's trainer state when resuming (model_path is then the checkpoint).
    resume: dict[str, Any] | None
    step_timeout_s: float
    pause_rpc_s: float
    sleep_level: int
    # "concurrent" on GPUs: the trainer's share of its GPU's memory (0: no cap), and what to change when
    # it runs out of memory beside the resident replica.
    trainer_memory_fraction: float
    oom_advice: str
    # Record this step (0: none) under the profiler into `profile_dir`.
    profile_step: int
    profile_dir: str


def trainer_shape(layout: Layout) -> TrainerShape:
    """The row of the layout table a trainer rank of `layout` is built from."""
    schedule = (
        layout.shared_gpu if layout.shared_gpu != "off" else ("colocated" if layout.colocate else "split")
    )
    return TrainerShape(
        policy="fsdp" if layout.trainer_ranks > 1 else "single",
        sender="per_rank" if layout.per_rank_sync else "rank0",
        schedule=schedule,
    )


def rollout_spec(config: AppConfig, layout: Layout, timeouts: RunTimeouts, model_path: Path) -> RolloutSpec:
    r = config.rollout
    return RolloutSpec(
        model_path=str(model_path),
        tasks=task_source(config),
        harbor=harbor_config(config),
        sampling=SamplingParams(max_tokens=r.max_tokens, temperature=r.temperature, top_p=r.top_p),
        n=r.n,
        budget=run_budget(config),
        partial_rollout=config.async_training.partial_rollout,
        drain_timeout_s=timeouts.drain_s,
        generate_timeout_s=r.generate_timeout_s,
        agent_workers=config.run.agent_workers,
        seed=config.seed,
        receivers_per_replica=layout.receivers // max(1, layout.replicas),
    )


def trainer_spec(
    config: AppConfig, layout: Layout, timeouts: RunTimeouts, model_path: Path, resume: dict[str, Any]
) -> TrainerSpec:
    return TrainerSpec(
        model_path=str(model_path),
        shape=trainer_shape(layout),
        trainer=trainer_config(config, batch_timeout_s=timeouts.batch_s),
        sync=sync_config(config, layout.trainer_ranks),
        layout=layout,
        device="cuda" if layout.trainer_gpus else config.actor.device,
        dtype=config.model.dtype,
        rollout_dtype=config.rollout.dtype,
        seed=config.seed,
        reference_path=reference_path_of(config, str(model_path), resume or None),
        resume=resume or None,
        step_timeout_s=timeouts.step_s,
        pause_rpc_s=timeouts.pause_rpc_s,
        sleep_level=config.rollout.sleep_level,
        trainer_memory_fraction=config.resources.trainer_memory_fraction,
        oom_advice=concurrent_oom_advice(config),
        profile_step=config.trainer.profile_step,
        profile_dir=str(Path(config.output.dir) / "profile"),
    )


def with_transport(spec: TrainerSpec, transport: str) -> TrainerSpec:
    """`spec` with the weights' transport settled once the nodes are known (`placement.transport_between_nodes`)."""
    return msgspec.structs.replace(
        spec,
        sync=msgspec.structs.replace(spec.sync, transport=transport),
        layout=msgspec.structs.replace(spec.layout, transport=transport),
    )


def reference_path_of(cfg: AppConfig, model_path: str, resume_state: dict[str, Any] | None) -> str | None:
    """The KL reference's folder: `actor.reference_path`, else on a resume the base model the checkpoint
    recorded, else the model this run starts from. None: a resumed checkpoint that recorded none
    (validation refuses that when kl_coef > 0)."""
    if cfg.actor.reference_path:
        return str(Path(cfg.actor.reference_path).resolve())
    if resume_state is not None:
        return resume_state.get("reference_path")
    return str(Path(model_path).resolve())
