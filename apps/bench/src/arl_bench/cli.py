"""`uv run apps/bench compare|report|simulate …` (see apps/bench/README.md).

compare   run one workload as colocated-synchronous and as async modes a–d (full apps/train runs),
          print the table, write bench.json and bench.png.
report    the same table, bench.json and bench.png from a compare's run folders, for a compare that
          did not write them (stopped, or its machine taken back).
simulate  project the speedup of mode d (and the shared-GPU schedules, --modes) over colocated at
          several GPU counts on a virtual clock, from a calibration file; write sim.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]


def _compare(args: argparse.Namespace) -> int:
    from arl_bench.compare import BENCH_MODES, run_modes

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in BENCH_MODES]
    if bad:
        print(f"arl-bench: unknown mode(s) {bad}; choose from {list(BENCH_MODES)}", file=sys.stderr)
        return 2
    config = args.config or HERE / "configs" / f"{args.preset}.toml"
    out = Path(args.out)
    result = run_modes(
        config,
        args.overrides,
        modes,
        out,
        warmup_steps=args.warmup_steps,
        colocated_overrides=args.colocated_overrides.split() if args.colocated_overrides else [],
        colocated_scale=args.colocated_scale,
        concurrent_overrides=args.concurrent_overrides.split() if args.concurrent_overrides else [],
        shared_overrides=args.shared_overrides.split() if args.shared_overrides else [],
        rates=_rates_row(args.rates, args.rates_workload) if args.rates else None,
        size_concurrent=args.size_concurrent,
    )
    return _write_and_print(result, out)


def _report(args: argparse.Namespace) -> int:
    from arl_bench.compare import report_from_runs

    out = Path(args.out)
    if not out.is_dir():
        print(
            f"arl-bench: {out} is not a folder (a compare's --out, one subfolder per mode)", file=sys.stderr
        )
        return 2
    result = report_from_runs(
        out.resolve(),
        args.warmup_steps,
        _rates_row(args.rates, args.rates_workload) if args.rates else None,
        colocated_scale=args.colocated_scale,
    )
    if not result["modes"] and not result["failed_modes"]:
        print(f"arl-bench: no mode's run folder (metrics.jsonl) in {out}", file=sys.stderr)
        return 2
    return _write_and_print(result, out)


def _write_and_print(result: dict, out: Path) -> int:
    """bench.json, bench.png and the table; 1 when a mode failed or ended with weights unlike the trainer's."""
    from arl_bench.compare import STOCK_WARNING_SHARE, drawn_from_stock, trained_finite
    from arl_bench.report import best_schedule_line, headline_line, share_of, table, write

    json_path, png = write(result, out)
    print(table(result["modes"]))
    if result.get("turn_taking_bound_tokens_per_s"):
        print(
            "arl-bench: turn-taking bound from this run's rates alone (trained tokens/s) "
            + ", ".join(
                f"{m} {v:,.0f} (measured {result['share_of_turn_taking_bound'][m]:.0%} of it)"
                for m, v in result["turn_taking_bound_tokens_per_s"].items()
            )
        )
    if result.get("at_once_bound_tokens_per_s"):
        print(
            f"arl-bench: concurrent's bound from the shares it kept at once (trained tokens/s) "
            f"{result['at_once_bound_tokens_per_s']:,.0f} (measured {result['share_of_at_once_bound']:.0%} of it)"
        )
    if result.get("ideal_speedups"):
        print(
            "arl-bench: ideal over colocated "
            + ", ".join(
                f"{m} {v:.2f}× " + share_of(result["share_of_ideal"].get(m))
                for m, v in result["ideal_speedups"].items()
            )
        )
    if result.get("headline"):
        print("arl-bench: " + headline_line(result["headline"]))
        if best := best_schedule_line(result["headline"]):
            print("arl-bench: " + best)
    for mode, r in result["modes"].items():
        if (extra := drawn_from_stock(r)) > STOCK_WARNING_SHARE:
            print(
                f"arl-bench: {mode} trained {extra:.0%} more tokens than it generated in the measured window: "
                f"it drew on the warm-up's stock, so its rates overstate a long run's; measure more steps"
            )
        if r.get("gemm_sm_target"):
            print(
                f"arl-bench: {mode}'s trainer found its GEMMs wrong at startup and planned them for "
                f"{r['gemm_sm_target']} SMs (arl.trainer.gemm_check): its rates are those of that repair"
            )
    print(f"arl-bench: {json_path}, {png}")
    for mode, error in result["failed_modes"].items():
        print(f"arl-bench: mode {mode} failed: {error}", file=sys.stderr)
    broken = [m for m, r in result["modes"].items() if not trained_finite(r)]
    for mode in broken:
        r = result["modes"][mode]
        print(
            f"arl-bench: {mode} trained on NaN/inf in {r.get('nonfinite_steps', 0)} of its steps (loss or "
            f"gradient norm, or an update skipped for it)"
            + ("" if r.get("weights_finite", True) else " and ended with NaN/inf weights")
            + ": its rates are not those of a run that trains",
            file=sys.stderr,
        )
    if result["failed_modes"] or broken:
        return 1
    if not all(r["weights_equal_after_sync"] for r in result["modes"].values()):
        print("arl-bench: a run ended with engine weights different from the trainer's", file=sys.stderr)
        return 1
    return 0


def _rates_row(path: Path, workload: str) -> dict:
    """One workload's row of raw_vllm_rates.py's JSON (its g_sync, g_cont, t_response and shares)."""
    data = json.loads(Path(path).read_text())
    rows = data.get("workloads", {})
    if workload not in rows:
        raise ValueError(f"--rates {path} has no workload {workload!r} (has {sorted(rows)})")
    return rows[workload]


