"""Loss-convention sweep (issue #29): a task under each choice of each convention, several seeds.

Runs apps/train (this interpreter on apps/train/__main__.py: start the sweep with `uv run python`)
`--jobs` runs at a time on a workload (`--workload`, WORKLOADS: the embedded default's digits task, a
learnable long tail on the CPU, or one on one H200), in mode d with staleness_threshold 1 and partial
rollouts so that stale and mixed-version tokens reach the loss, then summarises each run's
metrics.jsonl: reward (mean of the first / last tenth of the steps, first step with reward_mean >= 0.9,
the curve in tenths), grad_norm (max, median, max/median: spikes; CV and step-to-step jitter), ppo_kl
(mean |ppo_kl|), clip_frac / clip_band_frac (means), the off-policy gap (tis_clip_frac,
behaviour_proximal_abs_diff) and the fraction of sequences masked by sequence-level IS
(Σ seq_is_masked_count / Σ num_seqs). With one optimizer update per step (the CPU workloads) the PPO
ratio is 1 at the update, so ppo_kl and clip_frac are 0 by construction; staleness shows in the
behaviour→proximal gap instead.

    uv run packages/arl-trainer/benchmarks/conventions_sweep.py --arms kl_k3,kl_clamped \
        --seeds 0,1,2 --steps 100 --jobs 2 --out runs/conventions
    uv run packages/arl-trainer/benchmarks/conventions_sweep.py --summarize --out runs/conventions

A finished run (its summary.json present) is not run again; the summary table goes to stdout and
`<out>/sweep.json` (with each arm's reward curve in tenths of the run), the reward and gradient-norm
curves (each arm's mean over its seeds) to `<out>/curves.png`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

# Stale tokens on the CPU too: mode d, staleness_threshold 1, partial rollouts (aborted generations
# resume under the next weights, so a response mixes versions).
BASE = [
    "--mode",
    "d",
    "async_training.staleness_threshold=1",
    "async_training.partial_rollout=true",
    "trainer.save_final=false",
]
KL = ["actor.algorithm.kl_coef=0.1"]
# Sequence-IS bounds from the workload (`Workload.seq_is_band`), chosen so that masking happens often
# enough to matter.
SEQ_IS = [
    'actor.algorithm.seq_is="mask"',
    "actor.algorithm.seq_is_low={seq_is_low}",
    "actor.algorithm.seq_is_high={seq_is_high}",
]
SUM_NORM = ['actor.loss_agg_mode="seq-mean-token-sum-norm"']
ARMS: dict[str, list[str]] = {
    "kl_k3": [*KL, 'actor.algorithm.kl_estimator="k3"'],
    "kl_clamped": [*KL, 'actor.algorithm.kl_estimator="low_var_kl"'],
    "seqis_keep": [*SEQ_IS, 'actor.algorithm.seq_is_mask_denominator="keep"'],
    "seqis_remove": [*SEQ_IS, 'actor.algorithm.seq_is_mask_denominator="remove"'],
    # The geometric mean stays near 1 on digits (no sequence masked at [0.9, 1.1]); the product (the
    # exact sequence ratio over ~12 tokens) leaves the band often enough to compare the denominators.
    "seqis_prod_keep": [
        *SEQ_IS,
        'actor.algorithm.seq_is_agg="product"',
        'actor.algorithm.seq_is_mask_denominator="keep"',
    ],
    "seqis_prod_remove": [
        *SEQ_IS,
        'actor.algorithm.seq_is_agg="product"',
        'actor.algorithm.seq_is_mask_denominator="remove"',
    ],
    "norm_batch_max": [*SUM_NORM, 'actor.algorithm.norm_len_mode="batch_max"'],
    # The constant is the workload's generation budget (rollout.max_tokens).
    "norm_constant": [
        *SUM_NORM,
        'actor.algorithm.norm_len_mode="constant"',
        "actor.algorithm.norm_len={budget}",
    ],
}


@dataclass(frozen=True)
class Workload:
    """The task each run trains on: an app config (None: the embedded default), overrides, the
    generation budget (the constant of `norm_constant`), the prompts one trainer step consumes, the
    optimizer updates it makes of them (default; `--updates` sets it) and the seq-IS arms' band."""

    config: str | None
    overrides: tuple[str, ...]
    budget: int
    prompts_per_step: int = 8
    updates: int = 1
    # [seq_is_low, seq_is_high] of the seq_is arms. The CPU workloads' responses are ~12 tokens: the
    # product of their ratios left [0.9, 1.1] for about half the sequences (measured).
    seq_is_band: tuple[float, float] = (0.9, 1.1)


