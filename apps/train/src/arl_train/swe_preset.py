"""The SWE preset (`uv run apps/train --preset swe`): configs/swe.toml scaled down to this CPU machine.

What changes against swe.toml (docs/guide/swe.md): the tiny built-in Qwen3 model (built with a 4096-token
context so a SWE issue fits; untrained, so rewards near 0 are expected), the CPU for rollout and
training, a few real tasks of the smoke set (`.cache/swe-tasks/smoke`, built by `python -m
arl.harbor.swe build` when missing), arl's shell agent as in swe.toml, Harbor's docker environment when
the engine answers (`DOCKER_HOST`, default the project's socket) else the local unshare sandbox, a few
short steps. The preset's own knobs are the config's `[swe]` section (`swe.tasks=4`,
`swe.env=auto|docker|local`, `swe.task_set=<folder>`); the user's overrides come last and win.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from arl_train import tiny_model
from arl_train.config import ConfigError, load_config
from arl_train.validation import check_machine

REPO = Path(__file__).resolve().parents[4]
SWE_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "swe.toml"
SMOKE_SET = REPO / ".cache" / "swe-tasks" / "smoke"
FULL_SET = REPO / ".cache" / "swe-tasks" / "full"
SMOKE_BUILD = ["--packages", "inflection,cachetools,humanize", "--max-per-package", "2"]
DEFAULT_DOCKER_HOST = "unix:///run/arl-docker/docker.sock"

# swe.toml on this machine: CPU placement, the tiny model's sizes, a short run.
CPU_OVERRIDES = [
    "model.dtype=float32",
    "rollout.device=cpu",
    "rollout.dtype=float32",
    "rollout.replicas=1",
    "rollout.enable_prefix_caching=false",
    "rollout.enforce_eager=true",
    "resources.trainer_gpus=0",
    "resources.shared_gpu=off",
    "actor.optimizer_offload=false",
    "actor.activation_checkpointing=none",
    "actor.optim.lr=1e-4",
    "actor.max_tokens_per_microbatch=16384",
    "rollout.n=4",
    "rollout.max_tokens=48",
    "rollout.max_model_len=4096",
    "rollout.max_concurrent_per_replica=16",
    "actor.ppo_mini_batch_size=4",
    "trainer.total_steps=3",
    "trainer.save_every=0",
    "harbor.model_name=builtin-tiny",
    "harbor.max_input_tokens=4096",
    "harbor.max_output_tokens=48",
    "harbor.agent_kwargs={max_turns = 2, command_timeout_sec = 60.0}",
    "run.agent_workers=2",
    "harbor.policy.max_attempts=1",
    # A crowded 2-core machine can take longer than the default 30 s to start or stop a proxy.
    "harbor.proxy_timeout_sec=120",
    "output.dir=runs/swe",
]


def ensure_task_set(task_set: Path, log=print) -> Path:
    """`task_set`, first building the smoke set's packages there when it has no manifest (PyPI sdists,
    a few minutes). A set graded an older clean way gets the current grader (arl.harbor.swe.regrade,
    seconds); one graded in the agent's own environment (which a policy can game) is rebuilt when it is the
    project's smoke set, refused otherwise."""
    from arl.harbor.errors import HarborConfigError
    from arl.harbor.swe.regrade import regrade_set
    from arl.harbor.swe.writer import GRADING, outdated_grading

    if (task_set / "manifest.jsonl").is_file():
        stale = outdated_grading(task_set)
        if not stale:
            return task_set
        try:
            regrade_set(task_set)
            log(f"arl: {len(stale)} task(s) of {task_set} now graded as {GRADING} (their grader rewritten)")
            return task_set
        except HarborConfigError as e:
            if task_set.resolve() != SMOKE_SET.resolve():
                raise ConfigError(
                    f"the SWE task set {task_set} cannot take the current grader ({e}), which a policy could "
                    f"game otherwise; rebuild it: python -m arl.harbor.swe build --out {task_set}"
                ) from e
        import shutil

        log(f"arl: the smoke set in {task_set} grades the old way; rebuilding it")
        shutil.rmtree(task_set)
    log(
        f"arl: building a SWE task set in {task_set} (python -m arl.harbor.swe build {' '.join(SMOKE_BUILD)})"
    )
    cmd = [sys.executable, "-m", "arl.harbor.swe", "build", "--out", str(task_set), *SMOKE_BUILD]
    subprocess.run(cmd, check=True, timeout=1800)
    return task_set


