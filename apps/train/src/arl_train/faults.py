"""Fault injection: run the app, inject faults on a schedule, check the sample ledger after each.

One chain of app runs (CPU, tiny model, in-tree torch engine by default), each resumed from the latest
checkpoint of the one before:

  run A: a generation stalls past `rollout.generate_timeout_s` (the engine replica is SIGSTOPped for
         twice that, then SIGCONTed): the run goes on, the stalled prompts are dropped and counted
         (repeated up to 3 times if a stall caught no generation in flight); later the trainer
         actor is SIGKILLed: the driver must fail within seconds.
  run B: resumed from A's latest checkpoint; the rollout engine is SIGKILLed (the rollout actor, or
         vLLM's EngineCore process with --engine vllm): the driver must fail within seconds.
  run C: resumed from B; the driver is SIGKILLed: no process of the run may outlive it (watchdog).
  run D: resumed from C; runs to the end (exit 0, engine weights equal the trainer's).
Besides the chain: a copy of a checkpoint with one byte of its queue snapshot flipped must be refused
by name before anything starts (exit 2), and malformed requests to the chat proxy (in front of a real
engine) must get 4xx answers, record nothing, and leave it serving.

The ledger (arl_train.ledger: uids produced by the rollout side, uids taken by the trainer with their
step) is checked over the committed history, i.e. each run's steps up to the checkpoint the next run
resumed from: every sample produced is consumed exactly once, or is still queued in the final
checkpoint, or was produced after a checkpoint and rolled back with it (its task re-run by the resumed
run), or was dropped with a counted reason; anything else is lost. Steps and weight versions of the
committed history must run 1..T without a gap. Prints one table (fault → outcome → samples lost →
time to recover) and a JSON block ($OUT/faults.json when $OUT is set).

A module of the app so that tests (tests/test_faults.py) and other harnesses (benchmarks/swe_soak.py)
import it; its command line is the benchmark script:

    uv run python apps/train/benchmarks/faults.py            # ~4 min on 2 busy cores
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from arl_train import ledger
from arl_train.watchdog import MARKER, run_processes

# The app's command line (what `uv run apps/train` runs), in this interpreter.
APP = [sys.executable, "-m", "arl_train.cli"]
COMMON = [
    "actor.ppo_mini_batch_size=2",
    "rollout.n=2",
    "rollout.max_tokens=8",
    "async_training.staleness_threshold=1.0",
    "trainer.save_every=1",
]
# Steps the final run (D) takes after its resume point before it ends normally.
FINAL_STEPS = 3


@dataclass
class Outcome:
    fault: str
    outcome: str
    ok: bool
    samples_lost: int | None
    recover_s: float | None
    detail: dict[str, Any] = field(default_factory=dict)


class AppRun:
    """One app process (the driver) with its own output folder, run id and Ray temp dir.

    `launch(argv, env=, stdout=, stderr=)` starts it (default: here, `subprocess.Popen`; a multi-host
    test bed passes its `TestBed.popen` bound to the head node)."""

    def __init__(
        self,
        name: str,
        root: Path,
        overrides: list[str],
        timeout_s: float,
        launch: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
    ) -> None:
        self.name, self.out, self.timeout_s = name, root / name, timeout_s
        self.run_id = uuid.uuid4().hex[:12]
        self.ray_tmp = tempfile.mkdtemp(prefix="arlf-", dir="/tmp")  # short: Ray's AF_UNIX socket paths
        self.log = root / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if k != MARKER} | {
            MARKER: self.run_id,
            "ARL_RAY_TMP": self.ray_tmp,
        }
        self.proc = launch(
            [*APP, *overrides, f"output.dir={self.out}"],
            env=env,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )

    def rows(self) -> list[dict[str, Any]]:
        path = self.out / "metrics.jsonl"
        if not path.is_file():
            return []
        rows = []
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line being written
        return rows

    def last_step(self) -> int:
        rows = self.rows()
        return rows[-1]["step"] if rows else 0

    def wait_step(self, step: int) -> float:
        """Wait until the run has logged `step`; returns the time it was seen."""
        deadline = time.monotonic() + self.timeout_s
        while self.last_step() < step:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"run {self.name} exited ({self.proc.returncode}) before step {step}: {self.tail()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"run {self.name} did not reach step {step} in {self.timeout_s}s: {self.tail()}"
                )
            time.sleep(0.2)
        return time.monotonic()

    def _cmdlines(self) -> list[tuple[int, bytes]]:
        """(pid, command line) of the run's processes, the driver's own left out (gone ones skipped)."""
        found = []
        for pid in run_processes(self.run_id, exclude={self.proc.pid}, nested=True):
            try:
                found.append((pid, Path(f"/proc/{pid}/cmdline").read_bytes()))
            except OSError:
                pass
        return found

    def pids(self, title: bytes) -> list[int]:
        return [pid for pid, cmdline in self._cmdlines() if cmdline.startswith(title)]

    def titles(self) -> list[str]:
        """The command lines (first 200 characters) of the run's processes, the driver's own left out."""
        return [
            cmdline[:200].replace(b"\0", b" ").decode(errors="replace") for _, cmdline in self._cmdlines()
        ]

    def kill_one(self, title: bytes, sig: signal.Signals = signal.SIGKILL) -> int:
        pids = self.pids(title)
        if not pids:
            raise RuntimeError(f"run {self.name}: no process titled {title!r}")
        os.kill(pids[0], sig)
        return pids[0]

    def wait_exit(self) -> int:
        return self.proc.wait(self.timeout_s)

    def tail(self, n: int | None = 1500) -> str:
        """The last `n` characters of the run's log (all of it when `n` is None)."""
        if not self.log.is_file():
            return ""
        text = self.log.read_text()
        return text if n is None else text[-n:]

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


