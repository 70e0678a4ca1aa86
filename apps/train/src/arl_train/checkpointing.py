"""A run's checkpoints: saving one, and the state a run resumes from.

A checkpoint is the trainer's folder (weights, optimizer, `trainer_state.json`: step, weight version)
plus the queue's snapshot of the samples not yet trained and the dataset position (the next task and
the tasks still in flight, which a resumed run replays). So a resumed run trains each sample once.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from arl.queue.persistence import SNAPSHOT_FILENAME
from arl_train.sections import AppConfig

RPC_TIMEOUT_S = 60.0
SAVE_TIMEOUT_S = 600.0


def resume_state(config: AppConfig, out_dir: Path) -> dict[str, Any]:
    """The trainer state of `trainer.resume_from` ({} for a fresh run); its queued samples are put
    where the new queue will restore them from (`out_dir/queue`)."""
    queue_dir = out_dir / "queue"
    (queue_dir / SNAPSHOT_FILENAME).unlink(missing_ok=True)  # never restore an earlier run's samples
    if not config.trainer.resume_from:
        return {}
    checkpoint = Path(config.trainer.resume_from)
    state_file = checkpoint / "trainer_state.json"
    if not state_file.is_file():
        raise FileNotFoundError(
            f"trainer.resume_from {checkpoint} is not an arl checkpoint (no trainer_state.json)"
        )
    state = json.loads(state_file.read_text())
    if state["step"] >= config.trainer.total_steps:
        raise ValueError(
            f"the checkpoint is at step {state['step']}: raise trainer.total_steps above it to train further"
        )
    queue_dir.mkdir(parents=True, exist_ok=True)
    if (checkpoint / SNAPSHOT_FILENAME).is_file():
        shutil.copy2(checkpoint / SNAPSHOT_FILENAME, queue_dir / SNAPSHOT_FILENAME)
    return state


def save_checkpoint(ray: Any, trainer: Any, rollout: Any, queue: Any, directory: Path) -> str:
    """Weights + optimizer + trainer state + the queued samples + the dataset position; returns the folder."""
    # Read before the queue snapshot: a task still in flight here is either in the snapshot or replayed.
    position = ray.get(rollout.dataset_position.remote(), timeout=RPC_TIMEOUT_S)
    path = ray.get(trainer.save_checkpoint.remote(str(directory), position), timeout=SAVE_TIMEOUT_S)
    snapshot = ray.get(queue.snapshot.remote(), timeout=120)
    shutil.copy2(snapshot, Path(path) / SNAPSHOT_FILENAME)
    return path


def latest_checkpoint(out_dir: Path) -> tuple[Path, int] | None:
    """The run's newest complete `checkpoints/step_N` (trainer state and queue snapshot both written),
    with its step; None when there is none."""
    found = [
        (int(p.name.split("_")[1]), p)
        for p in (Path(out_dir) / "checkpoints").glob("step_*")
        if p.name.split("_")[1].isdigit()
        and (p / "trainer_state.json").is_file()
        and (p / SNAPSHOT_FILENAME).is_file()
    ]
    if not found:
        return None
    step, path = max(found)
    return path, step


def latest_checkpoint_hint(out_dir: Path) -> str:
    """ "; resume from its last checkpoint: trainer.resume_from=<it>" for an error message ("" if none)."""
    latest = latest_checkpoint(out_dir)
    return f"; resume from its last checkpoint: trainer.resume_from={latest[0]}" if latest else ""
