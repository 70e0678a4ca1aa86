"""What the user sees: a progress line per step, metrics as JSONL, and the final PNG plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO


class MetricsLog:
    """Appends one JSON object per step to `path` (flushed, so a crash keeps what was written)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: TextIO = path.open("w")
        self.rows: list[dict[str, Any]] = []

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def progress_line(row: dict[str, Any], total_steps: int) -> str:
    return (
        f"step {row['step']:>4}/{total_steps} | reward {row['reward_mean']:.3f} | "
        f"staleness {row['staleness_mean']:.2f} (max {row['staleness_max']}) | "
        f"samples/s {row['samples_per_s']:.2f} | sync {row['sync_s'] * 1000:.0f} ms | "
        f"version {row['version']} | loss {row['loss']:+.4f}"
    )


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """Reward and throughput per step, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax1.plot(steps, [r["reward_mean"] for r in rows], label="mean reward")
    ax1.set_ylabel("reward")
    ax1.grid(alpha=0.3)
    ax1.legend()
    ax2.plot(steps, [r["samples_per_s"] for r in rows], label="samples/s (trainer)", color="tab:orange")
    ax2.plot(steps, [r["sampled_tokens_per_s"] / 100 for r in rows], label="sampled tokens/s ÷ 100", color="tab:green")
    ax2.set_xlabel("step")
    ax2.set_ylabel("throughput")
    ax2.grid(alpha=0.3)
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
