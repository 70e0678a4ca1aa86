"""A minimal SWE-style task whose verifier is real pytest (the task layout of arl.harbor.swe's README), for
the docker and local-sandbox tests: a package with a bug, its own tests as the verifier, the reverse patch
as the oracle. Its `tests/test.sh` writes no reward when the harness cannot run (a verifier failure).
"""

from __future__ import annotations

from pathlib import Path

SWE_BASE_IMAGE = "arl-swe-base:bookworm"
_SWE_BUGGY = '''"""minicalc: a tiny package whose tests are the verifier."""


def add(a, b):
    return a - b


def mul(a, b):
    return a * b
'''
_SWE_FIXED = _SWE_BUGGY.replace("return a - b", "return a + b")
_SWE_TESTS = """from minicalc import add, mul


def test_add():
    assert add(2, 3) == 5


def test_mul():
    assert mul(2, 3) == 6
"""
# What a SWE task's tests/test.sh does: restore the pristine tests, run the listed ids, reward only from a
# junit report; a harness that cannot run writes no reward and says why (a verifier failure, never a 0).
SWE_TEST_SH = r"""#!/bin/bash
set -u
cd /testbed || { echo "verifier: /testbed missing" >&2; exit 3; }
cp -r /tests/pristine/. /testbed/
PY=python3
[ -x /arl/venv/bin/python ] && PY=/arl/venv/bin/python  # the local sandbox: a bound venv
if ! "$PY" -c 'import pytest' 2>/tmp/harness.err; then
  echo "verifier: the test harness cannot run: $PY cannot import pytest: $(tail -n1 /tmp/harness.err)" >&2
  exit 3
fi
rm -f /tmp/junit.xml
"$PY" -m pytest -p no:cacheprovider -q --junitxml=/tmp/junit.xml $(cat /tests/test_ids.txt) \
  > /logs/verifier/pytest.log 2>&1
if [ ! -s /tmp/junit.xml ]; then
  echo "verifier: pytest wrote no junit report (see pytest.log)" >&2
  exit 3
fi
"$PY" - <<'PYEOF'
import json, xml.etree.ElementTree as ET
ids = open("/tests/test_ids.txt").read().split()
passed = set()
for case in ET.parse("/tmp/junit.xml").iter("testcase"):
    if not any(c.tag in ("failure", "error", "skipped") for c in case):
        passed.add(case.get("name"))
names = [i.split("::")[-1] for i in ids]
ok = sum(n in passed for n in names)
json.dump({"reward": 1.0 if ok == len(names) else 0.0, "fail_to_pass": ok / len(names)},
          open("/logs/verifier/reward.json", "w"))
PYEOF
"""


def write_pytest_swe_task(
    root: Path,
    name: str = "minicalc-add",
    *,
    venv: Path | None = None,
    base_image: str = SWE_BASE_IMAGE,
    test_script: str = SWE_TEST_SH,
    agent_timeout_sec: float = 120.0,
    verifier_timeout_sec: float = 120.0,
    build_timeout_sec: float = 600.0,
    network_mode: str = "no-network",
) -> Path:
    """Writes a minimal SWE-style task (a package with a bug, its own tests as the verifier) under `root`.

    Follows the SWE task layout: `environment/Dockerfile` is `FROM <base_image>` + `COPY testbed
    /testbed`; `environment/testbed/` is a git repo holding the bug (`add` subtracts); `tests/test.sh`
    restores `tests/pristine/` and runs `tests/test_ids.txt` with pytest, rewarding 1.0 iff all pass;
    `solution/fix.patch` is the reverse patch. `venv` (a host venv of Debian's python3 with pytest) is
    bound read-only at /arl/venv in the local sandbox (`environment/local_binds.json`), where
    test.sh prefers it: the base image's python3 + pytest, the same Python, in docker.
    """
    import difflib
    import json
    import subprocess

    task = root / name
    env = task / "environment"
    testbed = env / "testbed"
    (testbed / "minicalc").mkdir(parents=True, exist_ok=True)
    (testbed / "tests").mkdir(exist_ok=True)
    (testbed / "minicalc" / "__init__.py").write_text(_SWE_BUGGY)
    (testbed / "tests" / "test_minicalc.py").write_text(_SWE_TESTS)
    git = ["git", "-c", "user.name=arl", "-c", "user.email=arl@localhost", "-C", str(testbed)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "minicalc"], check=True)
    (env / "Dockerfile").write_text(f"FROM {base_image}\nCOPY testbed /testbed\nWORKDIR /testbed\n")
    if venv is not None:
        (env / "local_binds.json").write_text(json.dumps({"/arl/venv": str(Path(venv).resolve())}))
    (task / "tests" / "pristine" / "tests").mkdir(parents=True, exist_ok=True)
    (task / "tests" / "pristine" / "tests" / "test_minicalc.py").write_text(_SWE_TESTS)
    (task / "tests" / "test_ids.txt").write_text(
        "tests/test_minicalc.py::test_add\ntests/test_minicalc.py::test_mul\n"
    )
    (task / "solution").mkdir(exist_ok=True)
    patch = "".join(
        difflib.unified_diff(
            _SWE_BUGGY.splitlines(keepends=True),
            _SWE_FIXED.splitlines(keepends=True),
            "a/minicalc/__init__.py",
            "b/minicalc/__init__.py",
        )
    )
    (task / "solution" / "fix.patch").write_text(patch)
    for path, text in (
        (task / "tests" / "test.sh", test_script),
        (
            task / "solution" / "solve.sh",
            "#!/bin/bash\nset -e\ncd /testbed\npatch -p1 < /solution/fix.patch\n",
        ),
    ):
        path.write_text(text)
        path.chmod(0o755)
    (task / "instruction.md").write_text(
        "tests/test_minicalc.py::test_add fails: `assert add(2, 3) == 5` (got -1). "
        "Make the package's tests pass without editing them.\n"
    )
    network = f'network_mode = "{network_mode}"\n' if network_mode else ""
    (task / "task.toml").write_text(
        f'schema_version = "1.4"\n\n[metadata]\n\n'
        f"[verifier]\ntimeout_sec = {float(verifier_timeout_sec)}\n\n"
        f"[agent]\ntimeout_sec = {float(agent_timeout_sec)}\n\n"
        f"[environment]\nbuild_timeout_sec = {float(build_timeout_sec)}\ncpus = 1\nmemory_mb = 2048\n"
        f'workdir = "/testbed"\n{network}'
    )
    return task


PYTEST_REQUIREMENT = "pytest==9.2.0"  # the base image's (scripts/docker/build_base_image.sh)
DEBIAN_PYTHON = "/usr/bin/python3.11"


def make_pytest_venv(dest: Path, wheelhouse: Path) -> Path:
    """A venv of Debian's python3 with pytest from `wheelhouse` (downloaded there from PyPI if empty)."""
    import subprocess

    if not list(wheelhouse.glob("pytest-*.whl")):
        wheelhouse.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                DEBIAN_PYTHON,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--only-binary",
                ":all:",
                "-d",
                str(wheelhouse),
                PYTEST_REQUIREMENT,
            ],
            check=True,
            timeout=300,
        )
    subprocess.run([DEBIAN_PYTHON, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=120)
    subprocess.run(
        [
            DEBIAN_PYTHON,
            "-m",
            "pip",
            "--python",
            str(dest / "bin" / "python"),
            "install",
            "--quiet",
            "--no-index",
            "--find-links",
            str(wheelhouse),
            PYTEST_REQUIREMENT,
        ],
        check=True,
        timeout=300,
    )
    return dest
