"""Which tests a bug breaks: the package's own tests before and after, FAIL_TO_PASS / PASS_TO_PASS.

First `probe_suite` runs the whole suite once, alone, under a time limit: a package whose suite collects
no tests, does not collect, runs past the limit or passes no test is refused with what was measured
(`PackageRefusedError`). A package's baseline is its pristine source's test outcomes, run `runs` times
side by side (the load of the other runs is what exposes timing- and socket-dependent tests): a test
counts only if it passed every time, so a flaky test never becomes FAIL_TO_PASS or PASS_TO_PASS; the ones
that did not are `flaky`. A candidate bug is run against the test files that import its module only
(`mapped_test_files`), with a timeout; it is kept when some baseline-passing tests now fail (FAIL_TO_PASS)
and the others of those files still pass (PASS_TO_PASS).
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from arl.harbor.errors import PackageRefusedError
from arl.harbor.swe.packages import PackageSpec
from arl.harbor.swe.runner import PytestRun, run_pytest

_NOT_SOURCE_DIRS = {
    "tests",
    "test",
    "testing",
    "docs",
    "doc",
    "benchmark",
    "benchmarks",
    "examples",
    "scripts",
    "tools",
    "build",
    "dist",
}


def is_test_path(rel: str) -> bool:
    """True for a test module path (tests/…, test_*.py, *_test.py, conftest.py)."""
    p = PurePosixPath(rel)
    if p.suffix != ".py":
        return False
    return (
        p.name.startswith("test_")
        or p.name.endswith("_test.py")
        or p.name == "conftest.py"
        or any(part in ("tests", "test") for part in p.parts[:-1])
    )


def source_modules(root: Path, spec: PackageSpec) -> list[str]:
    """The package's own modules (paths relative to `root`, sorted) that bugs may go into."""
    base = (root / spec.src_root).resolve()
    out = []
    for path in sorted(base.rglob("*.py")):
        rel_src = path.relative_to(base)
        if any(
            part in _NOT_SOURCE_DIRS or part.endswith(".egg-info") or part.startswith(".")
            for part in rel_src.parts[:-1]
        ):
            continue
        rel = path.relative_to(root.resolve()).as_posix()
        if (
            is_test_path(rel)
            or rel_src.name == "setup.py"
            or len(rel_src.parts) == 1
            and rel_src.name in ("conftest.py", "noxfile.py", "fabfile.py")
        ):
            continue
        out.append(rel)
    return out


def module_token(module_rel: str, spec: PackageSpec) -> str:
    """The name tests use to import a module: its last dotted component (the package's for __init__)."""
    p = (
        PurePosixPath(module_rel).relative_to(PurePosixPath(spec.src_root))
        if spec.src_root != "."
        else PurePosixPath(module_rel)
    )
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


def suite_args(spec: PackageSpec) -> list[str]:
    """The pytest arguments of a whole-suite run: the spec's own, and its skipped test files ignored."""
    args = list(spec.pytest_args)
    for skip in spec.skip_test_files:
        args += ["--ignore", skip]
    return args


@dataclass
class SuiteProbe:
    """One run of the pristine package's whole suite, alone: what it collected and how long it took."""

    tests: int  # test node ids that reported an outcome
    passed: int
    seconds: float


def _one_line(output: str, chars: int = 600) -> str:
    """The end of pytest's output on one line (a reason is printed as one)."""
    return " | ".join(ln.strip() for ln in output.splitlines() if ln.strip())[-chars:]


def _first_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("E ")]
    return (errors[-1] if errors else lines[-1] if lines else "").removeprefix("E ").strip()[:200]


