"""SWE soak: many trials with faults injected at random, nothing lost, nothing trained twice, nothing left.

    uv run python apps/train/benchmarks/swe_soak.py <task set> --trials 1000 --concurrency 16 \\
        [--env local|docker] [--app-steps 6] [--json-out FILE]

Two stages, then a hygiene check against a snapshot taken before the first:

1. **Trials** (`--trials`): `HarborAgentLoop.run` of arl's shell agent driven through arl-proxy by the
   oracle script, `--concurrency` at a time, round-robin over the set's tasks, each trial drawn at random
   (`--fault-rate`, seeded) as one of:
   - `none`: must score 1.0;
   - `env_start_fails`: a copy of the task whose environment cannot start (local_setup.sh exits 1; docker:
     a Dockerfile step that fails): must fail by kind (sandbox / invalid_task), never score;
   - `verifier_timeout`: a copy whose tests sleep past a 3 s verifier timeout: must fail by kind
     (verifier_timeout, retried once), never score;
   - `client_disconnect`: the agent first opens a streamed completion and drops the connection after the
     first chunk, while the engine is still generating, then works normally: must score 1.0, with that
     turn counted as dropped (`AgentResult.dropped_turns` = 1) and absent from the trajectory.
   Every launched trial must come back (a result or a failure by kind): "lost" counts those that did not
   (exception, hang past the trial timeout) or came back with the wrong outcome.
2. **App** (`--app-steps` > 0): `uv run apps/train --preset swe` (tiny model, the same tasks, local
   sandbox, 2 agent-loop worker processes, checkpoint every step) with the fault harness's mechanisms
   (arl_train.faults): one agent-loop worker process SIGKILLed mid-run (the run goes on,
   its trajectories redispatched), then the rollout engine (replica) SIGKILLed (the driver fails; resumed
   from the latest checkpoint until the end). The sample ledger (arl_train.ledger) is checked over the
   committed history: 0 lost, 0 trained twice.
3. **Hygiene**: after both, compared with before: containers, processes (sandbox, Ray, proxies of these
   runs), mounts, network namespaces, trial directories, and disk use of the filesystems involved.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
FAULTS = ("env_start_fails", "verifier_timeout", "client_disconnect")
sys.path.insert(0, str(REPO / "packages" / "arl-harbor" / "benchmarks"))


# ----- faulty task variants ---------------------------------------------------------------------------
def _copy_task(task: Path, out: Path) -> None:
    """A copy of the task dir elsewhere; local_binds.json's relative host paths made absolute."""
    shutil.copytree(task, out, symlinks=True)
    binds = out / "environment" / "local_binds.json"
    if binds.is_file():
        table = json.loads(binds.read_text())
        binds.write_text(json.dumps({k: str((task / "environment" / v).resolve()) for k, v in table.items()}))


def env_failing_copy(task: Path, root: Path, env: str) -> Path:
    out = root / f"envfail-{task.name}"[:100]
    if not out.is_dir():
        _copy_task(task, out)
        (out / "environment" / "local_setup.sh").write_text(
            "#!/bin/bash\necho 'soak: environment fails' >&2\nexit 1\n"
        )
        if env == "docker":
            dockerfile = out / "environment" / "Dockerfile"
            dockerfile.write_text(dockerfile.read_text() + "\nRUN echo 'soak: environment fails' && exit 1\n")
    return out


def verifier_timeout_copy(task: Path, root: Path) -> Path:
    out = root / f"vtimeout-{task.name}"[:100]
    if not out.is_dir():
        _copy_task(task, out)
        toml = (out / "task.toml").read_text()
        head, sep, rest = toml.partition("[verifier]")
        rest = "\n".join(
            "timeout_sec = 3.0" if line.startswith("timeout_sec") and i < 3 else line
            for i, line in enumerate(rest.split("\n"))
        )
        (out / "task.toml").write_text(head + sep + rest)
        test = out / "tests" / "test.sh"
        lines = test.read_text().split("\n", 1)
        test.write_text(lines[0] + "\nsleep 60\n" + (lines[1] if len(lines) > 1 else ""))
    return out


# ----- the client that disconnects mid-stream ---------------------------------------------------------
def _shell_agent_base() -> type:
    from arl.harbor.shell_agent import ShellAgent

    return ShellAgent


class DisconnectingShellAgent(_shell_agent_base()):  # type: ignore[misc]
    """arl's shell agent that first opens a streamed completion and drops it after the first chunk."""

    @staticmethod
    def name() -> str:
        return "arl-shell-disconnecting"

    async def run(self, instruction: str, environment: Any, context: Any) -> None:
        import aiohttp

        from arl.harbor.shell_agent import BASH_TOOL, SYSTEM_PROMPT

        body = {
            "model": self.model_name or "policy",
            "stream": True,
            "tools": [BASH_TOOL],
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": instruction.strip()},
            ],
        }
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            response = await http.post(f"{self._base_url.rstrip('/')}/chat/completions", json=body)
            await response.content.readany()  # the first SSE chunk, sent before generation starts
            response.close()  # drop the connection while the engine generates
        await super().run(instruction, environment, context)