def adam_steps(checkpoint: Path) -> set[float]:
    """The Adam step counts in a single-rank checkpoint's optimizer state (one per parameter)."""
    import torch

    state = torch.load(checkpoint / "optimizer.pt", weights_only=True)["state"]
    return {float(s["step"]) for s in state.values()}


def latest_checkpoint(out: Path) -> tuple[Path, int]:
    """The run's newest complete `checkpoints/step_N` and its step (`checkpointing.latest_checkpoint`)."""
    from arl_train.checkpointing import latest_checkpoint as newest

    found = newest(out)
    if found is None:
        raise RuntimeError(f"no checkpoint under {out}")
    return found


def wait_gone(run: AppRun, timeout_s: float) -> tuple[float, list[int]]:
    """Wait until no process of `run` is left; returns the seconds waited and the pids still left."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        left = run_processes(run.run_id, nested=True)
        if not left:
            return time.monotonic() - start, []
        time.sleep(0.2)
    return time.monotonic() - start, run_processes(run.run_id, nested=True)


# ----- the ledger over the committed history ---------------------------------------------------------
def check_ledger(segments: list[tuple[AppRun, int | None]], total_steps: int) -> dict[str, Any]:
    """`segments`: each run with the checkpoint step the next run resumed from (None for the last run).

    Returns counts: produced, consumed_once, consumed_twice, queued_at_end, rolled_back (re-run by a
    later run), pending_replay (rolled back, its task listed for replay in the final checkpoint), dropped
    (by reason), lost (per run), phantom (consumed, never produced), and whether steps/versions are
    continuous.
    """
    from arl.queue.persistence import read_snapshot

    produced: list[tuple[int, dict[str, Any]]] = []
    committed: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    dropped: dict[str, int] = {"generate_timeout": 0, "every_trajectory_failed": 0, "version_lag": 0}
    taken_any: dict[str, int] = {}  # uid -> the step it was last taken for, in any run (for the report)
    for i, (run, upto) in enumerate(segments):
        made, taken = ledger.read(run.out / "ledger")
        produced += [(i, r) for r in made]
        taken_any |= {r["uid"]: r["step"] for r in taken}
        committed += [r for r in taken if upto is None or r["step"] <= upto]
        run_rows = run.rows()
        rows += [r for r in run_rows if upto is None or r["step"] <= upto]
        if run_rows:  # the rollout side's drop counters as of the run's last logged step
            dropped["generate_timeout"] += int(run_rows[-1]["rollout"].get("dropped_timeout", 0))
            dropped["every_trajectory_failed"] += int(run_rows[-1]["rollout"].get("dropped_failed", 0))
            dropped["version_lag"] += int(run_rows[-1].get("dropped_version_lag_total", 0))
    final = segments[-1][0].out / "checkpoint"
    queued_at_end = {s.uid for s in read_snapshot(final)} if final.is_dir() else set()
    # Tasks the final checkpoint still lists to replay: a long replay backlog (many prompts dropped by a
    # stall) can outlast the runs after it; the next resume re-runs them, so their samples are not lost.
    final_state = final / "trainer_state.json"
    pending_at_end = (
        set(json.loads(final_state.read_text()).get("task_ids_in_flight", []))
        if final_state.is_file()
        else set()
    )
    counts: dict[str, int] = {}
    for r in committed:
        counts[r["uid"]] = counts.get(r["uid"], 0) + 1
    produced_uids = {r["uid"] for _, r in produced}
    tasks_by_run: dict[int, set[str]] = {}
    for i, r in produced:
        tasks_by_run.setdefault(i, set()).add(r["task_id"])
    lost = [0] * len(segments)
    lost_samples: list[dict[str, Any]] = []  # what each lost sample was, for the report
    rolled_back = pending_replay = 0
    for i, r in produced:
        if counts.get(r["uid"], 0) >= 1 or r["uid"] in queued_at_end:
            continue
        later = set().union(*(tasks_by_run.get(j, set()) for j in range(i + 1, len(segments))))
        if r["task_id"] in later:
            rolled_back += 1  # produced after the checkpoint the next run resumed from; its task re-ran
        elif i + 1 < len(segments) and r["task_id"] in pending_at_end:
            pending_replay += 1  # rolled back too; its task waits in the final checkpoint's replay list
        else:
            lost[i] += 1
            lost_samples.append(
                {
                    **r,
                    "run": i,
                    "resumed_from_step": segments[i][1],
                    "taken_for_step": taken_any.get(r["uid"]),
                }
            )
    steps = [r["step"] for r in rows]
    versions = [r["version"] for r in rows]
    return {
        "produced": len(produced_uids),
        "consumed_once": sum(1 for c in counts.values() if c == 1),
        "consumed_twice": sum(1 for c in counts.values() if c > 1),
        "queued_at_end": len(queued_at_end),
        "rolled_back": rolled_back,
        "pending_replay": pending_replay,
        "dropped": dropped,
        "lost_per_run": lost,
        "lost_samples": lost_samples,
        "phantom": len(set(counts) - produced_uids),
        "steps_continuous": steps == list(range(1, total_steps + 1)),
        "versions_continuous": versions == steps,
    }


# ----- faults that need no training run ------------------------------------------------------------
def fault_corrupt_snapshot(checkpoint: Path, root: Path, total_steps: int) -> Outcome:
    from arl.queue.errors import CorruptSnapshotError
    from arl.queue.persistence import SNAPSHOT_FILENAME, read_snapshot

    copy = root / "corrupt_checkpoint"
    shutil.copytree(checkpoint, copy)
    snapshot = copy / SNAPSHOT_FILENAME
    data = bytearray(snapshot.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit mid-payload
    snapshot.write_bytes(bytes(data))
    started = time.monotonic()
    proc = subprocess.run(
        [
            *APP,
            *COMMON,
            f"trainer.resume_from={copy}",
            f"trainer.total_steps={total_steps}",
            f"output.dir={root / 'corrupt_out'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    refused_s = time.monotonic() - started
    try:
        read_snapshot(copy)
        direct = "loaded"
    except CorruptSnapshotError as exc:
        direct = str(exc)
    named = str(snapshot) in proc.stderr
    ok = proc.returncode == 2 and named and not (root / "corrupt_out").exists() and str(snapshot) in direct
    return Outcome(
        "corrupt queue snapshot",
        f"refused by name before start (exit {proc.returncode})"
        if ok
        else f"NOT refused as expected (exit {proc.returncode})",
        ok,
        0,
        round(refused_s, 1),
        {"stderr": proc.stderr.strip()[-300:], "read_snapshot": direct[-200:]},
    )


async def _proxy_fault(model_dir: Path) -> dict[str, Any]:
    import aiohttp
    from transformers import AutoTokenizer

    from arl.proxy import ChatProxy, ProxyConfig
    from arl.rollout import ServerManager
    from arl.rollout.engines.torch_engine import TorchEngine, TorchEngineConfig

    engine = TorchEngine(TorchEngineConfig(model_path=str(model_dir)))
    await engine.start()
    statuses: dict[str, int] = {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        async with ChatProxy(
            tokenizer, ServerManager([engine], generate_timeout_s=60), ProxyConfig(max_body_bytes=1 << 16)
        ) as proxy:
            session = proxy.open_session()
            url = f"{session.base_url}/chat/completions"
            good = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            bad: dict[str, Any] = {
                "not json": b"{not json",
                "json array": b"[1, 2]",
                "no messages": json.dumps({"model": "m"}).encode(),
                "messages not a list": json.dumps({"model": "m", "messages": "hi"}).encode(),
                "message without role": json.dumps({"model": "m", "messages": [{"content": "hi"}]}).encode(),
                "unknown role": json.dumps(
                    {"model": "m", "messages": [{"role": "wizard", "content": "x"}]}
                ).encode(),
                "max_tokens negative": json.dumps(good | {"max_tokens": -5}).encode(),
                "max_tokens a string": json.dumps(good | {"max_tokens": "many"}).encode(),
                "temperature negative": json.dumps(good | {"temperature": -1}).encode(),
                "body too large": json.dumps(
                    good | {"messages": [{"role": "user", "content": "x" * 100_000}]}
                ).encode(),
                "unknown session": None,
            }
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
                for name, body in bad.items():
                    target = url.replace(session.id, "no-such-session") if body is None else url
                    async with http.post(
                        target,
                        data=body if body is not None else json.dumps(good).encode(),
                        headers={"Content-Type": "application/json"},
                    ) as resp:
                        statuses[name] = resp.status
                        await resp.read()
                async with http.post(url, json=good) as resp:
                    statuses["valid request after"] = resp.status
                    reply = await resp.json()
            trajectory = proxy.pop_session(session.id)
    finally:
        await engine.stop()
    return {
        "statuses": statuses,
        "turns_recorded": trajectory.num_turns,
        "completion_tokens": reply.get("usage", {}).get("completion_tokens"),
    }


def fault_proxy(model_dir: Path) -> Outcome:
    started = time.monotonic()
    result = asyncio.run(_proxy_fault(model_dir))
    statuses = result["statuses"]
    rejected = {k: v for k, v in statuses.items() if k != "valid request after"}
    ok = (
        all(400 <= v < 500 for v in rejected.values())
        and statuses["valid request after"] == 200
        and result["turns_recorded"] == 1
    )
    return Outcome(
        "malformed proxy requests",
        f"{sum(400 <= v < 500 for v in rejected.values())}/{len(rejected)} answered 4xx, then served"
        if ok
        else f"unexpected answers {statuses}",
        ok,
        0,
        round(time.monotonic() - started, 1),
        result,
    )


# ----- the chain -----------------------------------------------------------------------------------
def run_chain(
    root: Path, engine: str, total_steps: int, timeout_s: float
) -> tuple[list[Outcome], dict[str, Any]]:
    base = [*COMMON, f"rollout.engine={engine}", f"trainer.total_steps={total_steps}"]
    # Each replica is its own Ray actor (arl_train.engine_actor); vLLM's engine core is a process of it.
    engine_title = b"ray::EngineActor" if engine == "torch" else b"VLLM::EngineCore"
    outcomes: list[Outcome] = []
    runs: list[AppRun] = []
    segments: list[tuple[AppRun, int | None]] = []
    try:
        # run A: a stalled generation, then the trainer actor killed
        # Longer answers here keep generations in flight (not parked on a full queue) when the stall hits;
        # a stall that catches none (the actor was idle or paused for a sync) is repeated.
        a = AppRun("A", root, [*base, "rollout.generate_timeout_s=4", "rollout.max_tokens=32"], timeout_s)
        runs.append(a)
        a.wait_step(1)
        drops, attempts = 0, 0
        while drops == 0 and attempts < 3:
            attempts += 1
            a.wait_step(a.last_step() + 1)
            stopped = a.kill_one(engine_title, signal.SIGSTOP)
            time.sleep(8.0)  # twice the generate timeout
            os.kill(stopped, signal.SIGCONT)
            resumed_at = time.monotonic()
            step_at = a.last_step()
            next_step_t = a.wait_step(step_at + 1)
            a.wait_step(step_at + 2)
            drops = a.rows()[-1]["rollout"].get("dropped_timeout", 0)
        outcomes.append(
            Outcome(
                "generation stalls past its timeout",
                f"run continued; {drops} prompt(s) dropped as generate_timeout",
                drops >= 1 and a.proc.poll() is None,
                None,
                round(next_step_t - resumed_at, 1),
                {"dropped_timeout": drops, "stalls": attempts},
            )
        )
        b = _kill_and_resume(
            a,
            b"ray::TrainerActor",
            "trainer actor killed, resumed",
            base,
            root,
            "B",
            outcomes,
            segments,
            timeout_s,
        )
        runs.append(b)
        c = _kill_and_resume(
            b, engine_title, "rollout engine killed, resumed", base, root, "C", outcomes, segments, timeout_s
        )
        runs.append(c)
        # run C: the driver killed; nothing may outlive it (its own Ray included)
        c.wait_step(c.last_step() + 1)
        running = c.titles()
        killed = time.monotonic()
        os.kill(c.proc.pid, signal.SIGKILL)
        c.proc.wait(30)
        gone_s, left = wait_gone(c, 20)
        checkpoint, ck_step = latest_checkpoint(c.out)
        segments.append((c, ck_step))
        # run D ends FINAL_STEPS after its resume point: the chain's subject is the resume, not more steps.
        end_step = min(total_steps, ck_step + FINAL_STEPS)
        d = AppRun(
            "D",
            root,
            [*base, f"trainer.resume_from={checkpoint}", f"trainer.total_steps={end_step}"],
            timeout_s,
        )
        runs.append(d)
        first = d.wait_step(ck_step + 1)
        outcomes.append(
            Outcome(
                "driver SIGKILLed, resumed",
                f"{len(left)} process(es) left {gone_s:.1f}s after; resumed at step {ck_step + 1}",
                not left,
                None,
                round(first - killed, 1),
                {"cleanup_s": round(gone_s, 1), "left": left, "running_before": running},
            )
        )
        rc = d.wait_exit()
        segments.append((d, None))
        summary = (
            json.loads((d.out / "summary.json").read_text()) if (d.out / "summary.json").is_file() else {}
        )
        if rc != 0:
            raise RuntimeError(f"the final run exited {rc}: {d.tail()}")
        outcomes.append(fault_corrupt_snapshot(checkpoint, root, end_step))
        model = a.out / "model"
        outcomes.append(fault_proxy(model))
    finally:
        for run in runs:
            run.cleanup()
    book = check_ledger(segments, end_step)
    # A sample lost is charged to the fault that ended the run that produced it (the stall shares run A
    # with the trainer kill); the last run's are charged to its normal end.
    lost = book["lost_per_run"]
    ended_by = {
        "generation stalls past its timeout": 0,
        "trainer actor killed, resumed": 0,
        "rollout engine killed, resumed": 1,
        "driver SIGKILLed, resumed": 2,
    }
    for o in outcomes:
        if o.fault in ended_by:
            o.samples_lost = lost[ended_by[o.fault]]
    outcomes.append(
        Outcome(
            "none: the resumed run ends normally",
            f"exit 0, final checkpoint holds {book['queued_at_end']} queued"
            + (f", {book['pending_replay']} rolled-back task(s) to replay" if book["pending_replay"] else ""),
            True,
            lost[3],
            None,
        )
    )
    book["final_run"] = {k: summary.get(k) for k in ("steps", "syncs", "weights_equal_after_sync")}
    # The optimizer carried over three resumes: its final checkpoint counts every update of the chain.
    book["final_run"] |= {"end_step": end_step, "adam_steps": sorted(adam_steps(d.out / "checkpoint"))}
    return outcomes, book


def _kill_and_resume(
    run: AppRun,
    title: bytes,
    fault: str,
    base: list[str],
    root: Path,
    name: str,
    outcomes: list[Outcome],
    segments: list[tuple[AppRun, int | None]],
    timeout_s: float,
) -> AppRun:
    """SIGKILL one process of `run` after its next step, time how fast the driver fails, resume from
    its latest checkpoint as run `name`, and time until the resumed run's first step."""
    run.wait_step(run.last_step() + 1)
    killed = time.monotonic()
    pid = run.kill_one(title)
    rc = run.wait_exit()
    detected_s = time.monotonic() - killed
    gone_s, left = wait_gone(run, 20)
    checkpoint, ck_step = latest_checkpoint(run.out)
    segments.append((run, ck_step))
    nxt = AppRun(name, root, [*base, f"trainer.resume_from={checkpoint}"], timeout_s)
    first = nxt.wait_step(ck_step + 1)
    # The whole log: Ray may print more (worker deaths, teardown) after the driver's own error line.
    reason = next((line for line in run.tail(None).splitlines() if "arl-train: the run failed" in line), "")
    outcomes.append(
        Outcome(
            fault,
            f"driver failed in {detected_s:.1f}s (exit {rc}); resumed at step {ck_step + 1}",
            rc not in (0, None) and detected_s < 60 and not left,
            None,
            round(first - killed, 1),
            {"killed_pid": pid, "detect_s": round(detected_s, 1), "reason": reason[-240:], "left": left},
        )
    )
    return nxt