def probe_suite(root: Path, python: Path, spec: PackageSpec, *, limit_s: float) -> SuiteProbe:
    """Run the whole suite once with `limit_s` as its timeout; refuse the package when it collects no tests,
    does not collect, runs past the limit, leaves no report or passes no test."""
    run = run_pytest(root, python, src_root=spec.src_root, args=suite_args(spec), timeout_sec=limit_s)

    def refuse(kind: str, reason: str) -> PackageRefusedError:
        return PackageRefusedError(spec.key, kind, reason)

    if run.timed_out:
        raise refuse(
            "too_slow",
            f"the pristine test suite ran past the {limit_s:g} s limit (killed after "
            f"{run.seconds:.0f} s; --max-suite-seconds raises the limit)",
        )
    if run.collect_errors:
        first, text = next(iter(run.collect_errors.items()))
        raise refuse(
            "does_not_collect",
            f"{len(run.collect_errors)} collection error(s), e.g. {first or '.'}: "
            f"{_first_error_line(text)} (leave such files out with "
            "skip_test_files, or add what they import to test_deps)",
        )
    if run.exitstatus is None:
        raise refuse("crashed", f"pytest ended without a report: {_one_line(run.output)}")
    tests = {t: o for t, o in run.tests.items() if is_test_path(t.split("::", 1)[0])}
    if not tests:
        shipped = [
            p
            for p in root.rglob("*.py")
            if is_test_path(p.relative_to(root).as_posix()) and p.name != "conftest.py"
        ]
        where = (
            f"the sdist has {len(shipped)} test file(s) that it does not collect (check pytest_args and "
            "the package's pytest config)"
            if shipped
            else "the sdist ships no test files (tests/, test_*.py, *_test.py)"
        )
        raise refuse("no_tests", f"pytest collected no tests in {run.seconds:.1f} s; {where}")
    passed = sum(1 for o in tests.values() if o == "passed")
    if not passed:
        first = next(iter(tests))
        raise refuse(
            "no_passing_tests",
            f"none of the {len(tests)} tests passed on the pristine source, e.g. "
            f"{first}: {_first_error_line(run.messages.get(first, ''))}",
        )
    return SuiteProbe(tests=len(tests), passed=passed, seconds=round(run.seconds, 2))


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

    def __init__(
        self, root: Path, python: Path, spec: PackageSpec, *, runs: int = 3, timeout_sec: float = 300.0
    ) -> None:
        if runs < 2:
            raise ValueError(f"Baseline runs must be at least 2 to tell flaky tests (got {runs})")
        self.root, self.python, self.spec, self.runs, self.timeout_sec = root, python, spec, runs, timeout_sec
        self._memo: dict[tuple[str, ...], tuple[set[str], float]] = {}
        self._lock = threading.Lock()
        self.test_files: list[str] = []
        self.flaky: set[str] = set()  # passed in some runs of the pristine source and not in others

    def _run_side_by_side(self, files: list[str] | None, args: list[str]) -> tuple[set[str], float]:
        """Tests passing in every one of `runs` simultaneous runs (the rest that passed once are flaky)."""
        with ThreadPoolExecutor(max_workers=self.runs) as pool:
            runs = list(
                pool.map(
                    lambda _: run_pytest(
                        self.root,
                        self.python,
                        src_root=self.spec.src_root,
                        files=files,
                        args=args,
                        timeout_sec=self.timeout_sec,
                    ),
                    range(self.runs),
                )
            )
        for run in runs:
            if run.exitstatus is None:
                how = f"ran past {self.timeout_sec:g} s" if run.timed_out else "crashed"
                what = f"a baseline run of the pristine tests {how} without a report: {_one_line(run.output)}"
                if files is None:  # the whole suite, before any task: the package's refusal
                    raise PackageRefusedError(self.spec.key, "too_slow" if run.timed_out else "crashed", what)
                raise RuntimeError(f"{self.spec.key}: {what}")
        every = set.intersection(*(r.passed() for r in runs))
        some = set.union(*(r.passed() for r in runs))
        with self._lock:
            self.flaky |= {t for t in some - every if is_test_path(t.split("::", 1)[0])}
        return {t for t in every if is_test_path(t.split("::", 1)[0])}, max(r.seconds for r in runs)

    def discover(self) -> list[str]:
        """Run the whole suite (as configured); record the test files with tests that pass every time."""
        passed, _ = self._run_side_by_side(None, suite_args(self.spec))
        files = sorted({t.split("::", 1)[0] for t in passed})
        files = [f for f in files if f not in self.spec.skip_test_files]
        if not files:
            raise PackageRefusedError(
                self.spec.key,
                "no_passing_tests",
                f"no test passed in every one of the "
                f"{self.runs} baseline runs side by side ({len(self.flaky)} flaky)",
            )
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
