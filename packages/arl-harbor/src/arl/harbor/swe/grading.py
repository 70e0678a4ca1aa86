"""The grader's rules as the task writers see them: `task_files/grade_change.py` loaded as a module, and
the reach patterns a task's own fix needs.

The grader refuses a change that adds references to the test harness or the interpreter's machinery
(`grade_change.DEFAULT_REACH_PATTERNS`). A task's real fix can need some of them (a bug that removed a
`sys.modules` line is fixed by putting it back; a fix of pytest itself names `_pytest`), so each task's
`tests/config.json` lists `reach_patterns` without exactly those its fix adds. Used by the builder's writer
and by the SWE-bench row importer, so both grade the same way.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from types import ModuleType

from arl.harbor.swe.runner import TASK_FILES


@functools.cache
def grade_change_module() -> ModuleType:
    """The grader's change rules (`task_files/grade_change.py`, a script the task runs), loaded as a module."""
    spec = importlib.util.spec_from_file_location("arl_swe_grade_change", TASK_FILES / "grade_change.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def needed_reach_patterns(added: str, removed: str) -> set[str]:
    """The default reach patterns that a fix adds (more matches in its added text than in its removed)."""
    return {
        p
        for p in grade_change_module().DEFAULT_REACH_PATTERNS
        if len(re.findall(p, added)) > len(re.findall(p, removed))
    }


def reach_patterns_without(needed: set[str]) -> list[str] | None:
    """The task's `reach_patterns`: the defaults minus `needed` (None: the defaults, nothing needed)."""
    if not needed:
        return None
    # Never an empty list: grade_change.py reads [] as "the defaults".
    return [p for p in grade_change_module().DEFAULT_REACH_PATTERNS if p not in needed] or [r"(?!)"]
