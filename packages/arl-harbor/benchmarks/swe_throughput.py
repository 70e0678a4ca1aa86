"""SWE trial throughput: trials per second and phase timings with 16, 64, 256 concurrent trials, docker and
the local sandbox side by side, and what bounds them.

    DOCKER_HOST=unix:///run/arl-docker/docker.sock uv run python \\
        packages/arl-harbor/benchmarks/swe_throughput.py .cache/swe-tasks/smoke --concurrency 16,64,256 \\
        --envs local,docker [--json-out FILE]

One wave per (environment, concurrency N): N trials started at once, each `HarborAgentLoop.run` of arl's
shell agent driven through arl-proxy by a scripted generator replaying the *oracle* script (the task's
reverse patch written and applied through the agent's own tool calls), round-robin over the set's tasks;
so every reward is checkable (1.0 expected; tasks listed by `--skip` are left out). Reported per wave:
trials/s (N / wall of the wave), reward counts, failures by kind, the median and p90 of each phase from
the trials' result.json (environment start, agent = setup + run, verifier, teardown = verifier end →
trial end, trial), and the evidence for the bound: the machine's CPU busy share over the wave
(/proc/stat; the machine may be shared), the load average, the CPU seconds of this process (the event
loop: proxies, Harbor, tokenization), of its reaped children (local: the sandboxes with the agent's
commands and the verifier's pytest; docker: the docker/compose CLI calls), of dockerd + containerd +
shims (per process alive at the wave's end: a lower bound) and of the containers' processes (the docker
cgroup's cpuacct; any container of the daemon, so another user's containers count too), over the wave,
and their sum per trial. Images are built before the first docker wave
(`arl.harbor.docker_environment.build_task_image`) so no wave pays a build.

--grading: `separate` (the tasks as built: graded in a clean environment from the task's image after the
agent's environment is stopped), `shared` (a copy of the set whose task.toml drops the separate verifier
mode and the /testbed artifact: the same grader runs in the agent's own environment, as tasks were graded
before; what `separate` costs on top of it is the second environment and the carried testbed), in the
order given, each with every env; naming one twice (`shared,separate,separate,shared`) repeats its waves.

--envs: `local` (arl's sandbox), `docker` (arl's DockerEnvironment: execs and copies over the Engine
API), `docker-compose` (the same environment with `engine_api=False`: every exec and copy a `docker
compose` CLI call, Harbor's own path), in the order given; repeating one (`docker-compose,docker,local,
docker,docker-compose`) shows the drift of a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
PHASES = ("environment", "agent", "verifier", "teardown", "trial")
DAEMONS = ("dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2", "runc", "docker-proxy")


def _t(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def phases(result_json: Path) -> dict[str, float]:
    """Phase durations of one trial from Harbor's result.json (missing phases are left out)."""
    r = json.loads(result_json.read_text())
    out: dict[str, float] = {}

    def span(key: str) -> tuple[float, float] | None:
        v = r.get(key) or {}
        return (
            (_t(v["started_at"]), _t(v["finished_at"]))
            if v.get("started_at") and v.get("finished_at")
            else None
        )

    env, setup, run, ver = (
        span(k) for k in ("environment_setup", "agent_setup", "agent_execution", "verifier")
    )
    if env:
        out["environment"] = env[1] - env[0]
    if setup and run:
        out["agent"] = run[1] - setup[0]
    if ver:
        out["verifier"] = ver[1] - ver[0]
        if r.get("finished_at"):
            out["teardown"] = _t(r["finished_at"]) - ver[1]
    if r.get("started_at") and r.get("finished_at"):
        out["trial"] = _t(r["finished_at"]) - _t(r["started_at"])
    return out


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the machine since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def daemon_cpu() -> dict[int, float]:
    """CPU seconds (user + system, with reaped children) of each live docker/containerd process, by pid."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        if name in DAEMONS or name.startswith("containerd-shim"):
            rest = text[text.rindex(")") + 2 :].split()
            out[int(stat.parent.name)] = (
                int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])
            ) / tick
    return out


def daemon_cpu_since(before: dict[int, float]) -> float:
    """CPU seconds the daemons alive now used since `before` (a shim that exited meanwhile takes its
    seconds with it: a lower bound)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in daemon_cpu().items())


