"""Task datasets: a user's JSONL or Parquet file, or a built-in set, all read into `Task` rows.

Row format (JSONL object or Parquet row): `messages` (list of {"role", "content"}) or `prompt` (a
string, turned into one user message), optional `id`, `ground_truth`, `reward_fn`, `agent`,
`metadata`. Built-in sets are named `builtin:<name>` and generated deterministically from a seed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from arl.rollout.errors import DatasetError
from arl.rollout.types import Task


def task_from_row(row: dict[str, Any], index: int, source: str) -> Task:
    """Validate one row and turn it into a Task; errors name the source and row."""
    where = f"{source} row {index}"
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected an object, got {type(row).__name__}")
    row = dict(row)
    if "messages" not in row:
        if "prompt" not in row:
            raise DatasetError(f"{where}: needs 'messages' or 'prompt'")
        prompt = row.pop("prompt")
        if not isinstance(prompt, str):
            raise DatasetError(f"{where}: 'prompt' must be a string")
        row["messages"] = [{"role": "user", "content": prompt}]
    row.setdefault("id", f"{Path(source).stem}-{index}")
    row["id"] = str(row["id"])
    try:
        return msgspec.convert(row, Task)
    except msgspec.ValidationError as exc:
        raise DatasetError(f"{where}: {exc}") from None


def load_tasks(source: str, *, seed: int = 0, size: int = 512) -> list[Task]:
    """Read a dataset: `builtin:<name>`, a `.jsonl` file, or a `.parquet` file."""
    if source.startswith("builtin:"):
        return builtin_tasks(source.removeprefix("builtin:"), seed=seed, size=size)
    path = Path(source)
    if not path.is_file():
        raise DatasetError(f"dataset file not found: {source}")
    if path.suffix == ".jsonl":
        rows = []
        for i, line in enumerate(path.read_text().splitlines()):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{source} row {i}: invalid JSON ({exc})") from None
    elif path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DatasetError("reading .parquet needs pyarrow (pip install pyarrow)") from None
        rows = pq.read_table(path).to_pylist()
    else:
        raise DatasetError(f"unknown dataset format {path.suffix!r} for {source}; use .jsonl or .parquet")
    return [task_from_row(row, i, source) for i, row in enumerate(rows)]


_DIGIT_ASKS = (
    "Reply with digits only.",
    "Answer using only numbers.",
    "Write a number and nothing else.",
    "Give me some digits, no words.",
)


def builtin_tasks(name: str, *, seed: int, size: int) -> list[Task]:
    """`digits` (a learnable toy task) or `longtail?key=value&…` (see arl.rollout.longtail)."""
    base, _, query = name.partition("?")
    if base == "longtail":
        from arl.rollout.longtail import longtail_tasks

        return longtail_tasks(query, seed=seed, size=size)
    if name != "digits":
        raise DatasetError(f"unknown built-in dataset {name!r}; available: ['digits', 'longtail']")
    rng = random.Random(seed)
    rows = []
    for i in range(size):
        example = "".join(str(rng.randint(0, 9)) for _ in range(rng.randint(2, 5)))
        rows.append(
            {
                "id": f"digits-{i}",
                "prompt": f"{rng.choice(_DIGIT_ASKS)} For example: {example}",
                "reward_fn": "digits",
            }
        )
    return [task_from_row(row, i, "builtin:digits") for i, row in enumerate(rows)]


def cycle_tasks(tasks: list[Task], *, seed: int, epochs: int | None = None) -> Iterator[tuple[int, Task]]:
    """Shuffled passes over the tasks (a new order per epoch); yields (epoch, task). Endless if epochs is None."""
    if not tasks:
        raise DatasetError("the dataset is empty")
    rng = random.Random(seed)
    epoch = 0
    while epochs is None or epoch < epochs:
        order = list(tasks)
        rng.shuffle(order)
        for task in order:
            yield epoch, task
        epoch += 1
