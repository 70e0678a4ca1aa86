"""How a SWE trial's grade and its tells come out of the clean grading environment (docs/design/swe-grading.md).

Whole Harbor trials in the local sandbox on a real SWE task (`arl.harbor.testing.write_swe_task`, written by
the builder's writer), each agent a bash script (`arl.harbor.testing.ScriptedAgent`): the kind of failure
the trial loop gives, the reward, and the tells (`AgentResult.tells`) that the rollouter counts. The
adversarial suite (`test_swe_attacks.py`) checks rewards for many attacks; this module checks what each
kind of outcome is called.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from arl.harbor import HarborAgentLoop
from arl.harbor.policy import artifact_failures
from arl.harbor.testing import SCRIPTED_AGENT_IMPORT_PATH, write_swe_task
from arl.proxy.types import SamplingParams
from arl.rollout.types import Task

from .conftest import needs_sandbox

# The oracle's change, by hand: the two bounds put back.
FIX = (
    "cd /testbed && python3 - <<'EOF'\nimport re, pathlib\np = pathlib.Path('tinycalc/__init__.py')\n"
    "s = p.read_text().replace('        return hi\\n    elif', '        return lo\\n    elif', 1)\n"
    "s = s.replace('    elif x > hi:\\n        return lo', '    elif x > hi:\\n        return hi', 1)\n"
    "p.write_text(s)\nEOF\n"
)


@pytest.fixture(scope="module")
def swe_task(tmp_path_factory) -> Path:
    try:
        return write_swe_task(tmp_path_factory.mktemp("tasks"))
    except Exception as e:  # noqa: BLE001 - the venv needs pytest's wheels from PyPI once
        pytest.skip(f"cannot write the SWE test task (its venv needs PyPI once): {e}")


async def run_script(harbor_config, task: Path, script: str):
    config = harbor_config(
        agent_import_path=SCRIPTED_AGENT_IMPORT_PATH,
        agent_kwargs={"script": script},
        policy={"max_attempts": 2},
    )
    loop = HarborAgentLoop(config)
    t = Task(id=task.name, messages=[], agent="harbor", metadata={"harbor_task_path": str(task)})
    return await loop.run(t, None, SamplingParams(), "req-1")  # type: ignore[arg-type]


@needs_sandbox
async def test_a_fix_scores_one_with_no_tells(swe_task, harbor_config):
    result = await run_script(harbor_config, swe_task, FIX)
    assert not result.failed and result.failure_kind == "", result.error
    assert result.reward == 1.0 and result.tells == {}


@needs_sandbox
async def test_the_agents_change_that_breaks_the_verifier_is_a_kept_zero(swe_task, harbor_config):
    """The package kills the interpreter that imports it: pytest leaves no report. The grader checked its
    harness before applying the change, so this is the agent's doing: kept, reward 0, never retried."""
    script = FIX + "printf 'import os\\nos.kill(os.getpid(), 9)\\n' >> /testbed/tinycalc/__init__.py\n"
    result = await run_script(harbor_config, swe_task, script)
    assert not result.failed and result.failure_kind == "agent_broke_verifier", result.error
    assert result.reward == 0.0 and result.tells.get("agent_broke_verifier") == 1.0
    assert "left no readable report" in result.error and "retried" not in result.timings


@needs_sandbox
async def test_protected_files_are_put_back_and_told(swe_task, harbor_config):
    script = FIX + (
        "printf 'def test_x():\\n    pass\\n' > /testbed/conftest.py\n"
        "printf '[pytest]\\naddopts = -x\\n' > /testbed/pytest.ini\n"
        "mkdir -p /testbed/tinycalc/__pycache__ && echo x > /testbed/tinycalc/__pycache__/a.pyc\n"
    )
    result = await run_script(harbor_config, swe_task, script)
    assert not result.failed and result.reward == 1.0, result.error  # the fix still counts
    assert result.tells == {"protected_touched": 4.0}  # conftest.py, pytest.ini, __pycache__/ and its .pyc


@needs_sandbox
async def test_a_change_reaching_into_the_runner_is_refused(swe_task, harbor_config):
    script = FIX + "printf 'import _pytest.runner\\n' >> /testbed/tinycalc/__init__.py\n"
    result = await run_script(harbor_config, swe_task, script)
    assert not result.failed and result.reward == 0.0, result.error
    assert result.tells.get("change_refused") == 1.0 and result.rewards["change_refused"] == 1.0