class SlowFirstGenerator:
    """The disconnected call first: it takes a second and is answered by `first`; every later call by
    `rest`. Two generators, because arl-proxy aborts a generation whose client left: the aborted call
    must not take a reply out of the agent's script (it would shift the script by one)."""

    def __init__(self, first: Any, rest: Any, delay_s: float = 1.0) -> None:
        self.first, self.rest, self.delay_s, self.pending_first = first, rest, delay_s, True

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: Any) -> Any:
        if self.pending_first:
            self.pending_first = False
            await asyncio.sleep(self.delay_s)
            return await self.first.generate(request_id, prompt_ids, sampling_params)
        return await self.rest.generate(request_id, prompt_ids, sampling_params)


# ----- hygiene ----------------------------------------------------------------------------------------
def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def descendants() -> list[Any]:
    """Every live process below this one (sandboxes, their PID-namespace children, Ray and its workers
    once the app stage runs them as our children)."""
    import psutil

    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def snapshot(work: Path) -> dict[str, Any]:
    """What the soak must leave as it found, restricted to what it could have made (the machine is
    shared): containers whose mounts name the soak's work dir, mounts under it, processes below this one
    and the network namespaces they hold; the used bytes of the filesystems involved."""
    containers = []
    if shutil.which("docker"):
        for cid in _run(["docker", "ps", "-aq", "--no-trunc"]).split():
            if str(work) in _run(["docker", "inspect", "--format", "{{json .Mounts}}", cid]):
                containers.append(cid)
    mounts = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if str(work) in line.split()[4]
    ]
    procs, netns = {}, set()
    for p in descendants():
        try:
            procs[p.pid] = " ".join(p.cmdline())[:160]
            netns.add(os.readlink(f"/proc/{p.pid}/ns/net"))
        except Exception:  # noqa: BLE001, S112 - gone meanwhile
            continue
    netns.discard(os.readlink("/proc/self/ns/net"))
    disk = {}
    for path in (Path("/tmp"), REPO, Path("/var/lib/arl-docker")):
        if path.exists():
            st = os.statvfs(path)
            disk[str(path)] = (st.f_blocks - st.f_bfree) * st.f_frsize
    images = len(_run(["docker", "images", "-aq"]).split()) if shutil.which("docker") else 0
    return {
        "containers": containers,
        "mounts": mounts,
        "netns": sorted(netns),
        "procs": procs,
        "disk_used": disk,
        "docker_images": images,
        "work_bytes": sum(f.stat().st_size for f in work.rglob("*") if f.is_file()) if work.exists() else 0,
    }


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {
        "containers_left": sorted(set(after["containers"]) - set(before["containers"])),
        "mounts_left": sorted(set(after["mounts"]) - set(before["mounts"])),
        "netns_left": sorted(set(after["netns"]) - set(before["netns"])),
        "processes_left": {k: v for k, v in after["procs"].items() if k not in before["procs"]},
        "docker_images_delta": after["docker_images"] - before["docker_images"],
        "disk_delta_mb": {
            k: round((after["disk_used"].get(k, 0) - v) / 2**20, 1) for k, v in before["disk_used"].items()
        },
    }


