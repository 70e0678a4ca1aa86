"""Carrying the agent's tree out of its environment for grading, without letting the tree fail the carry.

Harbor extracts transferred archives with tarfile's `data` filter, which raises on a link that leaves the
tree, an absolute link or a device node and so aborts the whole transfer. For the agent's own tree (a
separate verifier's artifact) that would turn an agent's `ln -s /nowhere x` into an infrastructure fault,
retried and then dropped: a way to turn a 0 into no sample. `carry_filter` skips such entries instead:
they are not carried, and the grader sees them as the agent's change (absent, or put back from the base).

A tree over the carry's size limit (`$ARL_CARRY_LIMIT_MB`, default 2048: far above a repository with its
history, far below what fills a disk) is not carried either: it could fill the host's disk, or stall the
trial while it streams. `refuse_carry` leaves a marker in its place, which the grader
(`tests/plugin/grade_change.py`) refuses as the agent's change: a kept 0 with `change_refused`, never an
infrastructure fault.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from arl.harbor.errors import HarborConfigError

CARRY_LIMIT_ENV = "ARL_CARRY_LIMIT_MB"
DEFAULT_CARRY_LIMIT_MB = 2048
# The same name as grade_change.CARRY_REFUSED_MARKER (the grader runs from the task's files, not this package).
CARRY_REFUSED_MARKER = ".arl-carry-refused"


def carry_limit_bytes() -> int:
    """The largest tree carried, in bytes ($ARL_CARRY_LIMIT_MB, else DEFAULT_CARRY_LIMIT_MB)."""
    raw = os.environ.get(CARRY_LIMIT_ENV, "")
    try:
        megabytes = float(raw) if raw else float(DEFAULT_CARRY_LIMIT_MB)
    except ValueError:
        raise HarborConfigError(f"${CARRY_LIMIT_ENV}={raw!r} is not a number of megabytes") from None
    if megabytes <= 0:
        raise HarborConfigError(f"${CARRY_LIMIT_ENV}={raw!r} must be positive")
    return int(megabytes * 1024 * 1024)


def refuse_carry(target_dir: Path | str, source_dir: str, limit_bytes: int) -> None:
    """`target_dir` made to hold only the marker the grader refuses, saying why: `source_dir` was over the
    limit."""
    target = Path(target_dir)
    target.mkdir(parents=True, exist_ok=True)
    why = f"{source_dir} is larger than the carry's limit of {limit_bytes >> 20} MiB"
    (target / CARRY_REFUSED_MARKER).write_text(why + "\n")


def carry_filter(member: tarfile.TarInfo, dest_path: str) -> tarfile.TarInfo | None:
    """The `data` filter, with every entry it refuses skipped rather than raised."""
    try:
        return tarfile.data_filter(member, dest_path)
    except tarfile.FilterError:
        return None