@needs_sandbox
async def test_leftover_processes_are_ended_before_grading_and_told(swe_task, harbor_config, tmp_path):
    """A process that outlives the agent's turn and would rewrite the verifier's inputs never sees them."""
    marker = "arl-leftover-marker"
    script = (
        f"setsid nohup bash -c 'exec -a {marker} bash -c \"while true; do "
        "[ -f /tests/config.json ] && echo {} > /tests/config.json; "
        '[ -d /logs/verifier ] && echo {\\"reward\\": 1.0} > /logs/verifier/reward.json; sleep 0.05; '
        "done\"' >/dev/null 2>&1 &\nsleep 0.2\n"
    )
    result = await run_script(harbor_config, swe_task, script)
    assert not result.failed and result.reward == 0.0, result.error
    assert result.tells.get("leftover_processes", 0) >= 1
    assert not any(
        marker in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
        for p in os.listdir("/proc")
        if p.isdigit() and Path(f"/proc/{p}/cmdline").exists()
    )


def test_an_artifact_harbor_could_not_collect_is_named(tmp_path):
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "manifest.json").write_text(
        json.dumps(
            [
                {"source": "/logs/artifacts", "status": "ok", "type": "directory"},
                {"source": "/testbed", "status": "failed", "type": "directory"},
                {"source": "/app/out.txt", "status": "failed", "type": "file"},
            ]
        )
    )
    assert artifact_failures(tmp_path) == ["/testbed"]
    assert artifact_failures(tmp_path / "nowhere") == []


def test_leftovers_leave_out_the_init_its_keepalive_and_the_agents_terminal():
    from arl.harbor.agent_end import leftover_commands

    processes = [
        (10, 1, "sh -c sleep infinity"),
        (11, 10, "sleep infinity"),
        (12, 10, "sleep 1000"),
        (13, 10, "tmux: server"),
        (14, 13, "-bash"),
        (15, 14, "python3 loop.py"),
    ]
    assert leftover_commands(processes, 10) == ["sleep 1000", "python3 loop.py"]


@needs_sandbox
async def test_links_the_carry_refuses_are_left_behind_not_a_failed_trial(swe_task, harbor_config):
    """A link out of the tree or to nowhere would abort Harbor's transfer (an infrastructure fault,
    retried, then dropped): it is not carried, and the fix beside it still counts."""
    script = FIX + "ln -s /nonexistent/arl /testbed/dangling && ln -s ../../../../etc /testbed/tinycalc/out\n"
    result = await run_script(harbor_config, swe_task, script)
    assert not result.failed and result.reward == 1.0, result.error


@needs_sandbox
async def test_a_tree_over_the_carrys_limit_is_refused_as_the_agents_change(
    swe_task, harbor_config, monkeypatch
):
    """Measured as tar would read it (a sparse file at its full length) before it is carried: over the
    limit, nothing is carried and the grader refuses the change: a kept 0, never a failed trial."""
    monkeypatch.setenv("ARL_CARRY_LIMIT_MB", "8")
    result = await run_script(harbor_config, swe_task, FIX + "truncate -s 16M /testbed/flood.bin\n")
    assert not result.failed and result.reward == 0.0, result.error
    assert result.tells.get("change_refused") == 1.0
    monkeypatch.setenv("ARL_CARRY_LIMIT_MB", "1e-9")  # any tree is over it: the limit is what refused it
    result = await run_script(harbor_config, swe_task, FIX)
    assert not result.failed and result.reward == 0.0 and result.tells.get("change_refused") == 1.0


def test_the_shell_agents_log_never_writes_through_a_link_the_agent_made(tmp_path):
    from arl.harbor.shell_agent import write_agent_log

    victim = tmp_path / "host-file"
    victim.write_text("the host's")
    (tmp_path / "arl_shell_messages.json").symlink_to(victim)
    write_agent_log(tmp_path / "arl_shell_messages.json", "[]")
    assert victim.read_text() == "the host's" and (tmp_path / "arl_shell_messages.json").read_text() == "[]"
    (tmp_path / "made-a-dir.json").mkdir()
    write_agent_log(tmp_path / "made-a-dir.json", "[]")  # the log is lost, nothing raised
