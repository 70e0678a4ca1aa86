"""Harbor in the app: the `[harbor]` section's package config, Harbor task sets as `data.source`, and
the run's derived timeouts.

`[harbor]` (`sections.HarborSection`) is `arl.harbor.HarborConfig` (agent, environment, timeouts,
retry/keep/zero/drop policy per failure kind, tool parser, proxy host) plus four app-level fields;
every key is overridable as `harbor.key=value` (e.g. `harbor.agent=oracle harbor.policy.sandbox=drop harbor.tool_parser=hermes`).
`data.source = "harbor:<folder of task dirs | task dir | .jsonl/.json task set>"` (or
`"swebench:<SWE-bench-format rows | import .toml>"`) makes every task a Harbor trial (see `arl.harbor.tasks`).
`run_timeouts` derives the driver's step timeout, the rollouter's drain timeout, the trainer's batch
timeout and the pause RPC timeout from the trial timeouts (Harbor runs) or the generation timeout (plain
runs), so nothing is hard-coded.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from arl.harbor.types import HarborConfig

from arl_train.borrow import pick
from arl_train.package_configs import run_budget
from arl_train.sections import AppConfig, HarborSection

if TYPE_CHECKING:
    from arl.rollout.types import Task

__all__ = ["HarborSection", "RunTimeouts", "check_harbor", "harbor_config", "load_app_tasks", "run_timeouts",
           "uses_harbor"]

# The data.source prefixes whose tasks are Harbor trials (arl.harbor.tasks.SOURCE_PREFIXES).
HARBOR_SOURCE_PREFIX = ("harbor:", "swebench:")
# Slack on top of the summed worst cases (RPC round trips, scheduling, teardown).
_MARGIN_S = 60.0


class RunTimeouts(msgspec.Struct, kw_only=True):
    """Every wait of a run that depends on how long a prompt can take, in seconds."""

    # The longest one trial attempt (Harbor) or one generation (plain) may take.
    attempt_s: float
    # The longest one prompt's group may take (all retries included).
    prompt_s: float
    # A non-partial sync's wait for active prompts (the rollouter's drain timeout).
    drain_s: float
    # The trainer's wait for one batch of samples.
    batch_s: float
    # The driver's wait for one trainer step (batch + a drained sync + its transfers).
    step_s: float
    # The trainer's pause RPC to the rollout actor (a drain plus slack).
    pause_rpc_s: float


def uses_harbor(config: AppConfig) -> bool:
    return config.data.source.startswith(HARBOR_SOURCE_PREFIX)


def harbor_config(config: AppConfig) -> HarborConfig:
    """The package's `HarborConfig` of this run (trials_dir under output.dir when relative)."""
    fields = pick(config.harbor, HarborConfig)
    trials = Path(fields["trials_dir"])
    fields["trials_dir"] = str(trials if trials.is_absolute() else Path(config.output.dir).resolve() / trials)
    return HarborConfig(**fields)


def load_app_tasks(config: AppConfig) -> list[Task]:
    """The run's tasks: a Harbor task set for `harbor:` sources, else arl-rollout's dataset reader."""
    if uses_harbor(config):
        from arl.harbor.tasks import load_harbor_tasks

        return load_harbor_tasks(
            config.data.source,
            cache_dir=config.harbor.task_cache_dir or None,
            task_path_key=config.harbor.task_path_key,
        )
    from arl.rollout import load_tasks

    return load_tasks(config.data.source, seed=config.data.seed, size=config.data.size)


def _attempt_s(config: AppConfig) -> float:
    h = config.harbor
    if not uses_harbor(config):
        return config.rollout.generate_timeout_s
    if h.trial_timeout_sec is not None:
        return h.trial_timeout_sec
    from arl.harbor.tasks import describe_source, task_timeout_sec

    infos = describe_source(config.data.source, cache_dir=h.task_cache_dir or None)
    return max(
        task_timeout_sec(i, multiplier=h.timeout_multiplier_max(), agent_timeout_sec=h.agent_timeout_sec)
        for i in infos
    )


def run_timeouts(config: AppConfig) -> RunTimeouts:
    """Derive every prompt-length-dependent wait of the run (explicit overrides win)."""
    h = config.harbor
    attempt = _attempt_s(config)
    if uses_harbor(config):
        attempts = h.policy.max_attempts
        backoff = h.policy.retry_backoff_sec * attempts * (attempts - 1) / 2
        prompt = attempts * attempt + backoff
    else:
        prompt = attempt
    drain = h.drain_timeout_s if h.drain_timeout_s is not None else prompt + _MARGIN_S
    budget = run_budget(config)
    required = config.async_training.require_batches * config.actor.ppo_mini_batch_size
    waves = math.ceil(required / max(1, budget.max_concurrent))
    batch = max(config.trainer.batch_timeout_s, waves * prompt + _MARGIN_S)
    step = h.step_timeout_s
    if step is None:
        step = batch + drain + 2 * config.sync.timeout_s + _MARGIN_S
    return RunTimeouts(
        attempt_s=attempt, prompt_s=prompt, drain_s=drain, batch_s=batch, step_s=step, pause_rpc_s=drain + _MARGIN_S
    )


def check_harbor(config: AppConfig) -> HarborConfig | None:
    """At start: the run's HarborConfig, after failing by name on a bad agent or environment."""
    if not uses_harbor(config):
        return None
    from arl.harbor.trial_loop import check_harbor_config

    cfg = harbor_config(config)
    check_harbor_config(cfg)
    return cfg
