"""A tiny local package with its own tests, for exercising the SWE builder without any download.

`write_tiny_package(root)` writes `tinycalc` (a flat package, tests in tests/) under `root` and returns
its PackageSpec; its functions are rich enough for every function-level operator to apply.
`write_tinycalc_task(root)` writes one SWE task of it with the builder's own writer (a bug in `clamp`),
for tests of agents and of grading that need a real task without building a set.
`run_watched_pytest(repo, test_file, nonce)` runs pytest with the report plugin as the verifier does.
"""

from __future__ import annotations

import os
from pathlib import Path

from arl.harbor.swe.packages import PackageSpec

TINY_SOURCE = '''"""tinycalc: a few small functions with tests."""


def clamp(x, lo, hi):
    if lo > hi:
        raise ValueError("lo > hi")
    if x < lo:
        return lo
    elif x > hi:
        return hi
    else:
        return x


def weighted_total(xs, k):
    total = 0
    count = 0
    for x in xs:
        if x > k and x != 0:
            total += x * 2 - 1
        else:
            total -= 1
        count = count + 1
    try:
        mean = total / count
    except ZeroDivisionError:
        mean = 0
    return total + mean


def digits(n):
    out = []
    n = abs(n)
    while n >= 10:
        out.append(n % 10)
        n = n // 10
    out.append(n)
    if len(out) > 1:
        out.reverse()
    return out


class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, key, n=1):
        if n < 0:
            raise ValueError("negative")
        if key in self.counts:
            self.counts[key] = self.counts[key] + n
        else:
            self.counts[key] = n
        return self.counts[key]
'''

TINY_TESTS = """import pytest

from tinycalc import Counter, clamp, digits, weighted_total


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_low():
    assert clamp(-3, 0, 10) == 0


def test_clamp_high():
    assert clamp(30, 0, 10) == 10


def test_clamp_bad_range():
    with pytest.raises(ValueError):
        clamp(1, 5, 0)


def test_weighted_total():
    assert weighted_total([1, 5, 7], 4) == 28


def test_weighted_total_empty():
    assert weighted_total([], 4) == 0


@pytest.mark.parametrize("n,expected", [(0, [0]), (7, [7]), (1234, [1, 2, 3, 4]), (-56, [5, 6])])
def test_digits(n, expected):
    assert digits(n) == expected


def test_counter():
    c = Counter()
    assert c.add("a") == 1
    assert c.add("a", 2) == 3
    assert c.add("b") == 1


def test_counter_negative():
    with pytest.raises(ValueError):
        Counter().add("a", -1)
"""