# digits: the embedded default (responses use the whole budget of 12, so a batch's longest response is
# the budget). longtail: response lengths from a lognormal (median 8, p99 32, at most 48;
# arl.rollout.longtail), so a batch's longest response moves from step to step, with the digits reward
# (the share of digit characters, which the model learns). h200_longtail: the same on one H200 (the
# random Qwen3-0.6B shape, vLLM, 16 prompts × 8 per step, lengths median 256 / p99 ≈ 1,600, at most
# 2,048), time-sliced on the shared GPU; two optimizer updates per step, so that the PPO ratio moves
# away from 1 within a step and ppo_kl / clip_frac measure something (the CPU workloads do with
# `--updates 2`). Its lr: at 3e-5 this shape learned
# the reward in 13 steps on the CPU (arl-trainer BENCHMARKS.md), so 1.5e-5 spreads it over ~30.
WORKLOADS: dict[str, Workload] = {
    "digits": Workload(None, (), 12),
    "longtail": Workload(
        None,
        ('data.source="builtin:longtail?median=8&p99_ratio=4&max=48&reward=digits"', "rollout.max_tokens=48"),
        48,
    ),
    "h200_longtail": Workload(
        "apps/bench/configs/h200x2.toml",
        (
            'data.source="builtin:longtail?median=256&p99_ratio=6.27&max=2048&reward=digits"',
            "rollout.max_tokens=2048",
            "rollout.max_model_len=2304",
            "resources.shared_gpu=time_sliced",
            "actor.optim.lr=1.5e-5",
        ),
        2048,
        prompts_per_step=16,
        updates=2,
        # ~300-token responses: behaviour and proximal log probs differed by 0.065 per token (mean abs, the
        # norm arms' GPU runs), so a product's log drifts by ~1 over a sequence and [0.9, 1.1] would mask
        # nearly every one; [0.5, 2] masked 43-46% in the GPU runs (packages/arl-trainer/BENCHMARKS.md).
        seq_is_band=(0.5, 2.0),
    ),
}


def app_command() -> list[str]:
    """How to start apps/train: with this interpreter (`uv run python …` locally puts it in the workspace's
    environment; tools/README.md's staged environment puts the packages on PYTHONPATH). Not `uv run
    apps/train`: where uv is installed but the workspace is not synced, it would try to resolve it."""
    return [sys.executable, "apps/train/__main__.py"]


def step_rows(folder: Path) -> list[dict[str, float]]:
    """The trainer steps of a run's metrics.jsonl (rows with a reward); [] when it has none yet."""
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "reward_mean" in r]