def _simulate(args: argparse.Namespace) -> int:
    import msgspec

    from arl_bench.simulate import REFERENCE_SPEEDUP_128, SimWorkload, load_calibration, project

    calib = load_calibration(args.calibration)
    workload = SimWorkload(
        source=args.source,
        n=args.n,
        prompts_per_step_per_gpu=args.prompts_per_gpu,
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        token_unit=args.token_unit,
    )
    if args.train_tokens_per_s:
        calib.train.tokens_per_s_per_gpu = args.train_tokens_per_s
    gpus = [int(g) for g in args.gpus.split(",")]
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    rows = project(
        calib, workload, gpus, modes=modes, rollout_fraction=args.rollout_fraction, staleness=args.staleness
    )
    result = {
        "calibration": str(args.calibration),
        "calibration_meta": calib.meta,
        "train_tokens_per_s_per_gpu": calib.train.tokens_per_s_per_gpu,
        "workload": msgspec.to_builtins(workload),
        "staleness_threshold": args.staleness if args.staleness is not None else 0.5,
        "projection": rows,
        "reference_speedup_128_gpus": list(REFERENCE_SPEEDUP_128),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sim.json").write_text(json.dumps(result, indent=2))
    print(
        f"{'GPUs':>6} "
        + " ".join(f"{m + ' samples/s (×)':>28}" for m in modes)
        + f"   reference d (128 GPUs) {REFERENCE_SPEEDUP_128[0]}–{REFERENCE_SPEEDUP_128[1]}×"
    )
    for row in rows:
        res, up = row["results"], row["speedup_over_colocated"]
        print(
            f"{row['gpus']:>6} " + " ".join(f"{res[m]['samples_per_s']:>20.2f} ({up[m]:.2f}×)" for m in modes)
        )
    print(f"arl-bench: {out / 'sim.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arl-bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare", help="colocated vs modes a–d and the shared-GPU schedules (full app runs)")
    c.add_argument("--preset", default="cpu", help="configs/<preset>.toml (cpu, h200x2)")
    c.add_argument("--config", type=Path, default=None, help="an app config TOML instead of a preset")
    c.add_argument("--modes", default="colocated,a,b,c,d")
    c.add_argument("--warmup-steps", type=int, default=2)
    c.add_argument("--out", default="runs/bench")
    c.add_argument(
        "--colocated-overrides", default="", help="space-separated overrides for the colocated run only"
    )
    c.add_argument(
        "--colocated-scale",
        type=float,
        default=1.0,
        help="multiply colocated throughput (k copies of a 1/k-batch run on 1/k of the GPUs)",
    )
    c.add_argument(
        "--concurrent-overrides",
        default="",
        help="space-separated overrides for the concurrent run only (its memory split)",
    )
    c.add_argument(
        "--size-concurrent",
        action="store_true",
        help="concurrent's replica gets what the trainer's peak in the modes before it leaves of the card",
    )
    c.add_argument(
        "--shared-overrides",
        default="",
        help="space-separated overrides for both shared-GPU runs (e.g. their staleness budget)",
    )
    c.add_argument(
        "--rates",
        type=Path,
        default=None,
        help="raw_vllm_rates.py's raw_rates.json: the shared schedules' ideals from its rates",
    )
    c.add_argument("--rates-workload", default="small", help="the workload of --rates to use")
    c.add_argument(
        "overrides", nargs="*", help="section.key=value for every mode, e.g. trainer.total_steps=8"
    )
    r = sub.add_parser(
        "report",
        help="the table and bench.json of a compare that did not write them, "
        "from its run folders (stopped, or its machine taken back)",
    )
    r.add_argument("out", help="the compare's --out folder (one subfolder per mode)")
    r.add_argument("--warmup-steps", type=int, default=2, help="as the compare's")
    r.add_argument("--colocated-scale", type=float, default=1.0, help="as the compare's")
    r.add_argument("--rates", type=Path, default=None, help="as the compare's")
    r.add_argument("--rates-workload", default="small", help="as the compare's")
    s = sub.add_parser("simulate", help="project mode d vs colocated at scale on a virtual clock")
    s.add_argument("--calibration", default=str(HERE / "calibration" / "h200.toml"))
    s.add_argument("--gpus", default="8,32,128")
    s.add_argument("--source", default="builtin:longtail?median=659&p99_ratio=8&max=8192")
    s.add_argument("--n", type=int, default=8)
    s.add_argument("--prompts-per-gpu", type=float, default=16.0, help="prompts per trainer step per GPU")
    s.add_argument("--steps", type=int, default=6)
    s.add_argument("--warmup-steps", type=int, default=2)
    s.add_argument("--token-unit", type=int, default=32, help="simulate in units of this many tokens")
    s.add_argument(
        "--rollout-fraction", type=float, default=0.5, help="split layouts: share of GPUs for rollout"
    )
    s.add_argument(
        "--modes",
        default="colocated,d",
        help="colocated, a–d (split), time_sliced, concurrent (shared GPUs); colocated is the baseline",
    )
    s.add_argument(
        "--staleness",
        type=float,
        default=None,
        help="staleness_threshold of modes c, d and the shared schedules (default 0.5)",
    )
    s.add_argument(
        "--train-tokens-per-s", type=float, default=0.0, help="override the calibration's train rate"
    )
    s.add_argument("--out", default="runs/bench-sim")
    args = parser.parse_args(argv)
    try:
        return {"compare": _compare, "report": _report, "simulate": _simulate}[args.command](args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"arl-bench: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
