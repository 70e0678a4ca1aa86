"""Verifiers that cannot run are failures by kind, never a reward of 0 that trains (issue 31, item 4).

Real Harbor trials in the local sandbox, one per way a verifier can fail to run: a missing test runner,
a test harness that does not import, a verifier timeout, no reward file, and the separate verifier mode
whose `tests/Dockerfile` installs the runner (which used to score a correct solution 0.0 silently).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arl.harbor import HarborAgentLoop
from arl.harbor.testing import write_hello_task
from arl.proxy.types import SamplingParams
from arl.rollout.types import Task

from .conftest import needs_sandbox

pytestmark = needs_sandbox

REPO = Path(__file__).resolve().parents[3]
WHEELHOUSE = REPO / ".cache" / "arl-harbor-tests" / "wheels-py311"


async def run(config, path: Path):
    task = Task(id=path.name, messages=[], agent="harbor", metadata={"harbor_task_path": str(path)})
    return await HarborAgentLoop(config).run(task, None, SamplingParams(), "req-1")  # type: ignore[arg-type]


# A naive verifier: any failure of pytest, including pytest not being there, is written as a 0.
NAIVE_PYTEST = """#!/bin/bash
cat > /tmp/test_hello.py <<'EOF'
def test_hello():
    assert open("/app/hello.txt").read().strip() == "Hello, world!"
EOF
if {runner} /tmp/test_hello.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


@pytest.mark.parametrize(
    ("runner", "cause"),
    [("pytest -q", "pytest: command not found"), ("python3 -m pytest -q", "No module named pytest")],
    ids=["missing-runner", "harness-import-error"],
)
async def test_a_runner_that_cannot_run_is_not_a_zero(tmp_path, harbor_config, runner, cause):
    task = write_hello_task(tmp_path / "tasks", test_script=NAIVE_PYTEST.format(runner=runner))
    result = await run(harbor_config(agent="oracle"), task)  # a correct solution
    assert result.failed and result.failure_kind == "verifier_harness", (result.failure_kind, result.error)
    assert cause in result.error and "1 attempt(s)" in result.error  # dropped at once (deterministic)


async def test_no_reward_file_is_retried_with_its_cause(tmp_path, harbor_config):
    script = '#!/bin/bash\necho "arl-swe verifier cannot run: pytest wrote no report" >&2\nexit 3\n'
    task = write_hello_task(tmp_path / "tasks", test_script=script)
    result = await run(harbor_config(agent="oracle", policy={"max_attempts": 2}), task)
    assert result.failed and result.failure_kind == "verifier_error"
    assert result.error.count("RewardFileNotFoundError") == 2 and "pytest wrote no report" in result.error


async def test_verifier_timeout_is_retried_then_failed(tmp_path, harbor_config):
    task = write_hello_task(
        tmp_path / "tasks",
        verifier_timeout_sec=1.0,
        test_script="#!/bin/bash\nsleep 30\necho 1 > /logs/verifier/reward.txt\n",
    )
    result = await run(harbor_config(agent="oracle", policy={"max_attempts": 2}), task)
    assert result.failed and result.failure_kind == "verifier_timeout" and result.reward == 0.0
    assert result.error.count("VerifierTimeoutError") == 2


def _separate_task_with_runner_image(root: Path) -> Path:
    """Separate verifier mode; the verifier image (tests/Dockerfile) installs pytest, test.sh needs it."""
    task = write_hello_task(
        root,
        verifier_mode="separate",
        tests_image=True,
        test_script=NAIVE_PYTEST.format(runner="${ARL_PYTEST:-pytest} -q").replace(
            "#!/bin/bash\n",
            "#!/bin/bash\n[ -x /arl/venv/bin/python ] && ARL_PYTEST='/arl/venv/bin/python -m pytest'\n",
        ),
    )
    (task / "tests" / "Dockerfile").write_text(
        "FROM debian:bookworm-slim\nRUN apt-get update && apt-get install -y python3-pytest\nCOPY . /tests/\n"
    )
    return task


async def test_separate_verifier_image_with_run_steps_fails_by_kind(tmp_path, harbor_config):
    """Before: the local sandbox ignored tests/Dockerfile's RUN, pytest was missing, a correct solution scored 0.0."""
    task = _separate_task_with_runner_image(tmp_path / "tasks")
    result = await run(harbor_config(agent="oracle"), task)
    assert result.failed and result.failure_kind == "invalid_task", (
        result.reward,
        result.failure_kind,
        result.error,
    )
    assert "tests/Dockerfile" in result.error and "apt-get install -y python3-pytest" in result.error
    assert "1 attempt(s)" in result.error
    # Told to run without the RUN steps, the missing runner is still caught (its 0 is not a reward).
    ignored = await run(harbor_config(agent="oracle", environment_kwargs={"dockerfile_run": "ignore"}), task)
    assert ignored.failed and ignored.failure_kind == "verifier_harness", (
        ignored.failure_kind,
        ignored.error,
    )


@pytest.fixture(scope="session")
def pytest_venv(tmp_path_factory):
    from .pytest_swe_task import DEBIAN_PYTHON, make_pytest_venv

    if not Path(DEBIAN_PYTHON).exists():
        pytest.skip(f"needs Debian's {DEBIAN_PYTHON} (the python of the SWE base image)")
    try:
        return make_pytest_venv(tmp_path_factory.mktemp("venv") / "py311", WHEELHOUSE)
    except Exception as e:  # noqa: BLE001 - no PyPI and no cached wheelhouse: say so
        pytest.skip(f"cannot prepare a pytest venv (PyPI unreachable and no wheels in {WHEELHOUSE}): {e}")


async def test_separate_verifier_image_with_a_local_stand_in_scores_right(
    tmp_path, harbor_config, pytest_venv
):
    """The fix's other half: tests/local_setup.sh + tests/local_binds.json stand in for the RUN steps."""
    task = _separate_task_with_runner_image(tmp_path / "tasks")
    (task / "tests" / "local_binds.json").write_text(json.dumps({"/arl/venv": str(pytest_venv)}))
    (task / "tests" / "local_setup.sh").write_text(
        "#!/bin/bash\n# pytest comes from the bound venv\n/arl/venv/bin/python -m pytest --version\n"
    )
    oracle = await run(harbor_config(agent="oracle"), task)
    assert not oracle.failed and oracle.reward == 1.0, oracle.error
    nop = await run(harbor_config(agent="nop"), task)
    assert not nop.failed and nop.reward == 0.0, nop.error