def write_tiny_package(root: Path) -> PackageSpec:
    """Write the tinycalc package under `root` (created); returns its spec."""
    (root / "tinycalc").mkdir(parents=True, exist_ok=True)
    (root / "tests").mkdir(exist_ok=True)
    (root / "tinycalc" / "__init__.py").write_text(TINY_SOURCE)
    (root / "tests" / "test_tinycalc.py").write_text(TINY_TESTS)
    (root / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: tinycalc\nVersion: 0.0.1\n")
    return PackageSpec("tinycalc", "0.0.1")


# The bug of the tinycalc task: `clamp` returns the other bound.
_CLAMP_BUG = (
    ("    if x < lo:\n        return lo", "    if x < lo:\n        return hi"),
    ("    elif x > hi:\n        return hi", "    elif x > hi:\n        return lo"),
)
TINYCALC_FAIL_TO_PASS = ["tests/test_tinycalc.py::test_clamp_high", "tests/test_tinycalc.py::test_clamp_low"]
TINYCALC_PASS_TO_PASS = ["tests/test_tinycalc.py::test_clamp_inside", "tests/test_tinycalc.py::test_counter"]


def write_tinycalc_task(
    root: Path,
    *,
    name: str = "tinycalc__clamp",
    base_image: str | None = None,
    agent_timeout_sec: float | None = None,
    verifier_timeout_sec: float | None = None,
    venv: Path | None = None,
    cache: Path | None = None,
) -> Path:
    """A SWE task of tinycalc (its `clamp` returns the wrong bound) written by the builder's own writer
    under `root/name`, graded exactly as a built set's tasks are; returns its directory.

    `venv`: the package's test venv for the local sandbox (Debian's python3.11 with pytest), else one made
    by `venvs.ensure_venv` under `cache` (default `$ARL_SWE_TEST_CACHE`, else `<tmp>/arl-swe-testing`;
    pytest's wheels come from PyPI the first time). The timeouts and the image's base replace the
    writer's when given.
    """
    import os
    import re
    import tempfile

    from arl.harbor.swe import venvs
    from arl.harbor.swe.issue import write_issue
    from arl.harbor.swe.writer import TaskRecord, write_task

    source = Path(root) / "_src" / name
    spec = write_tiny_package(source)
    original = (source / "tinycalc" / "__init__.py").read_text()
    buggy = original
    for before, after in _CLAMP_BUG:
        buggy = buggy.replace(before, after)
    if venv is None:
        import filelock

        cache = cache or Path(
            os.environ.get("ARL_SWE_TEST_CACHE") or Path(tempfile.gettempdir()) / "arl-swe-testing"
        )
        cache.mkdir(parents=True, exist_ok=True)
        with filelock.FileLock(str(cache / ".venv.lock"), timeout=900):  # test processes side by side
            venv = venvs.ensure_venv(spec, cache)
    record = TaskRecord(
        id=name,
        package=spec.name,
        version=spec.version,
        module="tinycalc/__init__.py",
        function="clamp",
        operator="func_pm_ctrl_invert_if",
        fail_to_pass=TINYCALC_FAIL_TO_PASS,
        pass_to_pass=TINYCALC_PASS_TO_PASS,
        validate_s=0.5,
        test_files=["tests/test_tinycalc.py"],
    )
    message = (
        "tests/test_tinycalc.py:14: in test_clamp_high\n    assert clamp(30, 0, 10) == 10\nE   assert 0 == 10"
    )
    instruction = write_issue(
        spec.name,
        spec.version,
        TINYCALC_FAIL_TO_PASS,
        {TINYCALC_FAIL_TO_PASS[0]: message},
        len(TINYCALC_PASS_TO_PASS),
    )
    task = write_task(
        Path(root) / name,
        record=record,
        spec=spec,
        pristine_root=source,
        buggy_text=buggy,
        instruction=instruction,
        wheelhouse=None,
        venv_dir=Path(venv),
    )
    toml = task / "task.toml"
    text = toml.read_text()
    if agent_timeout_sec is not None:
        text = re.sub(r"(?m)^(\[agent\]\ntimeout_sec = ).*$", rf"\g<1>{float(agent_timeout_sec)}", text)
    if verifier_timeout_sec is not None:
        text = re.sub(r"(?m)^(\[verifier\]\ntimeout_sec = ).*$", rf"\g<1>{float(verifier_timeout_sec)}", text)
    toml.write_text(text)
    if base_image is not None:
        dockerfile = task / "environment" / "Dockerfile"
        lines = dockerfile.read_text().splitlines(True)
        dockerfile.write_text(
            "".join(f"FROM {base_image}\n" if ln.startswith("FROM ") else ln for ln in lines)
        )
    return task


def run_watched_pytest(
    repo: Path, test_file: str, nonce: str, *, timeout_s: float = 600
) -> tuple[int, bytes]:
    """pytest over `repo`'s `test_file` with the report plugin in the verifier's mode, as tests/test.sh runs
    it: the nonce through one pipe, the report stream back through another (drained while pytest runs, as
    test.sh's reader does), `repo/change.json` as grade_change.py's verdict. Returns pytest's exit status and
    the bytes the plugin wrote. `repo` needs a pytest.ini (the pinned config)."""
    import subprocess
    import sys
    import threading

    from arl.harbor.swe.writer import TASK_FILES

    nonce_read, nonce_write = os.pipe()
    os.write(nonce_write, nonce.encode())
    os.close(nonce_write)
    report_read, report_write = os.pipe()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "ARL_SWE"))}
    env.update(
        ARL_SWE_NONCE_FD=str(nonce_read),
        ARL_SWE_REPORT_FD=str(report_write),
        ARL_SWE_CHANGE=str(repo / "change.json"),
        ARL_SWE_TESTBED_ROOT=str(repo),
        PYTHONPATH=f"{TASK_FILES}:{repo}",
        PYTHONDONTWRITEBYTECODE="1",
    )
    command = [sys.executable, "-P", "-m", "pytest", "-p", "arl_swe_report", "-p", "no:cacheprovider",
               f"--rootdir={repo}", "-c", str(repo / "pytest.ini"), "-q", test_file]  # fmt: skip
    proc = subprocess.Popen(
        command,
        cwd=repo,
        env=env,
        pass_fds=(nonce_read, report_write),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(nonce_read)
    os.close(report_write)
    chunks: list[bytes] = []

    def drain() -> None:
        with os.fdopen(report_read, "rb") as pipe:
            chunks.extend(iter(lambda: pipe.read(65536), b""))

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout_s)
    finally:
        proc.kill()
        reader.join(timeout=60)
    return rc, b"".join(chunks)
