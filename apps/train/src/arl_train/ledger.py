"""The sample ledger of a run: which samples the rollout side produced and which the trainer took.

Two append-only JSON-lines files in `$ARL_LEDGER_DIR` (run.py sets it to output.dir/ledger):
`produced.jsonl`, one line per sample the queue accepted ({"uid", "task_id", "version"}), written by
the rollout actor; `consumed.jsonl`, one line per sample the trainer took off the queue ({"uid",
"step"}: the step it was taken for), written by the trainer actor. Lines are flushed as written, so a
killed process loses at most the line it was writing. Samples the rollout side drops (every trajectory
failed, generation timed out) and the trainer drops (version lag) are counted in their stats, with
the reason. Without `$ARL_LEDGER_DIR` nothing is recorded. The fault harness
(apps/train/benchmarks/faults.py) checks the ledger after each fault.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any, TextIO

ENV = "ARL_LEDGER_DIR"
PRODUCED = "produced.jsonl"
CONSUMED = "consumed.jsonl"


def _open(name: str) -> TextIO | None:
    directory = os.environ.get(ENV)
    if not directory:
        return None
    Path(directory).mkdir(parents=True, exist_ok=True)
    return open(Path(directory) / name, "a", buffering=1)  # line-buffered: one write per record


class RecordingSink:
    """A sample sink that records each sample once the wrapped sink has accepted it."""

    def __init__(self, sink: Any, tracker: TaskTracker | None = None) -> None:
        self.sink = sink
        self.tracker = tracker
        self._file = _open(PRODUCED)

    async def put(self, sample: Any) -> None:
        await self.sink.put(sample)
        if self.tracker is not None:
            self.tracker.queued(sample.task_id)
        if self._file is not None:
            self._file.write(
                json.dumps({"uid": sample.uid, "task_id": sample.task_id, "version": sample.end_version})
                + "\n"
            )


class RecordingSource:
    """A sample source (the trainer's queue client) that records every sample it hands out."""

    def __init__(self, source: Any, step: Callable[[], int]) -> None:
        self.source = source
        self._step = step
        self._file = _open(CONSUMED)

    async def get_batch(self, n: int, timeout: float | None = None) -> list[Any]:
        samples = await self.source.get_batch(n, timeout)
        if self._file is not None:
            step = self._step()
            self._file.writelines(json.dumps({"uid": s.uid, "step": step}) + "\n" for s in samples)
        return samples

    def __getattr__(self, name: str) -> Any:  # size(), stats(), … pass through
        return getattr(self.source, name)


def read(directory: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(produced, consumed) records of a run's ledger folder; a torn last line (killed writer) is skipped."""

    def lines(name: str) -> list[dict[str, Any]]:
        path = Path(directory) / name
        if not path.is_file():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        return out

    return lines(PRODUCED), lines(CONSUMED)


class TaskTracker:
    """The dataset positions in flight (started, sample not yet queued), so a checkpoint can re-run them.

    A checkpoint records `next_position` (where fresh tasks resume) and `in_flight()` (positions
    started before it whose samples were not queued yet: generating, or waiting for queue space);
    without the latter, a resumed run would skip those tasks and their samples would be lost. The
    resumed run replays them first. A prompt dropped with a counted reason stays "in flight" and is
    re-run after a resume: extra work, never a loss. Replay positions the feed loop has not reached yet
    count as in flight too: a checkpoint taken early in a resumed run (its backlog of replays not yet
    started) must hand them on, or the run resumed from it would skip them.
    """

    def __init__(self, tasks: list[Any], *, seed: int, skip: int = 0, replay: list[int] = ()) -> None:
        from arl.rollout import cycle_tasks

        self._cycle = cycle_tasks(tasks, seed=seed)
        # Replays not yet handed to the feed loop, oldest first: position -> (epoch, task), found in one pass.
        wanted = set(replay)
        self._replay: dict[int, tuple[int, Any]] = {
            position: item
            for position, item in enumerate(
                islice(cycle_tasks(tasks, seed=seed), max(wanted, default=-1) + 1)
            )
            if position in wanted
        }
        self.next_position = skip
        self._in_flight: dict[int, str] = {}

    def __iter__(self) -> Any:
        while self._replay:
            position = next(iter(self._replay))
            epoch, task = self._replay[position]
            self._in_flight[position] = task.id
            del self._replay[position]
            yield epoch, task
        for epoch, task in islice(self._cycle, self.next_position, None):
            self._in_flight[self.next_position] = task.id
            self.next_position += 1
            yield epoch, task

    def queued(self, task_id: str) -> None:
        """A sample of `task_id` reached the queue: its oldest in-flight position is done."""
        for position, tid in sorted(self._in_flight.items()):
            if tid == task_id:
                del self._in_flight[position]
                return

    def in_flight(self) -> list[int]:
        """Positions a resumed run must replay: started and not queued, or replays not started yet."""
        return sorted(self._in_flight.keys() | self._replay.keys())

    def position(self) -> dict[str, Any]:
        """What a checkpoint records: `tasks_started` (where fresh tasks resume), `tasks_in_flight` (the
        positions to replay) and `task_ids_in_flight` (their tasks, in the same order: what a run that
        ends with replays still pending leaves to the next resume)."""
        positions = self.in_flight()
        ids = [self._in_flight[p] if p in self._in_flight else self._replay[p][1].id for p in positions]
        return {"tasks_started": self.next_position, "tasks_in_flight": positions, "task_ids_in_flight": ids}