# ----- stage 1: trials --------------------------------------------------------------------------------
async def trial(
    i: int,
    kind: str,
    task_id: str,
    task: Path,
    args: argparse.Namespace,
    tokenizer: Any,
    work: Path,
    variants: Path,
) -> dict[str, Any]:
    import msgspec
    from swe_throughput import harbor_fields

    from arl.harbor import HarborAgentLoop, HarborConfig
    from arl.harbor.agents.scripts import script_completions
    from arl.proxy.testing import ScriptedGenerator
    from arl.proxy.types import SamplingParams
    from arl.rollout.types import Task

    fields = harbor_fields(args.env, args.task_set, work / f"t{i:05d}", args.trial_timeout)
    fields["keep_trial_dirs"] = False
    fields["policy"] = {"max_attempts": 2, "retry_backoff_sec": 0.0}
    # Once per attempt: a retried trial (verifier_timeout is retried once) replays the script.
    completions = list(script_completions("shell", "oracle", task)) * 2
    generator: Any = ScriptedGenerator(tokenizer, completions)
    run_task = task
    if kind == "env_start_fails":
        run_task = env_failing_copy(task, variants, args.env)
    elif kind == "verifier_timeout":
        run_task = verifier_timeout_copy(task, variants)
    elif kind == "client_disconnect":
        fields["agent_import_path"] = "swe_soak:DisconnectingShellAgent"
        generator = SlowFirstGenerator(ScriptedGenerator(tokenizer, ["(dropped)"]), generator)
    config = msgspec.convert(fields, HarborConfig)
    loop = HarborAgentLoop(config, tokenizer=tokenizer)
    t = Task(id=task_id, messages=[], agent="harbor", metadata={"harbor_task_path": str(run_task)})
    started = time.monotonic()
    row: dict[str, Any] = {"i": i, "fault": kind, "task": task_id}
    try:
        result = await asyncio.wait_for(
            loop.run(t, generator, SamplingParams(max_tokens=4096, temperature=1.0), f"soak-{i}"),
            args.trial_timeout * 2 + 120,
        )
    except Exception as exc:  # noqa: BLE001 - a trial that does not come back is what the soak counts
        return row | {
            "outcome": "lost",
            "error": f"{type(exc).__name__}: {exc}"[:300],
            "wall": time.monotonic() - started,
        }
    row |= {
        "wall": time.monotonic() - started,
        "failed": result.failed,
        "kind": result.failure_kind,
        "reward": None if result.failed else result.reward,
        "segments": len(result.segments),
        "dropped_turns": result.dropped_turns,
        "error": (result.error or "")[:200],
    }
    if kind in ("none", "client_disconnect"):
        # The reply the agent never received is counted as dropped, never recorded: one drop exactly there.
        ok = (
            not result.failed
            and result.reward == 1.0
            and result.dropped_turns == int(kind == "client_disconnect")
        )
    elif kind == "env_start_fails":
        ok = result.failed and result.failure_kind in ("sandbox", "invalid_task")
    else:
        ok = result.failed and result.failure_kind == "verifier_timeout"
    row["outcome"] = "ok" if ok else "wrong"
    return row


async def stage_trials(args: argparse.Namespace, tasks: list[tuple[str, Path]], work: Path) -> dict[str, Any]:
    from swe_agent_checks import tokenizer_for_checks

    tokenizer = tokenizer_for_checks()
    rng = random.Random(args.seed)
    faults = args.faults.split(",")
    kinds = [rng.choice(faults) if rng.random() < args.fault_rate else "none" for _ in range(args.trials)]
    variants = work / "variants"
    variants.mkdir(parents=True, exist_ok=True)
    gate = asyncio.Semaphore(args.concurrency)
    done = 0
    started = time.monotonic()

    async def guarded(i: int) -> dict[str, Any]:
        nonlocal done
        async with gate:
            row = await trial(i, kinds[i], *tasks[i % len(tasks)], args, tokenizer, work / "trials", variants)
        done += 1
        if done % 50 == 0:
            print(f"#   {done}/{args.trials} trials, {time.monotonic() - started:.0f} s", flush=True)
        return row

    rows = await asyncio.gather(*(guarded(i) for i in range(args.trials)))
    wall = time.monotonic() - started
    by_fault: dict[str, Counter] = {}
    for r in rows:
        by_fault.setdefault(r["fault"], Counter())[r["outcome"]] += 1
    wrong = [r for r in rows if r["outcome"] != "ok"][:10]
    return {
        "trials": len(rows),
        "wall_s": round(wall, 1),
        "trials_per_s": round(len(rows) / wall, 3),
        "by_fault": {k: dict(v) for k, v in by_fault.items()},
        "lost": sum(r["outcome"] == "lost" for r in rows),
        "wrong": sum(r["outcome"] == "wrong" for r in rows),
        "examples_not_ok": wrong,
        "disconnect_segments": dict(
            Counter(r.get("segments") for r in rows if r["fault"] == "client_disconnect")
        ),
        "dropped_turns_by_fault": {
            f: sum(r.get("dropped_turns") or 0 for r in rows if r["fault"] == f) for f in ("none", *FAULTS)
        },
    }


