"""`uv run apps/train [--preset agent|swe] [--config FILE] [--mode a|b|c|d] [section.key=value ...]`, or
`uv run apps/train harbor-tasks [list|validate] <harbor source>` to check a Harbor task set."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from arl_train.config import ConfigError, load_config
from arl_train.validation import check_machine


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["harbor-tasks"]:  # `harbor-tasks {list,validate} <source>`: see arl.harbor.tasks
        from arl.harbor.tasks import main as harbor_tasks

        return harbor_tasks(argv[1:] if argv[1:2] in (["list"], ["validate"]) else ["validate", *argv[1:]])
    args = build_parser().parse_args(argv)
    try:
        if args.preset == "agent":
            from arl_train.warm_start import load_agent_config

            config = load_agent_config(args.config, args.overrides, args.mode)
        elif args.preset == "swe":
            from arl_train.swe_preset import load_swe_config

            config = load_swe_config(args.config, args.overrides, args.mode)
        else:
            config = load_config(args.config, args.overrides, args.mode)
            check_machine(config)
    except ConfigError as exc:
        print(f"arl-train: {exc}", file=sys.stderr)
        return 2
    from arl_train.run import format_summary, run

    try:
        summary = run(config)
    except KeyboardInterrupt:
        print("arl-train: interrupted; Ray and every actor were shut down.", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"arl-train: the run failed: {root_cause(exc)}", file=sys.stderr)
        print(f"arl-train: details: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    print(
        f"arl-train: metrics {summary.output_dir}/metrics.jsonl, plot {summary.plot}, "
        f"checkpoint {summary.checkpoint or 'none (trainer.save_final = false)'}"
    )
    if not summary.weights_finite:
        print("arl-train: the trainer's weights hold NaN or inf at the end of the run", file=sys.stderr)
        return 1
    if not summary.weights_equal_after_sync:
        print(
            "arl-train: the engine's weights differ from the trainer's after the last sync", file=sys.stderr
        )
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line of `uv run apps/train` (without the `harbor-tasks` subcommand)."""
    parser = argparse.ArgumentParser(
        prog="arl-train",
        description="Fully asynchronous RL: the embedded default trains a tiny model on a built-in task on CPU.",
    )
    parser.add_argument(
        "--config", type=Path, default=None, help="TOML config (default: apps/train/configs/default.toml)"
    )
    parser.add_argument(
        "--mode", choices=["a", "b", "c", "d"], default=None, help="preset of the four async modes (README)"
    )
    parser.add_argument(
        "--preset",
        choices=["agent", "swe"],
        default=None,
        help="agent: configs/agent.toml + a supervised warm start on shell-agent demonstrations, "
        "then RL on Harbor shell tasks (README); swe: configs/swe.toml on this CPU with the "
        "tiny model on a few real SWE tasks (docs/guide/swe.md)",
    )
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. rollout.n=8")
    return parser


def root_cause(exc: BaseException) -> str:
    """`Type: message` of the error an actor raised, unwrapped from Ray's task-error wrappers (whose
    own text starts with the actor's pid and a traceback), with where it was raised."""
    where = ""
    while getattr(exc, "cause", None) is not None and type(exc).__name__.startswith("RayTaskError"):
        where = where or str(getattr(exc, "function_name", "") or "")
        exc = exc.cause  # type: ignore[attr-defined]
    text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return f"{text} (in {where})" if where else text


if __name__ == "__main__":
    sys.exit(main())
