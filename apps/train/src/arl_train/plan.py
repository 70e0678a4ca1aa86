"""What a run will start, decided from its config before anything starts.

`prepare(config)` does the preparations that touch this process and its files: the output folder (with
the config as run), the run's environment variables (set here before Ray or Harbor is imported, and
handed to every process of the run), the Harbor check, the resume state (a checkpoint's queued samples
copied where the queue restores them) and the model folder (built for `builtin:` shapes). It ends with
`plan(...)`, which is pure: the layout, the budget, the timeouts and a spec per actor (one per replica,
the rollout actor's, the trainer ranks': `arl_train.actor_specs`), so each is derived once and the actors
never see the whole config. The lifecycle (arl_train.run) starts what the plan names; tests check plans
without starting Ray.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec

from arl.rollout.budget import Budget
from arl_train.actor_specs import RolloutSpec, TrainerSpec, rollout_spec, trainer_spec, with_transport
from arl_train.allocator import trainer_allocator_env
from arl_train.checkpointing import resume_state
from arl_train.harbor_section import check_harbor
from arl_train.package_configs import engine_config, run_budget
from arl_train.placement import Layout, check_model, layout_of
from arl_train.sections import AppConfig
from arl_train.timeouts import RunTimeouts, run_timeouts


@dataclass(frozen=True)
class ReplicaSpec:
    """One rollout replica: the engine kind and the config its `EngineActor` builds."""

    index: int
    kind: str
    config: Any


@dataclass(frozen=True)
class RunPlan:
    """Everything the lifecycle needs to start a run, computed without starting anything."""

    config: AppConfig
    out_dir: Path
    # The environment of every process of the run (`run_environment`).
    env: dict[str, str]
    model_path: Path
    # The checkpoint's trainer state when resuming (step, version, dataset position); {} for a fresh run.
    resume: dict[str, Any]
    layout: Layout
    budget: Budget
    timeouts: RunTimeouts
    replicas: list[ReplicaSpec]
    rollout: RolloutSpec
    # Every trainer rank's spec (the rank itself is decided at start: placement.trainer_ranks).
    trainer: TrainerSpec
    # Variables Ray merges into `env` for the trainer ranks alone (the CUDA allocator's setting).
    trainer_env: dict[str, str]

    @property
    def initial_version(self) -> int:
        return int(self.resume.get("version", 0))

    @property
    def first_step(self) -> int:
        return int(self.resume.get("step", 0))


def run_environment(out_dir: Path) -> dict[str, str]:
    """Environment for every process of the run: caches out of $HOME, no hub, quiet Ray."""
    cache = Path(os.environ.get("ARL_CACHE_DIR", "/tmp/arl-cache"))
    return {
        "HF_HOME": str(cache / "hf"),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        # Keep the terminal for progress lines: engine/library chatter only when it is an error.
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
        "TRANSFORMERS_VERBOSITY": os.environ.get("TRANSFORMERS_VERBOSITY", "error"),
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "PYTHONWARNINGS": os.environ.get(
            "PYTHONWARNINGS", "ignore::DeprecationWarning,ignore::FutureWarning"
        ),
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        # Under `uv run`, Ray would otherwise zip the working tree and start every worker through uv.
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        "TOKENIZERS_PARALLELISM": "false",
        # Harbor's terminus-2 imports LiteLLM, which would fetch its model cost map from the network.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "ARL_LEDGER_DIR": str(out_dir / "ledger"),  # sample uids produced / consumed (arl_train.ledger)
    }


def prepare_model(config: AppConfig, out_dir: Path) -> Path:
    """The model folder: built by the project for `builtin:<shape>` (tiny_model.MODEL_SHAPES), else the given path."""
    if config.model.path.startswith("builtin:"):
        from arl_train.tiny_model import build_builtin_model

        return build_builtin_model(
            config.model.path.removeprefix("builtin:"), out_dir / "model", seed=config.model.seed
        )
    path = Path(config.model.path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model.path {path} is not a Hugging Face model folder (no config.json)")
    return path


def trainer_environment(config: AppConfig) -> dict[str, str]:
    """What a GPU trainer rank's environment adds before CUDA initialises in it: the allocator setting,
    and under the run's MPS daemon its cap on the trainer's SMs."""
    env = trainer_allocator_env(config.actor.expandable_segments)
    if config.resources.mps_trainer_sm_percent:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(config.resources.mps_trainer_sm_percent)
    return env


def plan(config: AppConfig, out_dir: Path, model_path: Path, resume: dict[str, Any]) -> RunPlan:
    """The run's plan from its config, model folder and resume state (pure: reads the model's config.json)."""
    layout = layout_of(config)
    check_model(layout, model_path)
    version = int(resume.get("version", 0))
    replicas = [
        ReplicaSpec(i, *engine_config(config, str(model_path), i, version)) for i in range(layout.replicas)
    ]
    timeouts = run_timeouts(config)  # once: for a Harbor run this reads the task set
    return RunPlan(
        config=config,
        out_dir=out_dir,
        env=run_environment(out_dir),
        model_path=model_path,
        resume=resume,
        layout=layout,
        budget=run_budget(config),
        timeouts=timeouts,
        replicas=replicas,
        rollout=rollout_spec(config, layout, timeouts, model_path),
        trainer=trainer_spec(config, layout, timeouts, model_path, resume),
        trainer_env=trainer_environment(config) if layout.trainer_gpus else {},
    )


def settle_transport(plan: RunPlan, transport: str) -> RunPlan:
    """`plan` with the weights' transport settled once the nodes are known (`placement.transport_between_nodes`)."""
    if transport == plan.config.sync.transport:
        return plan
    config = msgspec.structs.replace(
        plan.config, sync=msgspec.structs.replace(plan.config.sync, transport=transport)
    )
    return replace(
        plan,
        config=config,
        layout=msgspec.structs.replace(plan.layout, transport=transport),
        trainer=with_transport(plan.trainer, transport),
    )


def prepare(config: AppConfig) -> RunPlan:
    """The run's preparations (module docstring), then its plan."""
    out_dir = Path(config.output.dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_bytes(msgspec.json.format(msgspec.json.encode(config)))
    # Before Ray or Harbor is imported: they read some of these at import time.
    os.environ.update(run_environment(out_dir))
    check_harbor(config)  # a misconfigured Harbor agent/environment fails here, by name
    resume = resume_state(config, out_dir)
    model_path = Path(config.trainer.resume_from) if resume else prepare_model(config, out_dir)
    return plan(config, out_dir, model_path, resume)
