"""Single-trial phase timings of one SWE task in Harbor's docker environment vs the local sandbox.

    DOCKER_HOST=unix:///run/arl-docker/docker.sock \\
      uv run python packages/arl-harbor/benchmarks/docker_vs_local.py [--task DIR] [--repeats 5] [--agent oracle]

Runs `--repeats` sequential trials per environment through `HarborAgentLoop` (the oracle by default) and
prints the median and range of each phase from the trial's result.json: environment start, agent (setup +
run), verifier, teardown (verifier end → trial end), and the whole trial. Before that it times the task's
image build (`docker build --no-cache --network none`): the one-off cost the docker trials then reuse.
Without `--task` it uses the tests' minimal pytest task (tests/pytest_swe_task.py) with a fresh venv.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from arl.harbor import FailurePolicy, HarborAgentLoop, HarborConfig
from arl.harbor.docker_environment import DOCKER_IMPORT_PATH, build_task_image
from arl.proxy.types import SamplingParams
from arl.rollout.types import Task

HERE = Path(__file__).resolve().parent
PHASES = ("environment", "agent", "verifier", "teardown", "trial")


def _t(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def phases(trial_dir: Path) -> dict[str, float]:
    r = json.loads((trial_dir / "result.json").read_text())
    env, setup, run, ver = (r[k] for k in ("environment_setup", "agent_setup", "agent_execution", "verifier"))
    return {
        "environment": _t(env["finished_at"]) - _t(env["started_at"]),
        "agent": _t(run["finished_at"]) - _t(setup["started_at"]),
        "verifier": _t(ver["finished_at"]) - _t(ver["started_at"]),
        "teardown": _t(r["finished_at"]) - _t(ver["finished_at"]),
        "trial": _t(r["finished_at"]) - _t(r["started_at"]),
    }


async def trials(task: Path, environment: str, repeats: int, agent: str, out: Path) -> list[dict[str, float]]:
    env = {"environment_import_path": DOCKER_IMPORT_PATH} if environment == "docker" else {}
    cfg = HarborConfig(
        agent=agent,
        trials_dir=str(out / environment),
        policy=FailurePolicy(max_attempts=1),
        trial_timeout_sec=600,
        **env,
    )
    loop = HarborAgentLoop(cfg)
    rows = []
    for i in range(repeats):
        t = Task(
            id=f"{task.name[:40]}-{i}", messages=[], agent="harbor", metadata={"harbor_task_path": str(task)}
        )
        result = await loop.run(t, None, SamplingParams(), f"req-{i}")  # type: ignore[arg-type]
        if result.failed:
            raise SystemExit(f"{environment} trial failed: {result.error}")
        trial_dir = max((out / environment).iterdir(), key=lambda p: p.stat().st_mtime)
        rows.append(phases(trial_dir) | {"reward": result.reward})
    return rows


def summary(rows: list[dict[str, float]]) -> str:
    parts = []
    for p in PHASES:
        values = [r[p] for r in rows]
        parts.append(f"{p} {statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]")
    return "; ".join(parts) + f"; rewards {sorted({r['reward'] for r in rows})}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--task", type=Path, help="a Harbor task dir (default: the tests' minimal pytest task)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--agent", default="oracle")
    parser.add_argument("--environments", default="docker,local")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="arl-docker-vs-local-"))
    try:
        task = args.task
        if task is None:
            sys.path.insert(0, str(HERE.parent / "tests"))
            from pytest_swe_task import make_pytest_venv, write_pytest_swe_task

            wheels = HERE.parents[2] / ".cache" / "arl-harbor-tests" / "wheels-py311"
            task = write_pytest_swe_task(work / "tasks", venv=make_pytest_venv(work / "venv", wheels))
        task = task.resolve()
        envs = args.environments.split(",")
        if "docker" in envs:
            image, seconds = await build_task_image(
                task / "environment", force=True, network="none", no_cache=True
            )
            print(f"image build ({image}, --no-cache, --network none): {seconds:.2f} s")
        for environment in envs:
            rows = await trials(task, environment, args.repeats, args.agent, work / "trials")
            print(f"{environment:6s} x{len(rows)}: {summary(rows)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