# ----- stage 2: the app with worker and replica kills -------------------------------------------------
def stage_app(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from arl_train.faults import AppRun, check_ledger, latest_checkpoint, wait_gone

    base = [
        "--preset",
        "swe",
        f"swe.task_set={args.task_set}",
        "swe.env=local",
        "swe.tasks=4",
        f"trainer.total_steps={args.app_steps}",
        "trainer.save_every=1",
        "run.agent_workers=2",
        "async_training.staleness_threshold=1.0",
    ]
    root.mkdir(parents=True, exist_ok=True)
    outcomes: list[dict[str, Any]] = []
    runs: list[Any] = []
    segments: list[tuple[Any, int | None]] = []
    try:
        a = AppRun("A", root, base, args.app_timeout)
        runs.append(a)
        a.wait_step(1)
        pid = a.kill_one(b"ray::AgentLoopWorker")
        killed = time.monotonic()
        a.wait_step(a.last_step() + 1)
        rows = a.rows()
        outcomes.append(
            {
                "fault": "agent-loop worker process killed",
                "killed_pid": pid,
                "run_went_on": a.proc.poll() is None,
                "next_step_s": round(time.monotonic() - killed, 1),
                "agent_workers": rows[-1].get("rollout", {}).get("agent_workers"),
            }
        )
        # Right after that step (a checkpoint per step): the resumed run still has steps to train.
        engine_pid = a.kill_one(b"VLLM::EngineCore")
        killed = time.monotonic()
        rc = a.wait_exit()
        detect = time.monotonic() - killed
        _, left = wait_gone(a, 20)
        checkpoint, ck_step = latest_checkpoint(a.out)
        segments.append((a, ck_step))
        b = AppRun("B", root, [*base, f"trainer.resume_from={checkpoint}"], args.app_timeout)
        runs.append(b)
        first = b.wait_step(ck_step + 1)
        outcomes.append(
            {
                "fault": "replica (vLLM engine core) killed",
                "killed_pid": engine_pid,
                "driver_exit": rc,
                "detect_s": round(detect, 1),
                "left": left,
                "resumed_at_step": ck_step + 1,
                "recover_s": round(first - killed, 1),
            }
        )
        rc_b = b.wait_exit()
        segments.append((b, None))
        outcomes.append({"fault": "none: the resumed run ends", "exit": rc_b})
    finally:
        for run in runs:
            run.cleanup()
    book = check_ledger(segments, args.app_steps) if segments else {}
    return {"outcomes": outcomes, "ledger": book}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("task_set", type=Path)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--fault-rate", type=float, default=0.2)
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help=f"the faults drawn from (any of {', '.join(FAULTS)})"
    )
    parser.add_argument("--env", choices=("local", "docker"), default="local")
    parser.add_argument("--skip", default="humanize__humanize.i18n.activate__remove_assign")
    parser.add_argument("--trial-timeout", type=float, default=600.0)
    parser.add_argument("--app-steps", type=int, default=4, help="0: no app stage; else at least 3")
    parser.add_argument("--app-timeout", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    args.task_set = args.task_set.absolute()
    unknown = set(args.faults.split(",")) - set(FAULTS)
    if unknown:
        parser.error(f"--faults: unknown {sorted(unknown)}; choose from {', '.join(FAULTS)}")
    if 0 < args.app_steps < 3:
        parser.error(
            "--app-steps must be 0 or at least 3 (worker kill after step 1, replica kill after step 2)"
        )
    if args.env == "docker":
        os.environ.setdefault("DOCKER_HOST", "unix:///run/arl-docker/docker.sock")
    os.environ.setdefault("ARL_CACHE_DIR", "/tmp/arl-cache")
    from swe_throughput import load_tasks

    tasks = load_tasks(args.task_set, set(filter(None, args.skip.split(","))))
    work = Path(tempfile.mkdtemp(prefix="arl-swe-soak-"))
    before = snapshot(work)
    report: dict[str, Any] = {
        "task_set": str(args.task_set),
        "env": args.env,
        "tasks": len(tasks),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    try:
        if args.trials:
            report["trials"] = asyncio.run(stage_trials(args, tasks, work))
            print(json.dumps(report["trials"], indent=1, default=str), flush=True)
        if args.app_steps:
            report["app"] = stage_app(args, work / "app")
            print(json.dumps(report["app"], indent=1, default=str), flush=True)
    finally:
        time.sleep(2)  # processes reaped, teardown's last writes
        trials = work / "trials"
        trial_dirs = [p.parent for p in trials.rglob("result.json")] if trials.exists() else []
        shutil.rmtree(work / "variants", ignore_errors=True)  # the soak's own fixtures
        if "app" in report or not args.app_steps:  # kept for reading when the app stage failed
            shutil.rmtree(work / "app", ignore_errors=True)  # the app runs' folders (checkpoints, models)
        after = snapshot(work)
        report["hygiene"] = compare(before, after) | {
            "trial_dirs_left": len(trial_dirs),
            "work_bytes_left": after["work_bytes"],
        }
        if (work / "app").exists():
            print(f"# the app stage failed: its runs are kept in {work / 'app'}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
        print(json.dumps(report["hygiene"], indent=1, default=str), flush=True)
        if args.json_out:
            args.json_out.write_text(json.dumps(report, indent=1, default=str))
    t = report.get("trials", {})
    app = report.get("app", {}).get("ledger", {})
    h = report["hygiene"]
    clean = (
        not t.get("lost")
        and not t.get("wrong")
        and not sum(app.get("lost_per_run", [0]))
        and not app.get("consumed_twice")
        and not h["containers_left"]
        and not h["mounts_left"]
        and not h["netns_left"]
        and not h["processes_left"]
    )
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