def docker_answers() -> bool:
    """Whether the docker CLI, daemon and compose v2 answer (the project's preflight)."""
    os.environ.setdefault("DOCKER_HOST", DEFAULT_DOCKER_HOST)
    try:
        from arl.harbor.docker_environment import docker_preflight

        docker_preflight()
    except Exception:  # noqa: BLE001 - any failure means: use the local sandbox
        return False
    return True


def default_task_set() -> Path:
    return FULL_SET if (FULL_SET / "manifest.jsonl").is_file() else SMOKE_SET


def write_task_rows(task_set: Path, count: int, out_dir: Path) -> tuple[Path, list[str]]:
    """A Harbor dataset file (`out_dir/swe_tasks.jsonl`, {"path", "id"} rows) with `count` tasks of the
    set, one package after another (round-robin), copied to `out_dir/tasks` so the run does not depend on
    the set's folder staying as it is (the local sandbox still reads the package venvs from the set)."""
    import shutil

    rows = [
        json.loads(line) for line in (task_set / "manifest.jsonl").read_text().splitlines() if line.strip()
    ]
    by_package: dict[str, list[str]] = {}
    for r in rows:
        by_package.setdefault(r.get("package", ""), []).append(r["id"])
    chosen: list[str] = []
    while len(chosen) < min(count, len(rows)):
        for ids in by_package.values():
            if ids and len(chosen) < count:
                chosen.append(ids.pop(0))
    copies = out_dir / "tasks"
    for t in chosen:
        if not (copies / t).is_dir():
            shutil.copytree(task_set / t, copies / t, symlinks=True)
            # The local sandbox's binds name host paths relative to environment/: keep them pointing at
            # the set (its package venvs).
            binds = copies / t / "environment" / "local_binds.json"
            if binds.is_file():
                table = json.loads(binds.read_text())
                binds.write_text(
                    json.dumps(
                        {k: str((task_set / t / "environment" / v).resolve()) for k, v in table.items()}
                    )
                )
    out_file = out_dir / "swe_tasks.jsonl"
    out_file.write_text(
        "".join(json.dumps({"path": str((copies / t).resolve()), "id": t}) + "\n" for t in chosen)
    )
    return out_file, chosen


def environment_overrides(env: str, task_set: Path) -> list[str]:
    """The `harbor.*` overrides of the chosen environment."""
    if env == "docker":
        from arl.harbor.docker_environment import DOCKER_IMPORT_PATH

        return [f"harbor.environment_import_path={DOCKER_IMPORT_PATH}"]
    from arl.harbor.types import LOCAL_SANDBOX_IMPORT_PATH

    # Nothing of the set is bound into the sandbox: each task's local_binds.json binds its own testbed and
    # the package's venv, so a trial sees no other task, no solution and no test list.
    return [f"harbor.environment_import_path={LOCAL_SANDBOX_IMPORT_PATH}"]


def load_swe_config(path: Path | None, overrides: list[str], mode: str | None = None, log=print):
    """The SWE preset's `AppConfig`: `path` (default configs/swe.toml) with the CPU overrides, a few
    smoke-set tasks, the tiny model built with a 4096-token context, then the user's overrides."""
    path = path or SWE_CONFIG
    # The output folder and the [swe] section are known only after the user's overrides.
    probe = load_config(
        path,
        [*CPU_OVERRIDES, "model.path=builtin:tiny", "data.source=harbor:builtin:small", *overrides],
        mode,
    )
    cfg, out = probe.swe, Path(probe.output.dir).resolve()
    task_set = ensure_task_set(Path(cfg.task_set) if cfg.task_set else default_task_set(), log)
    out.mkdir(parents=True, exist_ok=True)
    rows, chosen = write_task_rows(task_set, cfg.tasks, out)
    env = cfg.env
    if env == "auto":
        env = "docker" if docker_answers() else "local"
    elif env == "docker" and not docker_answers():
        raise ConfigError(
            "swe.env=docker: the docker engine does not answer; start it with "
            '`eval "$(scripts/docker/start.sh)"` (scripts/docker/README) or use swe.env=local'
        )
    model_dir = out / "model_tiny_4k"
    if not (model_dir / "config.json").is_file():
        tiny_model.build_tiny_model(
            model_dir, seed=probe.model.seed + probe.seed, max_position_embeddings=4096
        )
    log(
        f"arl: SWE preset: {len(chosen)} tasks of {task_set} ({', '.join(chosen)}), environment {env}, "
        f"tiny model (untrained: rewards near 0 are expected) in {model_dir}"
    )
    config = load_config(
        path,
        [
            *CPU_OVERRIDES,
            f"model.path={model_dir}",
            f"data.source=harbor:{rows}",
            *environment_overrides(env, task_set),
            *overrides,
        ],
        mode,
    )
    check_machine(config)
    return config