def containers_cpu_s() -> float:
    """CPU seconds of every process ever run in a docker container (the containers' parent cgroup, which
    keeps the seconds of removed containers; cgroup v1 cpuacct with the cgroupfs driver, else 0)."""
    for path in (
        "/sys/fs/cgroup/cpuacct/docker/cpuacct.usage",
        "/sys/fs/cgroup/cpu,cpuacct/docker/cpuacct.usage",
    ):
        try:
            return int(Path(path).read_text()) / 1e9
        except (OSError, ValueError):
            continue
    return 0.0


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_cpu_s() -> float:
    """CPU seconds of this process's reaped children: the local sandboxes (their agent commands and the
    verifier's pytest) or the docker/compose CLI calls."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def quantiles(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    values = sorted(values)
    p90 = values[min(len(values) - 1, round(0.9 * (len(values) - 1)))]
    return statistics.median(values), p90


def load_tasks(task_set: Path, skip: set[str]) -> list[tuple[str, Path]]:
    rows = [
        json.loads(line) for line in (task_set / "manifest.jsonl").read_text().splitlines() if line.strip()
    ]
    return [(r["id"], task_set / r["id"]) for r in rows if r["id"] not in skip]


def shared_grading_copy(task_set: Path, tasks: list[tuple[str, Path]], work: Path) -> list[tuple[str, Path]]:
    """Copies of `tasks` graded in the agent's own environment (no separate verifier, no artifact)."""
    import re

    out = []
    for task_id, task_dir in tasks:
        copy = work / "shared-set" / task_id
        if not copy.is_dir():
            shutil.copytree(task_dir, copy, symlinks=True)
            binds = copy / "environment" / "local_binds.json"
            if binds.is_file():  # relative to the task's environment/: keep pointing at the set's venvs
                table = json.loads(binds.read_text())
                binds.write_text(
                    json.dumps({k: str((task_dir / "environment" / v).resolve()) for k, v in table.items()})
                )
            toml = copy / "task.toml"
            text = re.sub(r'(?m)^(artifacts = .*|environment_mode = "separate")\n', "", toml.read_text())
            toml.write_text(text)
        out.append((task_id, copy))
    return out


def harbor_fields(env: str, task_set: Path, trials_dir: Path, trial_timeout: float) -> dict[str, Any]:
    from arl.harbor.agents.checks import harbor_config_fields

    # "docker-compose": arl's DockerEnvironment with every exec/copy through `docker compose` (Harbor's
    # own path, the state before the Engine API path) for a side-by-side measure.
    base_env = "docker" if env.startswith("docker") else env
    fields = harbor_config_fields("shell", base_env, trials_dir=trials_dir, trial_timeout_sec=trial_timeout)
    if env == "docker-compose":
        fields["environment_kwargs"] = {**fields.get("environment_kwargs", {}), "engine_api": False}
    fields["policy"] = {"max_attempts": 1, "retry_backoff_sec": 0.0}
    return fields


async def one_trial(
    i: int, task_id: str, task_dir: Path, fields: dict[str, Any], tokenizer: Any, trials_dir: Path
) -> dict[str, Any]:
    import msgspec

    from arl.harbor import HarborAgentLoop, HarborConfig
    from arl.harbor.agents.scripts import script_completions
    from arl.proxy.testing import ScriptedGenerator
    from arl.proxy.types import SamplingParams
    from arl.rollout.types import Task

    mine = trials_dir / f"t{i:04d}"
    config = msgspec.convert({**fields, "trials_dir": str(mine)}, HarborConfig)
    generator = ScriptedGenerator(tokenizer, list(script_completions("shell", "oracle", task_dir)))
    loop = HarborAgentLoop(config, tokenizer=tokenizer)
    task = Task(id=task_id, messages=[], agent="harbor", metadata={"harbor_task_path": str(task_dir)})
    started = time.monotonic()
    result = await loop.run(task, generator, SamplingParams(max_tokens=4096, temperature=1.0), f"tp-{i}")
    row: dict[str, Any] = {
        "task": task_id,
        "wall": time.monotonic() - started,
        "failed": result.failed,
        "kind": result.failure_kind if result.failed else "",
        "reward": result.reward,
        "error": (result.error or "")[:300],
    }
    found = sorted(mine.glob("*/result.json"))
    if found:
        row["phases"] = phases(found[-1])
    return row


async def wave(
    env: str,
    n: int,
    tasks: list[tuple[str, Path]],
    task_set: Path,
    tokenizer: Any,
    work: Path,
    trial_timeout: float,
    grading: str = "separate",
    repeat: int = 0,
) -> dict[str, Any]:
    trials_dir = work / f"{grading}-{env}-{n}-{repeat}"
    fields = harbor_fields(env, task_set, trials_dir, trial_timeout)
    busy0, total0 = cpu_times()
    self0, children0, daemons0, containers0 = self_cpu_s(), children_cpu_s(), daemon_cpu(), containers_cpu_s()
    started = time.monotonic()
    rows = await asyncio.gather(
        *(one_trial(i, *tasks[i % len(tasks)], fields, tokenizer, trials_dir) for i in range(n))
    )
    wall = time.monotonic() - started
    busy1, total1 = cpu_times()
    out: dict[str, Any] = {
        "env": env,
        "grading": grading,
        "concurrency": n,
        "wall_s": wall,
        "trials_per_s": n / wall,
        "rewards": dict(Counter(str(r["reward"]) for r in rows if not r["failed"])),
        "failed": dict(Counter(r["kind"] for r in rows if r["failed"])),
        "errors": sorted({r["error"] for r in rows if r["failed"]})[:3],
        "cpu_busy": (busy1 - busy0) / max(1, total1 - total0),
        "loadavg": os.getloadavg()[0],
        "self_cpu_s": self_cpu_s() - self0,
        "children_cpu_s": children_cpu_s() - children0,
        "daemon_cpu_s": daemon_cpu_since(daemons0),
        "containers_cpu_s": containers_cpu_s() - containers0,
        "phases": {},
    }
    out["cpu_s_per_trial"] = (
        sum(out[k] for k in ("self_cpu_s", "children_cpu_s", "daemon_cpu_s", "containers_cpu_s")) / n
    )
    for p in PHASES:
        med, p90 = quantiles([r["phases"][p] for r in rows if p in r.get("phases", {})])
        out["phases"][p] = {"median": med, "p90": p90}
    shutil.rmtree(trials_dir, ignore_errors=True)
    return out


