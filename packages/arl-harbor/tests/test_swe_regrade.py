"""`regrade`: a task written by an earlier grader gets the current plugin files and a test.sh from the
current template carrying the task's own values; a task graded in the agent's environment, or whose
test.sh lacks a line of the template, is refused before anything is rewritten."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from arl.harbor.errors import HarborConfigError
from arl.harbor.swe.__main__ import main
from arl.harbor.swe.regrade import regrade_set, template_values
from arl.harbor.swe.writer import GRADING, PLUGIN_FILES, TASK_FILES, outdated_grading

VALUES = {
    "@SRC_ROOT@": "src",
    "@TEST_FILES@": "tests/test_a.py 'tests/test b.py'",
    "@PYTEST_ARGS@": shlex.quote("-k not slow"),
    "@PYTEST_TIMEOUT_SEC@": "570",
    "@VENV_PYTHON@": "/arl/venv/bin/python",
    "@BASE_DIR@": "/arl/base",
    "@PYTEST_CONFIG@": "setup.cfg",
}


def _old_task(
    task_set: Path, name: str, *, mode: str = "separate", grading: str = "clean-environment-1"
) -> Path:
    task = task_set / name
    (task / "tests" / "plugin").mkdir(parents=True)
    test_sh = "# an earlier grader's comment\n" + (TASK_FILES / "test.sh").read_text()
    for key, value in VALUES.items():
        test_sh = test_sh.replace(key, value)
    (task / "tests" / "test.sh").write_text(test_sh)
    for plugin in PLUGIN_FILES:
        (task / "tests" / "plugin" / plugin).write_text("# the earlier grader's\n")
    (task / "task.toml").write_text(
        f'[metadata]\narl_grading = "{grading}"\n\n[verifier]\ntimeout_sec = 600.0\nenvironment_mode = "{mode}"\n'
    )
    return task


def test_an_older_task_gets_the_current_grader_with_its_own_values(tmp_path):
    task = _old_task(tmp_path, "t1")
    assert outdated_grading(tmp_path) == ["t1"]
    assert main(["regrade", str(tmp_path)]) == 0
    assert outdated_grading(tmp_path) == []
    test_sh = (task / "tests" / "test.sh").read_text()
    assert "@" not in "".join(
        line for line in test_sh.splitlines() if line.startswith(("SRC_ROOT", "TEST_FILES"))
    )
    assert template_values(test_sh, (TASK_FILES / "test.sh").read_text()) == VALUES
    assert (
        "an earlier grader's comment" not in test_sh and (task / "tests" / "test.sh").stat().st_mode & 0o111
    )
    for plugin in PLUGIN_FILES:
        assert (task / "tests" / "plugin" / plugin).read_bytes() == (TASK_FILES / plugin).read_bytes()
    assert f'arl_grading = "{GRADING}"' in (task / "task.toml").read_text()
    assert regrade_set(tmp_path) == []  # current now: nothing to do


def test_a_task_written_before_tasks_named_their_grading_gets_the_current_one(tmp_path):
    task = _old_task(tmp_path, "t")
    toml = task / "task.toml"
    toml.write_text(
        "\n".join(x for x in toml.read_text().splitlines() if not x.startswith("arl_grading")) + "\n"
    )
    assert regrade_set(tmp_path) == ["t"] and outdated_grading(tmp_path) == []


def test_a_task_graded_in_the_agents_environment_is_refused_and_nothing_is_rewritten(tmp_path):
    current = _old_task(tmp_path, "a")
    _old_task(tmp_path, "b", mode="shared")
    before = (current / "tests" / "test.sh").read_text()
    with pytest.raises(HarborConfigError, match="b is graded in the agent's own environment"):
        regrade_set(tmp_path)
    assert (current / "tests" / "test.sh").read_text() == before


def test_a_test_sh_without_a_line_of_the_template_is_named(tmp_path):
    task = _old_task(tmp_path, "t")
    test_sh = task / "tests" / "test.sh"
    test_sh.write_text(
        "\n".join(x for x in test_sh.read_text().splitlines() if not x.startswith("SRC_ROOT="))
    )
    with pytest.raises(HarborConfigError, match="t: test.sh has no line of the form 'SRC_ROOT=@SRC_ROOT@'"):
        regrade_set(tmp_path)
