"""Carrying the agent's tree out of its environment for grading, without letting the tree fail the carry.

Harbor extracts transferred archives with tarfile's `data` filter, which raises on a link that leaves the
tree, an absolute link or a device node and so aborts the whole transfer. For the agent's own tree (a
separate verifier's artifact) that would turn an agent's `ln -s /nowhere x` into an infrastructure fault,
retried and then dropped: a way to turn a 0 into no sample. `carry_filter` skips such entries instead:
they are not carried, and the grader sees them as the agent's change (absent, or put back from the base).
"""

from __future__ import annotations

import tarfile


def carry_filter(member: tarfile.TarInfo, dest_path: str) -> tarfile.TarInfo | None:
    """The `data` filter, with every entry it refuses skipped rather than raised."""
    try:
        return tarfile.data_filter(member, dest_path)
    except tarfile.FilterError:
        return None
