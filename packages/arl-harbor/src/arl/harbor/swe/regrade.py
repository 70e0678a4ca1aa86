"""Bring a task set's grader up to date without rebuilding it.

A built or imported SWE task carries its grader (`tests/test.sh`, `tests/plugin/*`) and names the grading
version it was written with (`arl_grading` in task.toml). When the grader changes, the repository, the
bug, the tests and the images stay valid: only those files need writing again. `regrade` copies the
current plugin files into each task and writes test.sh from the current template with the task's own
values, read back from its old test.sh line by line (the template's placeholder lines), then records the
current version. A task graded in the agent's own environment (before the clean grading) is refused: its
task.toml lacks the separate verifier environment, so it must be rebuilt.

    python -m arl.harbor.swe regrade <set>
"""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

from arl.harbor.errors import HarborConfigError
from arl.harbor.swe.writer import GRADING, PLUGIN_FILES, TASK_FILES

_PLACEHOLDER = re.compile(r"@[A-Z_]+@")
_GRADING_LINE = re.compile(r'^arl_grading = ".*"$', re.M)


def template_values(test_sh: str, template: str) -> dict[str, str]:
    """The value each placeholder of `template` (`@NAME@`) has in `test_sh`, a script written from an
    earlier version of it. Raises HarborConfigError naming a placeholder line `test_sh` lacks."""
    values: dict[str, str] = {}
    old_lines = test_sh.splitlines()
    for line in template.splitlines():
        names = _PLACEHOLDER.findall(line)
        if not names:
            continue
        pieces = _PLACEHOLDER.split(line)
        pattern = re.compile("^" + "(.*?)".join(re.escape(p) for p in pieces) + "$")
        match = next((m for m in map(pattern.match, old_lines) if m), None)
        if match is None:
            raise HarborConfigError(f"test.sh has no line of the form {line.strip()!r}: rebuild the task")
        for name, value in zip(names, match.groups(), strict=True):
            if values.setdefault(name, value) != value:
                raise HarborConfigError(f"test.sh gives {name} two values ({values[name]!r}, {value!r})")
    return values


def _stale_values(task_dir: Path, template: str) -> dict[str, str] | None:
    """None when the task is graded the current way, else its test.sh values (checked: rewritable)."""
    text = (task_dir / "task.toml").read_text()
    task = tomllib.loads(text)
    if task.get("metadata", {}).get("arl_grading") == GRADING:
        return None
    if task.get("verifier", {}).get("environment_mode") != "separate" or "[metadata]" not in text:
        raise HarborConfigError(
            f"{task_dir.name} is graded in the agent's own environment (no separate verifier): rebuild it"
        )
    try:
        return template_values((task_dir / "tests" / "test.sh").read_text(), template)
    except HarborConfigError as e:
        raise HarborConfigError(f"{task_dir.name}: {e}") from None


def _rewrite(task_dir: Path, values: dict[str, str], template: str) -> None:
    tests_dir = task_dir / "tests"
    test_sh = template
    for name, value in values.items():
        test_sh = test_sh.replace(name, value)
    (tests_dir / "plugin").mkdir(exist_ok=True)
    for name in PLUGIN_FILES:
        shutil.copy2(TASK_FILES / name, tests_dir / "plugin" / name)
    (tests_dir / "test.sh").write_text(test_sh)
    (tests_dir / "test.sh").chmod(0o755)
    toml_path = task_dir / "task.toml"
    text, found = _GRADING_LINE.subn(f'arl_grading = "{GRADING}"', toml_path.read_text(), count=1)
    if not found:  # written before tasks named their grading
        text = text.replace("[metadata]\n", f'[metadata]\narl_grading = "{GRADING}"\n', 1)
    toml_path.write_text(text)


def regrade_set(task_set: Path) -> list[str]:
    """Rewrite the grader of every task of `task_set` not graded the current way (all checked before any
    is rewritten); the ids rewritten."""
    tasks = sorted(p.parent for p in task_set.glob("*/task.toml"))
    if not tasks:
        raise HarborConfigError(f"{task_set} holds no tasks (no */task.toml)")
    template = (TASK_FILES / "test.sh").read_text()
    stale = [
        (task_dir, values) for task_dir in tasks if (values := _stale_values(task_dir, template)) is not None
    ]
    for task_dir, values in stale:
        _rewrite(task_dir, values, template)
    return [task_dir.name for task_dir, _ in stale]
