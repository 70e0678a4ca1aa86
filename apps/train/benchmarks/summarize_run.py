"""Print one compact JSON block for a finished app run (its summary.json and metrics.jsonl) and write
it to `$OUT/<name>.json`: layout, learning, the engine-weights check and where sync time goes.

    python apps/train/benchmarks/summarize_run.py RUN_DIR NAME
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

from arl_train.metrics import read_metrics

PHASES = (
    "sync_s",
    "sync_pause_s",
    "sync_transfer_s",
    "sync_receive_s",
    "sync_load_s",
    "sync_reset_cache_s",
    "sync_resume_s",
    "colocated_sleep_s",
    "colocated_wake_weights_s",
    "colocated_offload_wait_s",
    "colocated_wake_kv_s",
)


def main() -> None:
    run_dir, name = Path(sys.argv[1]), sys.argv[2]
    out: dict = {"name": name, "run_dir": str(run_dir)}
    rows = []
    if (run_dir / "metrics.jsonl").is_file():
        rows = read_metrics(run_dir / "metrics.jsonl")
    if (run_dir / "summary.json").is_file():
        s = json.loads((run_dir / "summary.json").read_text())
        out.update(
            {
                k: s.get(k)
                for k in (
                    "layout",
                    "steps",
                    "syncs",
                    "reward_first_tenth",
                    "reward_last_tenth",
                    "weights_equal_after_sync",
                    "weights_max_abs_diff",
                    "weights_prepacked",
                    "weights_problems",
                    "probe_logprob_max_abs_diff",
                    "sync_phases_ms",
                    "wall_s",
                )
            }
        )
    else:
        out["error"] = "no summary.json: the run did not finish (see the log)"
    synced = [r for r in rows if r.get("sync_s")]
    if synced:
        out["sync_ms_per_step"] = {
            k: [round(1e3 * r[k], 1) for r in synced] for k in PHASES if k in synced[0]
        }
        out["sync_gbps_median"] = statistics.median(r.get("sync_gbps", 0.0) for r in synced)
        out["sync_inplace_last"] = synced[-1].get("sync_inplace")
    if rows:
        later = rows[2:] or rows
        out["samples_per_s_median"] = statistics.median(r["samples_per_s"] for r in later)
        out["train_s_median"] = statistics.median(r["train_s"] for r in later)
        out["wait_s_median"] = statistics.median(r["wait_s"] for r in later)
    text = json.dumps(out, indent=1)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"{name}.json").write_text(text)


if __name__ == "__main__":
    main()
