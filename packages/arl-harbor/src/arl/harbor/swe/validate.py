"""Which tests a bug breaks: the package's own tests before and after, FAIL_TO_PASS / PASS_TO_PASS.

A package's baseline is its pristine source's test outcomes, run `runs` times side by side (the load of
the other runs is what exposes timing- and socket-dependent tests): a test counts only if it passed every
time, so a flaky test never becomes FAIL_TO_PASS or PASS_TO_PASS; the ones that did not are `flaky`. A
candidate bug is run against the test files that import its module only (`mapped_test_files`), with a
timeout; it is kept when some baseline-passing tests now fail (FAIL_TO_PASS) and the others of those files
still pass (PASS_TO_PASS).
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from arl.harbor.swe.packages import PackageSpec
from arl.harbor.swe.runner import PytestRun, run_pytest

_NOT_SOURCE_DIRS = {"tests", "test", "testing", "docs", "doc", "benchmark", "benchmarks", "examples",
                    "scripts", "tools", "build", "dist"}


def is_test_path(rel: str) -> bool:
    """True for a test module path (tests/…, test_*.py, *_test.py, conftest.py)."""
    p = PurePosixPath(rel)
    if p.suffix != ".py":
        return False
    return (p.name.startswith("test_") or p.name.endswith("_test.py") or p.name == "conftest.py"
            or any(part in ("tests", "test") for part in p.parts[:-1]))


def source_modules(root: Path, spec: PackageSpec) -> list[str]:
    """The package's own modules (paths relative to `root`, sorted) that bugs may go into."""
    base = (root / spec.src_root).resolve()
    out = []
    for path in sorted(base.rglob("*.py")):
        rel_src = path.relative_to(base)
        if any(part in _NOT_SOURCE_DIRS or part.endswith(".egg-info") or part.startswith(".")
               for part in rel_src.parts[:-1]):
            continue
        rel = path.relative_to(root.resolve()).as_posix()
        if is_test_path(rel) or rel_src.name == "setup.py" or len(rel_src.parts) == 1 and rel_src.name in (
                "conftest.py", "noxfile.py", "fabfile.py"):
            continue
        out.append(rel)
    return out


def module_token(module_rel: str, spec: PackageSpec) -> str:
    """The name tests use to import a module: its last dotted component (the package's for __init__)."""
    p = PurePosixPath(module_rel).relative_to(PurePosixPath(spec.src_root)) if spec.src_root != "." \
        else PurePosixPath(module_rel)
    parts = list(p.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return parts[-1] if parts else spec.name


def mapped_test_files(module_rel: str, spec: PackageSpec, root: Path, test_files: list[str]) -> list[str]:
    """The test files that mention the module's import name (word match); every file if none does."""
    token = module_token(module_rel, spec)
    pattern = re.compile(rf"\b{re.escape(token)}\b")
    hits = [f for f in test_files if pattern.search((root / f).read_text(errors="replace"))]
    return hits or list(test_files)


@dataclass
class Classification:
    """FAIL_TO_PASS / PASS_TO_PASS of one candidate, or why it was rejected."""

    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)
    reject: str | None = None  # None: a keeper

    @property
    def kept(self) -> bool:
        return self.reject is None


def classify(baseline_passed: set[str], run: PytestRun) -> Classification:
    """Split the baseline-passing tests by the candidate run's outcomes."""
    if run.timed_out:
        return Classification(reject="timeout")
    if run.exitstatus is None:
        return Classification(reject="no report (pytest crashed)")
    now = run.passed()
    f2p = sorted(t for t in baseline_passed if t not in now)
    p2p = sorted(t for t in baseline_passed if t in now)
    if not f2p:
        return Classification(reject="no test fails")
    if not p2p:
        return Classification(f2p, p2p, reject="every test fails")
    return Classification(f2p, p2p)


class Baseline:
    """The pristine package's test outcomes, per set of test files (memoised, thread-safe)."""

    def __init__(self, root: Path, python: Path, spec: PackageSpec, *, runs: int = 3,
                 timeout_sec: float = 300.0) -> None:
        if runs < 2:
            raise ValueError(f"Baseline runs must be at least 2 to tell flaky tests (got {runs})")
        self.root, self.python, self.spec, self.runs, self.timeout_sec = root, python, spec, runs, timeout_sec
        self._memo: dict[tuple[str, ...], tuple[set[str], float]] = {}
        self._lock = threading.Lock()
        self.test_files: list[str] = []
        self.flaky: set[str] = set()  # passed in some runs of the pristine source and not in others

    def _args(self) -> list[str]:
        args = list(self.spec.pytest_args)
        for skip in self.spec.skip_test_files:
            args += ["--ignore", skip]
        return args

    def _run_side_by_side(self, files: list[str] | None, args: list[str]) -> tuple[set[str], float]:
        """Tests passing in every one of `runs` simultaneous runs (the rest that passed once are flaky)."""
        with ThreadPoolExecutor(max_workers=self.runs) as pool:
            runs = list(pool.map(lambda _: run_pytest(self.root, self.python, src_root=self.spec.src_root,
                                                      files=files, args=args, timeout_sec=self.timeout_sec),
                                 range(self.runs)))
        for run in runs:
            if run.exitstatus is None:
                raise RuntimeError(f"{self.spec.key}: the pristine test suite did not run:\n{run.output[-3000:]}")
        every = set.intersection(*(r.passed() for r in runs))
        some = set.union(*(r.passed() for r in runs))
        with self._lock:
            self.flaky |= {t for t in some - every if is_test_path(t.split("::", 1)[0])}
        return {t for t in every if is_test_path(t.split("::", 1)[0])}, max(r.seconds for r in runs)

    def discover(self) -> list[str]:
        """Run the whole suite (as configured); record the test files with tests that pass every time."""
        passed, _ = self._run_side_by_side(None, self._args())
        files = sorted({t.split("::", 1)[0] for t in passed})
        files = [f for f in files if f not in self.spec.skip_test_files]
        if not files:
            raise RuntimeError(f"{self.spec.key}: no passing tests found in the pristine source")
        self.test_files = files
        return files

    def passed(self, files: list[str]) -> tuple[set[str], float]:
        """Tests of `files` that pass in every run on the pristine source (never one flaky in any earlier
        baseline run of this package), and the slowest run's seconds."""
        key = tuple(files)
        with self._lock:
            if key in self._memo:
                return self._memo[key]
        passed, seconds = self._run_side_by_side(files, list(self.spec.pytest_args))
        with self._lock:
            result = (passed - self.flaky, seconds)
            self._memo[key] = result
        return result
