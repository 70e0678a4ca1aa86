"""`uv run apps/train [--config FILE] [--mode a|b|c|d] [section.key=value ...]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from arl_train.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="arl-train",
        description="Fully asynchronous RL: the embedded default trains a tiny model on a built-in task on CPU.",
    )
    parser.add_argument("--config", type=Path, default=None, help="TOML config (default: apps/train/configs/default.toml)")
    parser.add_argument("--mode", choices=["a", "b", "c", "d"], default=None, help="preset of the four async modes (README)")
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. rollout.n=8")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.overrides, args.mode)
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
        print(f"arl-train: the run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    print(f"arl-train: metrics {summary.output_dir}/metrics.jsonl, plot {summary.plot}, checkpoint {summary.checkpoint}")
    if not summary.weights_equal_after_sync:
        print("arl-train: the engine's weights differ from the trainer's after the last sync", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
