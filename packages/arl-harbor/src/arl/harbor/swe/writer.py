"""Write one SWE task as an ordinary Harbor task dir (the layout in arl.harbor.swe's README).

<task>/task.toml (graded in a separate, clean environment: Harbor's separate verifier mode, the agent's
/testbed carried as an artifact), instruction.md; environment/Dockerfile (FROM arl-swe-base:bookworm, the
testbed at /testbed and a base copy at /arl/base, the package's extra test wheels installed offline),
environment/testbed/ (the buggy source, a git repo with one commit), environment/wheels/,
environment/local_binds.json + local_setup.sh (the local sandbox's stand-in for the Dockerfile: the
package's venv bound at /arl/venv, the testbed at /arl/base); tests/test.sh (the grader), tests/config.json,
tests/plugin/ (the change grader, the report plugin, the scorer, an empty pytest config);
solution/fix.patch + solve.sh (the oracle).
"""

from __future__ import annotations

import difflib
import json
import math
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arl.harbor.swe import grading
from arl.harbor.swe.packages import PackageSpec
from arl.harbor.swe.runner import TASK_FILES, own_config

BASE_IMAGE = "arl-swe-base:bookworm"
AGENT_TIMEOUT_SEC = 1800.0
VERIFIER_TIMEOUT_SEC = 300.0
BUILD_TIMEOUT_SEC = 600.0
MEMORY_MB = 2048
SANDBOX_VENV = "/arl/venv"  # where the local sandbox binds the package's venv (environment/local_binds.json)
# The repository as built, read-only in the grading environment: what the agent's change is measured against.
BASE_DIR = "/arl/base"
# How the task is graded (tasks without it share the agent's environment with their verifier); a set graded an
# older clean way takes the current grader with `python -m arl.harbor.swe regrade` (arl.harbor.swe.regrade).
GRADING = "clean-environment-3"
# The grader's files, copied into tests/plugin/.
PLUGIN_FILES = ("arl_swe_report.py", "score.py", "grade_change.py", "pytest.ini")
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "arl",
    "GIT_AUTHOR_EMAIL": "arl@localhost",
    "GIT_COMMITTER_NAME": "arl",
    "GIT_COMMITTER_EMAIL": "arl@localhost",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


@dataclass
class TaskRecord:
    """One task's manifest row (the fields of the README's manifest plus a few for provenance)."""

    id: str
    package: str
    version: str
    module: str
    function: str
    operator: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    validate_s: float
    test_files: list[str] = field(default_factory=list)
    seed: int = 0
    image: str | None = None
    image_build_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def unified_patch(rel: str, before: str, after: str) -> str:
    """A `git apply` / `patch -p1` patch turning `before` into `after` for the file `rel`."""
    out = [f"diff --git a/{rel} b/{rel}\n", f"--- a/{rel}\n", f"+++ b/{rel}\n"]
    diff = list(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True), n=3))
    for line in diff[2:]:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _write(path: Path, text: str, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        path.chmod(mode)


def _git_commit(testbed: Path, message: str) -> None:
    env = {**os.environ, **_GIT_ENV}
    for cmd in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "--no-gpg-sign", "-m", message],
    ):
        subprocess.run(cmd, cwd=testbed, env=env, check=True, capture_output=True, timeout=120)


def outdated_grading(task_set: Path) -> list[str]:
    """The tasks of a built set that are not graded the current way (`GRADING`), by id."""
    import tomllib

    stale = []
    for toml in sorted(task_set.glob("*/task.toml")):
        metadata = tomllib.loads(toml.read_text()).get("metadata", {})
        if metadata.get("arl_grading") != GRADING:
            stale.append(toml.parent.name)
    return stale


