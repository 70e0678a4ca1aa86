"""Which new tests a release's source change makes pass: FAIL_TO_PASS / PASS_TO_PASS of a release pair.

Both trees carry the new release's tests: "before" is the old source with them, "after" the old source
with them and the release's source change, i.e. exactly what the task's verifier runs after doing
nothing and after the oracle. Each tree runs the changed test modules `runs` times side by side (the
others' load exposes timing-dependent tests). FAIL_TO_PASS = tests passing in every "after" run and in
no "before" run; PASS_TO_PASS = passing in every run of both; a test passing in some runs of a tree but
not all is flaky and left out of both.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from arl.harbor.swe.packages import PackageSpec
from arl.harbor.swe.runner import PytestRun, run_pytest
from arl.harbor.swe.validate import is_test_path

RUN_TIMEOUT_SEC = 300.0
BEFORE_TIMEOUT_FLOOR_SEC = 30.0


@dataclass
class PairTests:
    """The tests of a release pair, by role (sorted), or why the pair gives no task."""

    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)
    flaky: list[str] = field(default_factory=list)
    reject: str | None = None  # None: FAIL_TO_PASS is not empty

    def test_files(self) -> list[str]:
        """The files holding FAIL_TO_PASS or PASS_TO_PASS tests: what the verifier runs."""
        return sorted({t.split("::", 1)[0] for t in self.fail_to_pass + self.pass_to_pass})


def select_tests(before: list[set[str]], after: list[set[str]]) -> PairTests:
    """Split tests by their passes in each run of the old (`before`) and fixed (`after`) source."""
    if not before or not after:
        raise ValueError("select_tests needs at least one run of each tree")
    every_before, some_before = set.intersection(*before), set.union(*before)
    every_after, some_after = set.intersection(*after), set.union(*after)
    flaky = (some_before - every_before) | (some_after - every_after)
    f2p = sorted(t for t in every_after - some_before if is_test_path(t.split("::", 1)[0]))
    p2p = sorted(t for t in every_after & every_before if is_test_path(t.split("::", 1)[0]))
    selection = PairTests(f2p, p2p, sorted(flaky))
    if not f2p:
        selection.reject = "no FAIL_TO_PASS"
    return selection


def run_tree(
    root: Path,
    python: Path,
    spec: PackageSpec,
    files: list[str],
    *,
    runs: int,
    timeout_sec: float = RUN_TIMEOUT_SEC,
) -> list[PytestRun]:
    """`files` of the tree at `root`, `runs` times side by side (the package's pytest args and skips)."""
    args = list(spec.pytest_args)
    for skip in spec.skip_test_files:
        args += ["--ignore", skip]
    with ThreadPoolExecutor(max_workers=runs) as pool:
        return list(
            pool.map(
                lambda _: run_pytest(
                    root, python, src_root=spec.src_root, files=files, args=args, timeout_sec=timeout_sec
                ),
                range(runs),
            )
        )


def compare_trees(
    before_root: Path, after_root: Path, python: Path, spec: PackageSpec, files: list[str], *, runs: int = 2
) -> tuple[PairTests, list[PytestRun], list[PytestRun]]:
    """Run `files` on both trees and select the tests; the runs come back too (messages, timings)."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1 (got {runs})")
    after = run_tree(after_root, python, spec, files, runs=runs)
    # The old source may hang where the release fixed a hang: it gets 10x the fixed source's time.
    slowest = max(r.seconds for r in after)
    before = run_tree(
        before_root,
        python,
        spec,
        files,
        runs=runs,
        timeout_sec=min(RUN_TIMEOUT_SEC, max(BEFORE_TIMEOUT_FLOOR_SEC, 10 * slowest)),
    )
    for name, tree_runs in (("new source", after), ("old source", before)):
        if any(r.timed_out for r in tree_runs):
            return PairTests(reject=f"{name}: tests timed out"), before, after
        if any(r.exitstatus is None for r in tree_runs):
            return PairTests(reject=f"{name}: pytest left no report"), before, after
    return select_tests([r.passed() for r in before], [r.passed() for r in after]), before, after
