"""How much a few colocated steps of a long-tail workload can tell, and what "one GPU counted twice" misses.

    uv run python apps/bench/benchmarks/colocated_tail_spread.py \\
        [--calibration apps/bench/calibration/h200_measured.toml]

A colocated (synchronous) step generates P prompts × n responses and waits for the last one; on the
built-in long-tail source every response of a prompt has its prompt's length, so a step's generation
time is set by the longest of P lognormal draws. This evaluates the simulator's fluid model (the
calibration's decode curve: running sequences share `rate(batch)`) on many independent steps and prints:
  - the spread of one step's generation time, and of the mean over `--measured-steps` steps (what the
    2×H200 compare averaged: 4);
  - R replicas in lockstep (a real colocated step on R GPUs waits for the slowest replica) against one
    replica's step counted R times (the compare's `--colocated-scale`, an upper bound for colocated),
    as samples/s with the given train and sync seconds per step.
No GPU; seconds of CPU.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tomllib
from pathlib import Path

from arl.rollout.longtail import LongTailSpec, sample_lengths
from arl.rollout.testing import DecodeCost

HERE = Path(__file__).resolve().parents[1]


def step_generation_s(prompt_lengths: list[int], n: int, cost: DecodeCost) -> float:
    """One synchronous batch (every sequence admitted at once) decoded to its last token."""
    remaining = sorted(length for length in prompt_lengths for _ in range(n))
    running, done, elapsed = len(remaining), 0, 0.0
    for length in remaining:
        if length > done:  # every running sequence advances by (length − done) tokens at rate/running each
            elapsed += (length - done) * running / cost.rate(running)
            done = length
        running -= 1
    return elapsed


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calibration", default=str(HERE / "calibration" / "h200_measured.toml"))
    ap.add_argument("--source-median", type=int, default=659)
    ap.add_argument("--p99-ratio", type=float, default=6.27)
    ap.add_argument("--max-len", type=int, default=8192)
    ap.add_argument("--prompts-per-replica", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--measured-steps", type=int, default=4)
    ap.add_argument("--train-s", type=float, default=1.52, help="training seconds per step (2×H200 compare)")
    ap.add_argument(
        "--sync-s", type=float, default=0.25, help="sleep + wake + sync seconds per step (same run)"
    )
    ap.add_argument("--steps", type=int, default=4000, help="independent steps drawn")
    args = ap.parse_args()

    decode = tomllib.loads(Path(args.calibration).read_text())["decode"]
    cost = DecodeCost(batch_sizes=decode["batch_sizes"], tokens_per_s=decode["tokens_per_s"])
    spec = LongTailSpec(median=args.source_median, p99_ratio=args.p99_ratio, max=args.max_len)
    p = args.prompts_per_replica
    lengths = sample_lengths(spec, p * args.steps, seed=0)
    one = [step_generation_s(lengths[i : i + p], args.n, cost) for i in range(0, len(lengths), p)]
    rng = random.Random(0)
    means = [statistics.mean(rng.sample(one, args.measured_steps)) for _ in range(args.steps)]
    lockstep = [
        max(one[i : i + args.replicas]) for i in range(0, len(one) - args.replicas + 1, args.replicas)
    ]
    prompts = p * args.replicas
    counted = prompts / (statistics.mean(one) + args.train_s + args.sync_s)
    real = prompts / (statistics.mean(lockstep) + args.train_s + args.sync_s)
    result = {
        "one_step_generation_s": {
            "mean": statistics.mean(one),
            "p05": percentile(one, 0.05),
            "p95": percentile(one, 0.95),
        },
        f"mean_of_{args.measured_steps}_steps_s": {
            "p05": percentile(means, 0.05),
            "median": percentile(means, 0.5),
            "p95": percentile(means, 0.95),
        },
        f"lockstep_{args.replicas}_replicas_generation_s": statistics.mean(lockstep),
        "samples_per_s_one_replica_counted": counted,
        "samples_per_s_replicas_in_lockstep": real,
        "lockstep_over_counted": real / counted,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