def write_task(
    task_dir: Path,
    *,
    record: TaskRecord,
    spec: PackageSpec,
    pristine_root: Path,
    buggy_text: str,
    instruction: str,
    wheelhouse: Path | None,
    venv_dir: Path,
) -> Path:
    """Write the task dir for `record` (replacing one already there); returns `task_dir`."""
    shutil.rmtree(task_dir, ignore_errors=True)
    env_dir = task_dir / "environment"
    testbed = env_dir / "testbed"
    shutil.copytree(pristine_root, testbed, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".git"))
    original = (pristine_root / record.module).read_text()
    (testbed / record.module).write_text(buggy_text)
    _git_commit(testbed, f"{spec.name} {spec.version}")

    q = shlex.quote
    wheels = sorted(wheelhouse.glob("*.whl")) if wheelhouse else []
    docker = [f"FROM {BASE_IMAGE}", "COPY testbed /testbed", f"COPY testbed {BASE_DIR}"]
    if wheels:
        (env_dir / "wheels").mkdir(parents=True)
        for w in wheels:
            shutil.copy2(w, env_dir / "wheels" / w.name)
        docker += [
            "COPY wheels /tmp/arl-wheels",
            "RUN python3 -m pip install --no-index --find-links /tmp/arl-wheels --break-system-packages "
            f"{' '.join(q(d) for d in spec.test_deps)} && rm -rf /tmp/arl-wheels",
        ]
    src_path = "/testbed" if spec.src_root == "." else f"/testbed/{spec.src_root}"
    # PATH: in the local sandbox python3 is then the bound venv's; in the image /arl/venv does not exist.
    docker += [f"ENV PYTHONPATH={src_path}", f"ENV PATH={SANDBOX_VENV}/bin:$PATH", "WORKDIR /testbed", ""]
    _write(env_dir / "Dockerfile", "\n".join(docker))
    # The local sandbox honours the Dockerfile's COPY and ENV itself; the package's venv (Debian's python3.11,
    # pytest, the test deps) is bound read-only at /arl/venv and the testbed at /arl/base (a bind stands in
    # for the COPY of the same path; arl.harbor.environment's local_binds.json, relative to environment/,
    # so the set can move), and local_setup.sh stands in for the RUN step.
    rel_venv = os.path.relpath(venv_dir, env_dir)
    _write(env_dir / "local_binds.json", json.dumps({SANDBOX_VENV: rel_venv, BASE_DIR: "testbed"}) + "\n")
    _write(
        env_dir / "local_setup.sh",
        f"""#!/bin/bash
# Stand-in for the Dockerfile's RUN steps in arl's local (unshare) sandbox: the testbed is already at
# /testbed (the Dockerfile's COPY) and the package's venv is bound at {SANDBOX_VENV} (local_binds.json), so
# this only checks that the tests can run.
set -e
[ -d /testbed ] || {{ echo "local_setup.sh: no /testbed" >&2; exit 1; }}
{SANDBOX_VENV}/bin/python -c "import pytest" \\
  || {{ echo "local_setup.sh: pytest not importable from {SANDBOX_VENV}" >&2; exit 1; }}
""",
        0o755,
    )

    tests_dir = task_dir / "tests"
    (tests_dir / "plugin").mkdir(parents=True, exist_ok=True)
    for name in PLUGIN_FILES:
        shutil.copy2(TASK_FILES / name, tests_dir / "plugin" / name)
    config_file = own_config(testbed)
    pytest_config = config_file.relative_to(testbed).as_posix() if config_file is not None else ""
    test_sh = (TASK_FILES / "test.sh").read_text()
    # A bug can make the suite much slower than at baseline (its validation run shows how slow): the
    # verifier gets 10x that run, at least VERIFIER_TIMEOUT_SEC, and pytest 30 s less.
    verifier_timeout = max(VERIFIER_TIMEOUT_SEC, float(math.ceil(10 * record.validate_s)) + 60.0)
    pytest_timeout = int(verifier_timeout - 30)
    for key, value in {
        "@SRC_ROOT@": q(spec.src_root),
        "@TEST_FILES@": " ".join(q(f) for f in record.test_files),
        "@PYTEST_ARGS@": " ".join(q(a) for a in spec.pytest_args),
        "@PYTEST_TIMEOUT_SEC@": str(pytest_timeout),
        "@VENV_PYTHON@": q(f"{SANDBOX_VENV}/bin/python"),
        "@BASE_DIR@": BASE_DIR,
        "@PYTEST_CONFIG@": q(pytest_config),
    }.items():
        test_sh = test_sh.replace(key, value)
    _write(tests_dir / "test.sh", test_sh, 0o755)
    # A fix that puts back what the bug removed may need patterns the grader otherwise refuses (sys.modules).
    reach = grading.reach_patterns_without(grading.needed_reach_patterns(original, buggy_text))
    config = {
        "fail_to_pass": record.fail_to_pass,
        "pass_to_pass": record.pass_to_pass,
        "package": spec.name,
        "version": spec.version,
        "module": record.module,
        "function": record.function,
        "operator": record.operator,
        "test_files": record.test_files,
        "src_root": spec.src_root,
        "pytest_args": list(spec.pytest_args),
        "pytest_config": pytest_config,
    }
    if reach is not None:
        config["reach_patterns"] = reach
    _write(tests_dir / "config.json", json.dumps(config, indent=1) + "\n")

    _write(task_dir / "solution" / "fix.patch", unified_patch(record.module, buggy_text, original))
    _write(
        task_dir / "solution" / "solve.sh",
        """#!/bin/bash
# The oracle: the reverse of the bug, applied in the testbed.
set -e
SOLUTION_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "${ARL_SWE_TESTBED:-/testbed}"
patch -p1 --forward --batch < "$SOLUTION_DIR/fix.patch"
""",
        0o755,
    )
    _write(task_dir / "instruction.md", instruction)
    # Graded in a separate environment from the same image: the agent's /testbed is carried there after
    # every process of the agent's environment ended (Harbor's separate verifier mode).
    _write(
        task_dir / "task.toml",
        f"""schema_version = "1.4"
artifacts = ["/testbed"]

[metadata]
package = {json.dumps(spec.name)}
version = {json.dumps(spec.version)}
module = {json.dumps(record.module)}
function = {json.dumps(record.function)}
operator = {json.dumps(record.operator)}
category = "swe"
arl_grading = {json.dumps(GRADING)}

[verifier]
timeout_sec = {verifier_timeout}
environment_mode = "separate"

[agent]
timeout_sec = {AGENT_TIMEOUT_SEC}

[environment]
build_timeout_sec = {BUILD_TIMEOUT_SEC}
cpus = 1
memory_mb = {MEMORY_MB}
workdir = "/testbed"
network_mode = "no-network"
""",
    )
    return task_dir
