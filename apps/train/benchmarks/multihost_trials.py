"""The agent preset across hosts, and Harbor trials per second with one and with two sandbox nodes.

A test bed (arl_train.testbed) on this machine: `head` (the driver, the queue, the rollout actor), `t1`
("trainer"), `r1` ("rollout": the vLLM replica), `s1` and `s2` ("sandbox"; `s1` also declares
"sandbox1"). Two runs of the agent preset on the same warm start and task set:

  1 sandbox node:  `--preset agent` whole (its warm start, then its 12 RL steps), with
                   cluster.sandbox_resource=sandbox1 (both agent-loop workers on s1): does it learn as on
                   one host (first tenth -> last tenth of the reward)?
  2 sandbox nodes: `--steps` RL steps from the same warm start, cluster.sandbox_resource=sandbox (one
                   worker on s1, one on s2)

For each: trials per second over the RL steps after the first (from the rollout side's counters in
metrics.jsonl: trajectories finished / rollout seconds), and the CPU seconds the sandbox nodes spent per
trial (every process of their PID namespaces: the workers, their proxies, the sandboxes; read from
/proc at the first and last of those steps), so the figure that transfers to other machines is CPU-s
per trial (trials/s per sandbox core is its inverse). On one machine both sandbox nodes share its
cores: a second node adds no cores here, it spreads the same work over two hosts.

    sudo uv run python apps/train/benchmarks/multihost_trials.py [--steps 4] [--root /tmp/arl-trials]

The first run warm-starts the model (the preset's SFT, minutes); the second reuses its model and tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from arl_train import testbed
from arl_train.faults import AppRun
from arl_train.testbed import NodeSpec
from arl_train.warm_start import AGENT_CONFIG

NODES = [
    NodeSpec("head", {}, head=True),
    NodeSpec("t1", {"trainer": 1}),
    NodeSpec("r1", {"rollout": 1}),
    NodeSpec("s1", {"sandbox": 1, "sandbox1": 1}),
    NodeSpec("s2", {"sandbox": 1}),
]
TICKS = os.sysconf("SC_CLK_TCK")
PRESET_STEPS = 12  # configs/agent.toml's trainer.total_steps


def namespace_cpu_s(init_pid: int) -> float:
    """CPU seconds of every process in the PID namespace of `init_pid`, those reaped included (their
    time is in their reapers' cutime/cstime; the namespace's init reaps its orphans)."""
    try:
        ns = os.readlink(f"/proc/{init_pid}/ns/pid")
    except OSError:
        return 0.0
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "pid") != ns:
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / TICKS


def measure(bed: testbed.TestBed, run: AppRun, steps: int, sandboxes: list[str]) -> dict:
    """Wait through the run's steps; trials/s and sandbox CPU-s per trial over steps 2..steps, and the
    reward of the first and last tenth of the steps."""
    run.wait_step(1)
    cpu0 = sum(namespace_cpu_s(bed.nodes[s].init_pid) for s in sandboxes)
    first = run.rows()[-1]["rollout"]
    run.wait_step(steps)
    cpu1 = sum(namespace_cpu_s(bed.nodes[s].init_pid) for s in sandboxes)
    last = run.rows()[-1]["rollout"]
    code = run.wait_exit()
    trials = last["trajectories"] - first["trajectories"]
    seconds = last["elapsed_s"] - first["elapsed_s"]
    rewards = [r["reward_mean"] for r in run.rows()]
    tenth = max(1, len(rewards) // 10)
    return {
        "exit": code,
        "trials": trials,
        "seconds": round(seconds, 1),
        "trials_per_s": round(trials / seconds, 3),
        "sandbox_cpu_s": round(cpu1 - cpu0, 1),
        "cpu_s_per_trial": round((cpu1 - cpu0) / max(1, trials), 3),
        "reward_first_tenth": round(sum(rewards[:tenth]) / tenth, 3),
        "reward_last_tenth": round(sum(rewards[-tenth:]) / tenth, 3),
        "reward_mean": [round(r, 3) for r in rewards],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="RL steps per run (the first is not measured)")
    ap.add_argument("--root", default="/tmp/arl-trials", help="the bed's shared folder and logs")
    args = ap.parse_args()
    reason = testbed.unavailable()
    if reason:
        print(f"multihost_trials: {reason}", file=sys.stderr)
        return 2
    root = Path(args.root)
    results = {}
    with testbed.bed(root / "shared", NODES, log_dir=root / "logs") as bed:

        def launch(argv, **kw):
            return bed.popen("head", argv, **kw)

        base = [f"ray.address={bed.address}", f"storage.shared_dir={bed.shared_dir}", "run.agent_workers=2"]
        one = AppRun(
            "one",
            bed.shared_dir,
            ["--preset", "agent", *base, "cluster.sandbox_resource=sandbox1"],
            timeout_s=3600,
            launch=launch,
        )
        try:
            results["1 sandbox node"] = measure(bed, one, PRESET_STEPS, ["s1"])
        finally:
            one.cleanup()
        warm = one.out
        two = AppRun(
            "two",
            bed.shared_dir,
            [
                "--config",
                str(AGENT_CONFIG),
                *base,
                f"trainer.total_steps={args.steps}",
                "trainer.save_final=false",
                f"model.path={warm / 'model_sft'}",
                f"data.source=harbor:{warm / 'tasks'}",
                "cluster.sandbox_resource=sandbox",
            ],
            timeout_s=3600,
            launch=launch,
        )
        try:
            results["2 sandbox nodes"] = measure(bed, two, args.steps, ["s1", "s2"])
        finally:
            two.cleanup()
    print(json.dumps(results, indent=2))
    print(
        f"{'sandbox nodes':>15} {'trials':>7} {'s':>7} {'trials/s':>9} {'sandbox CPU-s/trial':>20} {'reward':>14}"
    )
    for name, r in results.items():
        print(
            f"{name:>15} {r['trials']:>7} {r['seconds']:>7} {r['trials_per_s']:>9} {r['cpu_s_per_trial']:>20} "
            f"{r['reward_first_tenth']:>6} -> {r['reward_last_tenth']}"
        )
    return 0 if all(r["exit"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
