"""What the user sees: a progress line per step, metrics as JSONL + TensorBoard (+ wandb), the final PNG.

Each step's row gets derived metrics before it is written (`derive`): the idle ratio of each side
(trainer: time waiting for a batch / step time; rollout: engine time without a generation call over the
step, from the server manager's cumulative utilization), turns and tool calls per trajectory, proxy
rebuilds and dropped turns (replies a client never received), and per sign of reward hacking the grading
saw (`AgentResult.tells`, e.g. SWE trials that touched protected files) the trials of this step that showed
it (`tells/<name>`, also on the step's line when any did). Numeric values (nested ones flattened as
`rollout/x`) also go to TensorBoard under `output.dir/tensorboard`, and to wandb when it is installed
(offline unless WANDB_MODE says otherwise). The sync phases of a step are added to its row and line.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, TextIO

log = logging.getLogger(__name__)


def derive(row: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, float]:
    """Idle ratios and per-trajectory counts of one step (see the module docstring)."""
    out: dict[str, float] = {}
    if row.get("step_s"):
        out["trainer_idle_ratio"] = min(1.0, max(0.0, row.get("wait_s", 0.0) / row["step_s"]))
    ro = row.get("rollout") or {}
    before = (previous or {}).get("rollout") or {}
    if "manager_elapsed_s" in ro and "engine_busy_s" in ro:
        d_elapsed = ro["manager_elapsed_s"] - before.get("manager_elapsed_s", 0.0)
        d_busy = ro["engine_busy_s"] - before.get("engine_busy_s", 0.0)
        replicas = max(1.0, float(ro.get("engine_replicas", 1.0)))
        if d_elapsed > 0:
            out["rollout_idle_ratio"] = min(1.0, max(0.0, 1.0 - d_busy / (replicas * d_elapsed)))
    trajectories = ro.get("trained_responses") or 0
    if trajectories:
        out["turns_per_trajectory"] = ro.get("turns", 0) / trajectories
        if "tool_calls" in ro:
            out["tool_calls_per_trajectory"] = ro["tool_calls"] / trajectories
    for counter in ("proxy_rebuilds", "proxy_dropped_turns"):
        if counter in ro:
            out[counter] = float(ro[counter])
    tells_before = before.get("tells") or {}
    for name, count in (ro.get("tells") or {}).items():
        out[f"tells/{name}"] = float(count - tells_before.get(name, 0))
    return out


def scalars(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric values of `row`, nested dicts flattened as `outer/inner` (lists and text left out)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            out[name] = float(value)
        elif isinstance(value, int | float):
            out[name] = float(value)
        elif isinstance(value, dict):
            out.update(scalars(value, name + "/"))
    return out


class ScalarSinks:
    """TensorBoard (always) and wandb (only when importable) writers of one run's scalars."""

    def __init__(self, directory: Path, run_name: str = "arl") -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.tensorboard = SummaryWriter(log_dir=str(directory / "tensorboard"))
        self.wandb: Any = None
        try:
            import wandb
        except ImportError:
            return
        os.environ.setdefault("WANDB_MODE", "offline")  # never reach the network unless asked to
        self.wandb = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "arl"), name=run_name, dir=str(directory), reinit=True
        )

    def write(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.tensorboard.add_scalar(name, value, step)
        self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def close(self) -> None:
        self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows a `MetricsLog` wrote to `path` (metrics.jsonl): one per trainer step."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsLog:
    """Appends one JSON object per step to `path` (flushed, so a crash keeps what was written), with
    the derived metrics added; the same scalars go to TensorBoard (+ wandb) in `path`'s folder."""

    def __init__(self, path: Path, *, scalar_sinks: bool = True) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: TextIO = path.open("w")
        self.rows: list[dict[str, Any]] = []
        self.sinks: ScalarSinks | None = None
        if scalar_sinks:
            try:
                self.sinks = ScalarSinks(path.parent, run_name=path.parent.name)
            except ImportError as e:  # the run goes on with metrics.jsonl only
                log.warning("no TensorBoard output: %s", e)

    def write(self, row: dict[str, Any]) -> None:
        row.update(derive(row, self.rows[-1] if self.rows else None))
        self.rows.append(row)
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self.sinks is not None:
            self.sinks.write(int(row.get("step", len(self.rows))), scalars(row))

    def close(self) -> None:
        self._file.close()
        if self.sinks is not None:
            self.sinks.close()
            self.sinks = None


def progress_line(row: dict[str, Any], total_steps: int) -> str:
    return (
        f"step {row['step']:>4}/{total_steps} | reward {row['reward_mean']:.3f} | "
        f"staleness {row['staleness_mean']:.2f} (max {row['staleness_max']}) | "
        f"samples/s {row['samples_per_s']:.2f} | sync {row['sync_s'] * 1000:.0f} ms | "
        f"version {row['version']} | loss {row['loss']:+.4f}"
        + (f" | kl_ref {row['kl_ref_mean']:.2e}" if "kl_ref_mean" in row else "")
        + tells_line(row)
    )


def tells_line(row: dict[str, Any]) -> str:
    """This step's trials per sign of reward hacking, for the progress line ("" when there were none)."""
    seen = {k.removeprefix("tells/"): v for k, v in row.items() if k.startswith("tells/") and v > 0}
    return (" | hacking tells: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(seen.items()))) if seen else ""


#: Sync phases in a step's metrics (seconds): the trainer's pause / transfer / resume around the
#: engine side's receive / in-place load (the slowest worker), and in colocated mode sleep and wake.
SYNC_PHASES = {
    "pause": "sync_pause_s",
    "transfer": "sync_transfer_s",
    "receive": "sync_receive_s",
    "load": "sync_load_s",
    "reset_cache": "sync_reset_cache_s",
    "resume": "sync_resume_s",
    "total": "sync_s",
    "sleep": "colocated_sleep_s",
    "wake_weights": "colocated_wake_weights_s",
    "offload_wait": "colocated_offload_wait_s",
    "wake_kv": "colocated_wake_kv_s",
}


def add_engine_phases(row: dict[str, Any]) -> None:
    """Copy the engine side's timings of this step's sync (if it synced) into the metrics row."""
    last = row["rollout"].get("last_sync") or {}
    if row.get("sync_s"):
        row["sync_receive_s"] = last.get("receive_s", 0.0)
        row["sync_load_s"] = last.get("apply_s", 0.0)
        row["sync_reset_cache_s"] = last.get("reset_cache_s", 0.0)
        if "inplace" in last:  # 1.0: loaded through the model's loaders in place; 0.0: reload_weights
            row["sync_inplace"] = last["inplace"]


def phases_line(row: dict[str, Any]) -> str:
    """The step's sync phases in milliseconds, appended to its progress line ("" without a sync)."""
    if not row.get("sync_s"):
        return ""
    parts = [
        f"{name} {row[key] * 1e3:.1f}" for name, key in SYNC_PHASES.items() if name != "total" and key in row
    ]
    return " | sync ms: " + ", ".join(parts)


def phase_medians(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Median milliseconds of each sync phase over the syncs after the first."""
    import statistics

    synced = [r for r in rows if r.get("sync_s")]
    later = synced[1:] or synced  # the first sync also builds groups and maps buffers
    out = {}
    for name, key in SYNC_PHASES.items():
        values = [r[key] for r in later if key in r]
        if values:
            out[name] = round(statistics.median(values) * 1e3, 3)
    return out


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
    ax2.plot(
        steps,
        [r["sampled_tokens_per_s"] / 100 for r in rows],
        label="sampled tokens/s ÷ 100",
        color="tab:green",
    )
    ax2.set_xlabel("step")
    ax2.set_ylabel("throughput")
    ax2.grid(alpha=0.3)
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