def format_table(outcomes: list[Outcome]) -> str:
    head = ("fault", "outcome", "samples lost", "time to recover (s)")
    lines = [f"| {' | '.join(head)} |", "|---|---|---|---|"]
    for o in outcomes:
        mark = "" if o.ok else " **FAILED**"
        lines.append(f"| {o.fault} | {o.outcome}{mark} | {o.samples_lost} | {o.recover_s} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="inject faults into apps/train runs and check the sample ledger"
    )
    parser.add_argument("--engine", choices=["torch", "vllm"], default="torch")
    parser.add_argument("--total-steps", type=int, default=40)
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per wait (start, step, exit)")
    parser.add_argument(
        "--dir", type=Path, default=None, help="keep the runs here (default: a temp dir, removed)"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("ARL_CACHE_DIR", "/tmp/arl-cache")
    root = args.dir or Path(tempfile.mkdtemp(prefix="arl-faults-"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    outcomes, book = run_chain(root, args.engine, args.total_steps, args.timeout_s)
    print(format_table(outcomes))
    result = {
        "engine": args.engine,
        "total_steps": args.total_steps,
        "wall_s": round(time.monotonic() - started, 1),
        "ledger": book,
        "faults": [asdict(o) for o in outcomes],
    }
    print(json.dumps(result, indent=1))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "faults.json").write_text(json.dumps(result, indent=1))
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    clean = (
        all(o.ok for o in outcomes)
        and sum(book["lost_per_run"]) == 0
        and not book["consumed_twice"]
        and not book["phantom"]
        and book["steps_continuous"]
        and book["versions_continuous"]
    )
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