def summarize_run(folder: Path) -> dict[str, float] | None:
    rows = step_rows(folder)
    if not rows:
        return None
    reward = [r["reward_mean"] for r in rows]
    tenth = max(1, len(rows) // 10)
    grads = [r["grad_norm"] for r in rows if "grad_norm" in r]
    median = statistics.median(grads) if grads else 0.0
    jumps = [abs(math.log(b / a)) for a, b in zip(grads, grads[1:]) if a > 0 and b > 0]

    def mean(key: str) -> float:
        vals = [r[key] for r in rows if key in r]
        return sum(vals) / len(vals) if vals else float("nan")

    seqs = sum(r.get("num_seqs", 0.0) for r in rows)
    to_09 = next((r["step"] for r in rows if r["reward_mean"] >= 0.9), None)
    return {
        "steps": len(rows),
        "reward_first_tenth": sum(reward[:tenth]) / tenth,
        "reward_last_tenth": sum(reward[-tenth:]) / tenth,
        "steps_to_0.9": float(to_09) if to_09 is not None else float("nan"),
        "grad_norm_max": max(grads) if grads else float("nan"),
        "grad_norm_median": median,
        "grad_spike": max(grads) / median if grads and median > 0 else float("nan"),
        # How much the gradient norm varies over the run (std / mean): on a task that is learned this
        # includes the fall of the gradient as the reward saturates.
        "grad_cv": statistics.pstdev(grads) / statistics.fmean(grads) if len(grads) > 1 else float("nan"),
        # How much it jumps from one step to the next, whatever its trend: median |ln(g_t / g_{t-1})|.
        "grad_jitter": statistics.median(jumps) if jumps else float("nan"),
        "ppo_kl_abs_mean": sum(abs(r.get("ppo_kl", 0.0)) for r in rows) / len(rows),
        "clip_frac": mean("clip_frac"),
        "clip_band_frac": mean("clip_band_frac"),
        "seq_masked_frac": sum(r.get("seq_is_masked_count", 0.0) for r in rows) / seqs if seqs else 0.0,
        "kl": mean("kl"),
        "tis_clip_frac": mean("tis_clip_frac"),
        "behaviour_proximal_abs_diff": mean("behaviour_proximal_abs_diff"),
        "groups_of_one": sum(r.get("groups_of_one", 0) for r in rows),
        "staleness_mean": mean("staleness_mean"),
        "mixed_version_samples": mean("mixed_version_samples"),
        # The reward curve in ten points: the mean of each tenth of the run.
        "reward_by_tenth": [
            statistics.fmean(reward[i * len(reward) // 10 : (i + 1) * len(reward) // 10] or reward)
            for i in range(10)
        ],
    }


def app_args(
    arm: str, seed: int, steps: int, folder: Path, workload: str, updates: int | None = None
) -> list[str]:
    """apps/train's command line for one run of `arm` on `workload`, making `updates` optimizer updates
    per step (None: the workload's) of the same prompts."""
    spec = WORKLOADS[workload]
    updates = updates or spec.updates
    if spec.prompts_per_step % updates:
        raise SystemExit(
            f"--updates {updates} does not divide {workload}'s {spec.prompts_per_step} prompts per step"
        )
    config = ["--config", spec.config] if spec.config else []
    batches = [
        f"actor.ppo_mini_batch_size={spec.prompts_per_step // updates}",
        f"async_training.require_batches={updates}",
    ]
    low, high = spec.seq_is_band
    arm_keys = [key.format(budget=spec.budget, seq_is_low=low, seq_is_high=high) for key in ARMS[arm]]
    return [
        *config,
        *BASE,
        *spec.overrides,
        *batches,
        *arm_keys,
        f"seed={seed}",
        f"trainer.total_steps={steps}",
        f"output.dir={folder}",
    ]


def run_one(
    arm: str, seed: int, steps: int, out: Path, workload: str = "digits", updates: int | None = None
) -> None:
    folder = out / f"{arm}_s{seed}"
    if (folder / "summary.json").exists():
        print(f"[sweep] {folder.name}: done already", file=sys.stderr)
        return
    cmd = [*app_command(), *app_args(arm, seed, steps, folder, workload, updates)]
    print(f"[sweep] {' '.join(cmd)}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 4):  # on a loaded machine Ray's node can time out during startup: retry
        # Beside the run folder: the app clears output.dir when it starts.
        with open(out / f"{folder.name}.log", "w") as log:
            # Bounded: a stuck run must not hold the sweep forever.
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=3600).returncode
        print(
            f"[sweep] {folder.name}: rc={rc} in {time.monotonic() - t0:.0f}s (attempt {attempt})",
            file=sys.stderr,
            flush=True,
        )
        if rc == 0:
            return


def table(out: Path) -> dict[str, dict[str, float]]:
    per_arm: dict[str, dict[str, float]] = {}
    keys = (
        "reward_first_tenth",
        "reward_last_tenth",
        "steps_to_0.9",
        "grad_norm_max",
        "grad_norm_median",
        "grad_spike",
        "grad_cv",
        "grad_jitter",
        "ppo_kl_abs_mean",
        "clip_frac",
        "clip_band_frac",
        "seq_masked_frac",
        "kl",
        "tis_clip_frac",
        "behaviour_proximal_abs_diff",
    )
    print(
        "| arm | seeds | steps | reward first 10% | reward last 10% | steps to 0.9 | grad max | grad median | "
        "max/median | grad CV | grad jitter | abs ppo_kl | clip_frac | clip_band_frac | tis_clip_frac | "
        "mean abs(behav − prox) | seqs masked | kl |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for arm in ARMS:
        runs = sorted(r for r in out.glob(f"{arm}_s*") if r.is_dir())  # not the runs' logs beside them
        summaries = [s for s in (summarize_run(r) for r in runs) if s is not None]
        if not summaries:
            continue
        agg = {k: statistics.fmean([s[k] for s in summaries]) for k in keys}
        reached = [s["steps_to_0.9"] for s in summaries if s["steps_to_0.9"] == s["steps_to_0.9"]]
        agg["steps_to_0.9"] = statistics.fmean(reached) if reached else float("nan")
        agg["reward_by_tenth"] = [
            statistics.fmean(s["reward_by_tenth"][i] for s in summaries) for i in range(10)
        ]
        agg["reached_0.9"] = len(reached)
        agg["seeds"] = len(summaries)
        agg["steps"] = min(s["steps"] for s in summaries)
        per_arm[arm] = {**agg, "runs": {r.name: summarize_run(r) for r in runs}}
        print(
            f"| {arm} | {len(summaries)} | {agg['steps']} | {agg['reward_first_tenth']:.3f} | "
            f"{agg['reward_last_tenth']:.3f} | {agg['steps_to_0.9']:.1f} ({len(reached)}/{len(summaries)}) | "
            f"{agg['grad_norm_max']:.3g} | {agg['grad_norm_median']:.3g} | {agg['grad_spike']:.2f} | "
            f"{agg['grad_cv']:.2f} | "
            f"{agg['grad_jitter']:.3f} | "
            f"{agg['ppo_kl_abs_mean']:.2e} | {agg['clip_frac']:.4f} | {agg['clip_band_frac']:.4f} | "
            f"{agg['tis_clip_frac']:.4f} | {agg['behaviour_proximal_abs_diff']:.3g} | "
            f"{agg['seq_masked_frac']:.3f} | {agg['kl']:.3g} |"
        )
    return per_arm


def plot_curves(out: Path) -> Path | None:
    """`<out>/curves.png`: reward and gradient norm per step, each arm's mean over its seeds."""
    per_arm = {arm: [step_rows(r) for r in sorted(out.glob(f"{arm}_s*")) if r.is_dir()] for arm in ARMS}
    per_arm = {arm: [rows for rows in runs if rows] for arm, runs in per_arm.items()}
    per_arm = {arm: runs for arm, runs in per_arm.items() if runs}
    if not per_arm:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (reward_ax, grad_ax) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for arm, runs in per_arm.items():
        steps = min(len(rows) for rows in runs)  # the steps every seed has
        x = [runs[0][i]["step"] for i in range(steps)]
        reward_ax.plot(
            x, [statistics.fmean(rows[i]["reward_mean"] for rows in runs) for i in range(steps)], label=arm
        )
        grad_ax.plot(
            x,
            [statistics.fmean(rows[i].get("grad_norm", float("nan")) for rows in runs) for i in range(steps)],
            label=arm,
        )
    seeds = max(len(runs) for runs in per_arm.values())
    reward_ax.set_ylabel(f"reward (mean of {seeds} seeds)")
    grad_ax.set_ylabel("grad_norm")
    grad_ax.set_xlabel("step")
    for ax in (reward_ax, grad_ax):
        ax.grid(alpha=0.3)
    reward_ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "curves.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {list(ARMS)}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", default="runs/conventions")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--workload", choices=list(WORKLOADS), default="digits", help="the task (WORKLOADS)")
    parser.add_argument(
        "--updates",
        type=int,
        default=None,
        help="optimizer updates per step, of the same prompts (default: the workload's; > 1 makes "
        "ppo_kl and clip_frac measure something)",
    )
    parser.add_argument("--summarize", action="store_true", help="only summarise the runs already in --out")
    args = parser.parse_args()
    out = Path(args.out)
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arms {unknown}; choose from {list(ARMS)}")
    if not args.summarize:
        os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
        # Seed-major order: every arm gets seed 0 before any arm gets seed 1.
        runs = [(arm, int(seed)) for seed in args.seeds.split(",") for arm in arms]
        # One app run keeps a 2-core machine about half busy (docs/guide/testing.md): two at a time fill it.
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(lambda r: run_one(r[0], r[1], args.steps, out, args.workload, args.updates), runs))
    result = table(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"curves: {plot_curves(out)}")


if __name__ == "__main__":
    main()
