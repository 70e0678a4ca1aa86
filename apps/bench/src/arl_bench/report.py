"""The bench's output: a table on the terminal, the lines that state its headline, JSON, and one PNG."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

COLUMNS = (
    ("samples/s", "samples_per_s", "{:.3f}"),
    ("tokens/s", "tokens_per_s", "{:.0f}"),
    ("gen tok/s", "generated_tokens_per_s", "{:.0f}"),
    ("trainer idle", "trainer_idle_fraction", "{:.0%}"),
    ("rollout idle", "rollout_idle_fraction", "{:.0%}"),
    ("sync s/step", "sync_s_per_step", "{:.3f}"),
    ("staleness", "staleness_mean", "{:.2f}"),
    ("speedup", "speedup_over_colocated", "{:.2f}×"),
    ("trainer work", "trainer_work_fraction", "{:.0%}"),
    ("trainer slowed", "trainer_slowed_fraction", "{:.0%}"),
    ("rollout work", "rollout_work_fraction", "{:.0%}"),
    ("rollout slowed", "rollout_slowed_fraction", "{:.0%}"),
    ("preempted", "preempted_requests", "{:.0f}"),
    ("KV use max", "kv_cache_usage_max", "{:.0%}"),
    ("trainer GiB", "trainer_peak_mem_gib", "{:.1f}"),
)


def table(modes: dict[str, dict[str, Any]]) -> str:
    head = f"{'mode':<12}" + "".join(f"{name:>15}" for name, _, _ in COLUMNS)
    lines = [head, "-" * len(head)]
    for mode, r in modes.items():
        lines.append(f"{mode:<12}" + "".join(f"{cell(r.get(key), fmt):>15}" for _, key, fmt in COLUMNS))
    return "\n".join(lines)


def cell(value: float | None, fmt: str) -> str:
    """One table cell; "—" where the compare had nothing to measure it against (e.g. the speedup of a
    compare run without colocated)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return fmt.format(value)


def write(result: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """bench.json and bench.png in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "bench.json"
    json_path.write_text(json.dumps(result, indent=2))
    return json_path, plot(result["modes"], out_dir / "bench.png")


def plot(modes: dict[str, dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(modes)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    bars = ax1.bar(names, [modes[m]["samples_per_s"] for m in names], color="tab:blue")
    for bar, m in zip(bars, names, strict=True):
        ax1.annotate(
            cell(modes[m].get("speedup_over_colocated"), "{:.2f}×"),
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
        )
    ax1.set_ylabel("trainer samples/s")
    ax1.set_title("throughput (speedup over colocated)")
    x = range(len(names))
    ax2.bar(
        [i - 0.2 for i in x], [modes[m]["trainer_idle_fraction"] for m in names], 0.4, label="trainer idle"
    )
    ax2.bar(
        [i + 0.2 for i in x], [modes[m]["rollout_idle_fraction"] for m in names], 0.4, label="rollout idle"
    )
    ax2.set_xticks(list(x), names)
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("fraction of wall time")
    ax2.set_title("idle time per side")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def share_of(share: float | None) -> str:
    """How much of a bound a mode measured, or that the compare did not run that mode."""
    return "(not run)" if share is None else f"(measured {share:.0%} of it)"


def headline_line(headline: dict[str, dict]) -> str:
    """The speedups over colocated a headline may state (compare.headline), trained tokens/s first."""
    parts = []
    for mode, h in headline.items():
        window = f"window {h['window_trained_tokens_speedup']:.2f}×"
        if h["source"] == "steady window":
            parts.append(
                f"{mode} {h['trained_tokens_speedup']:.2f}× trained tokens/s, {h['samples_speedup']:.2f}× "
                f"samples/s (steady window: trained within ±5% of generated)"
            )
        elif h["source"] in ("bounds", "window below its bound"):
            imbalance = h["window_imbalance"]
            why = (
                f"trained {imbalance:.0%} off what it generated" if imbalance is not None else "no generation"
            )
            if h["source"] == "bounds":
                what = f"from the bounds (the window is not steady: {why}; {window} as a footnote only)"
            else:
                what = (
                    f"from the window, below its bound's {h['bound_trained_tokens_speedup']:.2f}× (the window "
                    f"is not steady: {why}; both overstate a long run, the lower is stated)"
                )
            parts.append(f"{mode} {h['trained_tokens_speedup']:.2f}× trained tokens/s {what}")
        elif h["source"] == "non-finite training":
            parts.append(f"{mode}: no headline (its run or colocated's trained on NaN/inf; {window})")
        else:
            parts.append(f"{mode}: no headline (the window is not steady and it has no bound; {window})")
    return "headline over colocated: " + "; ".join(parts)


def best_schedule_line(headline: dict[str, dict]) -> str | None:
    """Which schedule's headline is highest, and by how much over the next: the choice between schedules
    (the one-GPU default is taken from it). None unless two modes have a headline figure."""
    stated = sorted(
        (
            (h["trained_tokens_speedup"], mode)
            for mode, h in headline.items()
            if h.get("trained_tokens_speedup")
        ),
        reverse=True,
    )
    if len(stated) < 2:
        return None
    (best, best_mode), (next_best, next_mode) = stated[:2]
    return (
        f"best schedule by its headline: {best_mode} ({best:.2f}× colocated in trained tokens/s), "
        f"{best / next_best:.2f}× {next_mode}'s {next_best:.2f}×"
    )
