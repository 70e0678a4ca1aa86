"""Harbor in the app: the `[harbor]` section's package config, Harbor task sets as `data.source`, and
the longest one trial attempt may take.

`[harbor]` (`sections.HarborSection`) is `arl.harbor.HarborConfig` (agent, environment, timeouts,
retry/keep/zero/drop policy per failure kind, tool parser, proxy host) plus the app's `task_cache_dir`;
every key is overridable as `harbor.key=value` (e.g. `harbor.agent=oracle harbor.policy.sandbox=drop
harbor.tool_parser=hermes`).
`data.source = "harbor:<folder of task dirs | task dir | .jsonl/.json task set>"` (or
`"swebench:<SWE-bench-format rows | import .toml>"`) makes every task a Harbor trial (see `arl.harbor.tasks`).
`TaskSource` is where the tasks come from (what the rollout actor is given, `load_tasks` reads it);
`trial_attempt_s` reads the task set's own timeouts, once, for the plan; the run's waits built on it are
`arl_train.timeouts`'.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from arl.harbor.types import HarborConfig
from arl_train.borrow import pick
from arl_train.sections import AppConfig, HarborSection

if TYPE_CHECKING:
    from arl.rollout.types import Task

__all__ = [
    "HarborSection",
    "TaskSource",
    "check_harbor",
    "harbor_config",
    "load_app_tasks",
    "load_tasks",
    "task_source",
    "trial_attempt_s",
    "uses_harbor",
]

# The data.source prefixes whose tasks are Harbor trials (arl.harbor.tasks.SOURCE_PREFIXES).
HARBOR_SOURCE_PREFIX = ("harbor:", "swebench:")


def uses_harbor(config: AppConfig) -> bool:
    return config.data.source.startswith(HARBOR_SOURCE_PREFIX)


def harbor_config(config: AppConfig) -> HarborConfig:
    """The package's `HarborConfig` of this run (trials_dir under output.dir when relative)."""
    fields = pick(config.harbor, HarborConfig)
    trials = Path(fields["trials_dir"])
    fields["trials_dir"] = str(trials if trials.is_absolute() else Path(config.output.dir).resolve() / trials)
    return HarborConfig(**fields)


class TaskSource(msgspec.Struct, frozen=True, kw_only=True):
    """Where a run's tasks come from (`data.source`) and what reading it takes: what the rollout actor
    is given instead of the config."""

    source: str
    seed: int = 0
    size: int = 0
    # Harbor task sets: the task cache for name/ref references and the key of a row's task folder.
    cache_dir: str = ""
    task_path_key: str = "harbor_task_path"


def task_source(config: AppConfig) -> TaskSource:
    d, h = config.data, config.harbor
    return TaskSource(
        source=d.source, seed=d.seed, size=d.size, cache_dir=h.task_cache_dir, task_path_key=h.task_path_key
    )


def load_tasks(source: TaskSource) -> list[Task]:
    """The tasks of `source`: a Harbor task set for `harbor:` sources, else arl-rollout's dataset reader."""
    if source.source.startswith(HARBOR_SOURCE_PREFIX):
        from arl.harbor.tasks import load_harbor_tasks

        return load_harbor_tasks(
            source.source, cache_dir=source.cache_dir or None, task_path_key=source.task_path_key
        )
    from arl.rollout import load_tasks as load_dataset

    return load_dataset(source.source, seed=source.seed, size=source.size)


def load_app_tasks(config: AppConfig) -> list[Task]:
    """The run's tasks (`load_tasks` of its `data.source`)."""
    return load_tasks(task_source(config))


def trial_attempt_s(config: AppConfig) -> float:
    """The longest one trial attempt may take, in seconds: `harbor.trial_timeout_sec`, else the
    longest of the task set's own timeouts (each task's task.toml, scaled as Harbor scales them)."""
    h = config.harbor
    if h.trial_timeout_sec is not None:
        return h.trial_timeout_sec
    from arl.harbor.tasks import describe_source, task_timeout_sec

    infos = describe_source(config.data.source, cache_dir=h.task_cache_dir or None)
    return max(
        task_timeout_sec(i, multiplier=h.timeout_multiplier_max(), agent_timeout_sec=h.agent_timeout_sec)
        for i in infos
    )


def check_harbor(config: AppConfig) -> HarborConfig | None:
    """At start: the run's HarborConfig, after failing by name on a bad agent or environment."""
    if not uses_harbor(config):
        return None
    from arl.harbor.trial_loop import check_harbor_config

    cfg = harbor_config(config)
    check_harbor_config(cfg)
    return cfg