def fmt(w: dict[str, Any]) -> str:
    ph = " | ".join(f"{w['phases'][p]['median']:.1f}/{w['phases'][p]['p90']:.1f}" for p in PHASES)
    return (
        f"| {w['env']} | {w.get('grading', 'separate')} | {w['concurrency']} | {w['trials_per_s']:.2f} | "
        f"{w['wall_s']:.0f} | {ph} | "
        f"{w['rewards']} {w['failed'] or ''} | {100 * w['cpu_busy']:.0f}% / {w['loadavg']:.1f} | "
        f"{w['self_cpu_s']:.0f} | {w['children_cpu_s']:.0f} | {w['daemon_cpu_s']:.0f} | "
        f"{w['containers_cpu_s']:.0f} | **{w['cpu_s_per_trial']:.1f}** |"
    )


async def main_async(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(HERE))
    from swe_agent_checks import tokenizer_for_checks

    task_set = args.task_set.absolute()
    tasks = load_tasks(task_set, set(filter(None, args.skip.split(","))))
    if not tasks:
        raise SystemExit(f"{task_set}: no tasks left")
    tokenizer = tokenizer_for_checks()
    # Imported before the first wave so that no wave pays them.
    import harbor.trial.trial  # noqa: F401

    import arl.harbor.environment  # noqa: F401
    from arl.harbor import HarborAgentLoop  # noqa: F401
    from arl.harbor.agents.scripts import script_completions  # noqa: F401
    from arl.proxy.testing import ScriptedGenerator  # noqa: F401

    envs = args.envs.split(",")
    work = Path(tempfile.mkdtemp(prefix="arl-swe-tp-", dir=args.work_dir))
    # A grading may be named more than once (`shared,separate,separate,shared`: the drift of a shared machine
    # shows); each wave has a trials dir of its own.
    gradings = args.grading.split(",")
    task_lists = {
        g: tasks if g == "separate" else shared_grading_copy(task_set, tasks, work)
        for g in dict.fromkeys(gradings)
    }
    if any(e.startswith("docker") for e in envs):
        from arl.harbor.docker_environment import build_task_image

        for graded_tasks in task_lists.values():
            for _, task_dir in graded_tasks:
                await build_task_image(task_dir / "environment", network="none")
    results = []
    print(f"# {len(tasks)} tasks of {task_set}; shell agent, oracle script; cores {os.cpu_count()}")
    print(
        "| env | grading | concurrent | trials/s | wall s | environment | agent | verifier | teardown | trial | "
        "rewards / failed | CPU busy / load | this process CPU s | its children CPU s | docker daemons CPU s | "
        "containers CPU s | CPU s per trial |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        for n in (int(x) for x in args.concurrency.split(",")):
            for repeat, grading in enumerate(gradings):
                for env in envs:
                    w = await wave(
                        env,
                        n,
                        task_lists[grading],
                        task_set,
                        tokenizer,
                        work,
                        args.trial_timeout,
                        grading,
                        repeat,
                    )
                    results.append(w)
                    print(fmt(w), flush=True)
                    if w["errors"]:
                        print(f"#   errors: {w['errors']}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if args.json_out:
            args.json_out.write_text(json.dumps(results, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("task_set", type=Path, help="a SWE task set (manifest.jsonl + Harbor task dirs)")
    parser.add_argument("--concurrency", default="16,64,256")
    parser.add_argument(
        "--envs",
        default="local,docker",
        help="comma-separated: local, docker (execs and copies over the Engine API), "
        "docker-compose (the same through `docker compose` CLI calls, Harbor's path)",
    )
    parser.add_argument(
        "--skip",
        default="humanize__humanize.i18n.activate__remove_assign",
        help="task ids left out (default: the smoke task whose oracle fails in the image)",
    )
    parser.add_argument(
        "--grading",
        default="separate",
        help="comma-separated: separate (as built), shared (the verifier in the agent's environment)",
    )
    parser.add_argument("--trial-timeout", type=float, default=1800.0)
    parser.add_argument("--work-dir", default=None, help="where trial dirs go (default: /tmp)")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    if "docker" in args.envs:
        os.environ.setdefault("DOCKER_HOST", "unix:///run/arl-docker/docker.sock")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
