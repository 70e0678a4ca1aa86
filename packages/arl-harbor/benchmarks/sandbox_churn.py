"""Local sandboxes started and stopped many at once: how many starts fail, and how fast they turn over.

    sudo uv run python packages/arl-harbor/benchmarks/sandbox_churn.py [--sandboxes 400] [--concurrency 12]

Each sandbox starts (the minimal task's environment), runs one command and stops, `--concurrency` at a
time; a start that fails is counted by its error, never retried. A sandbox's stop kills its namespaces
while others start beside it, so this is where a stop that reaches beyond its own sandbox shows. Prints
one JSON line: sandboxes, seconds, sandboxes per second, the errors by message, the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import tempfile
import time
from pathlib import Path

from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from arl.harbor import LocalSandboxEnvironment
from arl.harbor.testing import write_hello_task


async def start_run_stop(root: Path, task: Path, index: int, errors: collections.Counter[str]) -> None:
    paths = TrialPaths(root / f"trial-{index}")
    paths.mkdir()
    env = LocalSandboxEnvironment(
        environment_dir=task / "environment",
        environment_name="churn",
        session_id=f"churn__{index}",
        trial_paths=paths,
        task_env_config=EnvironmentConfig(workdir="/app"),
    )
    try:
        await env.start(force_build=False)
        await env.exec("true", timeout_sec=60)
    except Exception as e:  # counted by kind: a failed start is the measurement
        last_line = (str(e).strip().splitlines() or [""])[-1]
        errors[f"{type(e).__name__}: {last_line[:120]}"] += 1
    finally:
        try:
            await env.stop(delete=True)
        except Exception as e:
            errors[f"stop {type(e).__name__}: {e}"[:160]] += 1


async def churn(sandboxes: int, concurrency: int) -> dict:
    errors: collections.Counter[str] = collections.Counter()
    slots = asyncio.Semaphore(concurrency)
    with tempfile.TemporaryDirectory(prefix="arl-churn-") as tmp:
        root = Path(tmp)
        task = write_hello_task(root / "tasks")

        async def one(index: int) -> None:
            async with slots:
                await start_run_stop(root, task, index, errors)

        load_before = os.getloadavg()[0]
        start = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(sandboxes)))
        seconds = time.monotonic() - start
    return {
        "sandboxes": sandboxes,
        "concurrency": concurrency,
        "seconds": round(seconds, 1),
        "sandboxes_per_s": round(sandboxes / seconds, 2),
        "failed": sum(errors.values()),
        "errors": dict(errors),
        "load_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=12)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(churn(args.sandboxes, args.concurrency))))


if __name__ == "__main__":
    main()
