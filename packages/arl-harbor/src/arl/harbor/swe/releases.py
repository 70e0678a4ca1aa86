"""Build SWE tasks from real fixes: consecutive releases of a package on PyPI (SWE-bench's recipe).

Per (old, new) pair of final releases with sdists (the old one shipping tests): split the change into
source, test and other files (`release_diff`); keep a pair whose source change is reviewable (at most
`max_files` files and `max_lines` changed lines) and that changes a test module; run the changed test
modules on the old source with the new tests and on the old source with the new tests and the source
change (`release_tests`, the venv from the new release's test deps); FAIL_TO_PASS = failing before,
passing after. A kept pair is written with the synthetic builder's writer, so it is graded the same way:
the old sdist is the testbed, the source change the oracle (`solution/fix.patch`), the test change
`tests/test.patch` (applied by the verifier only), the changelog entry (or the failures) the instruction
(`release_notes`). Then the same host checks as `verify` run on it (oracle 1.0, untouched 0.0, edited
tests not 1.0), and a task that fails one is removed. Pairs run one at a time; `<out>/releases.json`
holds the per-package figures.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from arl.harbor.swe import grading, venvs
from arl.harbor.swe.issue import task_paths
from arl.harbor.swe.packages import BY_NAME, PackageSpec
from arl.harbor.swe.release_diff import ReleaseDiff, apply_changes, diff_trees, tree_files
from arl.harbor.swe.release_index import Release, consecutive_pairs, fetch_release, list_releases
from arl.harbor.swe.release_notes import find_entry, write_release_issue
from arl.harbor.swe.release_tests import compare_trees
from arl.harbor.swe.runner import own_config
from arl.harbor.swe.validate import is_test_path
from arl.harbor.swe.verify import verify_task
from arl.harbor.swe.writer import TaskRecord, write_task

# pytest's own dependencies: the tests import the testbed through PYTHONPATH, so pytest would run with the
# package under test (and the agent's change to it) as part of the runner. Refused.
RUNNER_PACKAGES = frozenset(
    {"pytest", "pluggy", "iniconfig", "packaging", "pygments", "colorama", "exceptiongroup", "tomli"}
)
MAX_SOURCE_FILES = 6
MAX_SOURCE_LINES = 300
OPERATOR = "release"  # the `operator` of a release task in its manifest row and task.toml


@dataclass
class ReleaseStats:
    """What one package's release pairs gave."""

    package: str
    pairs_tried: int = 0
    source_and_tests: int = 0  # pairs changing both the source and a test module
    reviewable: int = 0  # ... within the size caps
    with_fail_to_pass: int = 0
    kept: int = 0  # ... passing the checks
    seconds: float = 0.0
    rejects: Counter = field(default_factory=Counter)
    tasks: list[str] = field(default_factory=list)
    issue_sources: Counter = field(default_factory=Counter)  # "changelog" / "tests"

    def to_json(self) -> dict:
        return {**self.__dict__, "rejects": dict(self.rejects), "issue_sources": dict(self.issue_sources)}


def detect_src_root(tree: Path) -> str:
    """ "src" for an src-layout sdist (a package or module under src/), else "."."""
    src = tree / "src"
    if src.is_dir() and (any(src.glob("*/__init__.py")) or any(src.glob("*.py"))):
        return "src"
    return "."


def package_spec(
    name: str, version: str, tree: Path, *, test_deps: tuple[str, ...] | None = None
) -> PackageSpec:
    """The spec of `name` at `version`: the pinned one's test settings when the package is pinned
    (test deps, pytest args, skipped files), the source root as this release's sdist lays it out;
    `test_deps` replace the test deps. An unpinned package whose pytest addopts need pytest-cov runs
    without its addopts."""
    base = BY_NAME.get(name) or PackageSpec(name, version)
    spec = replace(base, version=version, src_root=detect_src_root(tree))
    config = own_config(tree)
    if name not in BY_NAME and config is not None and "--cov" in config.read_text(errors="replace"):
        # Its addopts ask for pytest-cov, which the task image does not have (as parse's pinned spec drops).
        spec = replace(spec, pytest_args=("-o", "addopts="))
    return spec if test_deps is None else replace(spec, test_deps=test_deps)


def task_id(name: str, old: str, new: str) -> str:
    raw = f"{name}__{old}_to_{new}".lower()
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in raw)


def _tree_copy(src: Path, dest: Path) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _finish_task(task_dir: Path, diff: ReleaseDiff, new: str, issue_source: str) -> None:
    """What makes a written task a release task: the source change as the oracle, the new tests as
    tests/test.patch, the reach patterns the change needs, the new version in the metadata."""
    (task_dir / "solution" / "fix.patch").write_text(diff.source_patch())
    (task_dir / "tests" / "test.patch").write_text(diff.test_patch())
    config_path = task_dir / "tests" / "config.json"
    config = json.loads(config_path.read_text())
    needed: set[str] = set()
    for change in diff.source:
        needed |= grading.needed_reach_patterns(change.new or "", change.old or "")
    reach = grading.reach_patterns_without(needed)
    config.pop("reach_patterns", None)
    if reach is not None:
        config["reach_patterns"] = reach
    config.update(
        new_version=new,
        issue_source=issue_source,
        source_files=[c.path for c in diff.source],
        test_patch_files=[c.path for c in diff.tests],
        binary_left_out=diff.binary,
    )
    config_path.write_text(json.dumps(config, indent=1) + "\n")
    toml = task_dir / "task.toml"
    toml.write_text(
        toml.read_text().replace(
            'category = "swe"\n', f'new_version = {json.dumps(new)}\ncategory = "swe"\n', 1
        )
    )


def build_pair(
    old: Release,
    new: Release,
    out: Path,
    cache: Path,
    stats: ReleaseStats,
    *,
    python: str,
    runs: int,
    max_files: int,
    max_lines: int,
    test_deps: tuple[str, ...] | None = None,
    check: bool = True,
    log=print,
) -> dict | None:
    """Try one release pair: its manifest row when a task was kept (the reason counted in `stats` if not)."""
    key = f"{old.name} {old.version} -> {new.version}"
    stats.pairs_tried += 1
    shutil.rmtree(out / task_id(old.name, old.version, new.version), ignore_errors=True)  # an earlier build's

    def reject(reason: str) -> None:
        stats.rejects[reason] += 1
        log(f"[{key}] dropped: {reason}")

    old_root, new_root = fetch_release(old, cache), fetch_release(new, cache)
    spec = package_spec(old.name, old.version, old_root, test_deps=test_deps)
    new_spec = package_spec(new.name, new.version, new_root, test_deps=test_deps)
    if spec.src_root != new_spec.src_root:
        return reject(f"layout changed ({spec.src_root} -> {new_spec.src_root})")
    if not any(is_test_path(p) and PurePosixPath(p).name != "conftest.py" for p in tree_files(old_root)):
        # Its tests would be all new: FAIL_TO_PASS would be every test, whatever the release fixed.
        return reject("the old sdist ships no tests")
    diff = diff_trees(old_root, new_root, spec)
    if diff.source and diff.test_modules():
        stats.source_and_tests += 1
    why = diff.unreviewable(max_files=max_files, max_lines=max_lines)
    if why:
        return reject(why)
    if all(c.old is None for c in diff.source):
        return reject("the source change only adds files")
    stats.reviewable += 1

    files = [f for f in diff.test_modules() if f not in spec.skip_test_files]
    if not files:
        return reject("only skipped test modules changed")
    work = cache / "work" / "releases" / task_id(old.name, old.version, new.version)
    try:
        before = _tree_copy(old_root, work / "before")
        apply_changes(before, diff.tests)
        after = _tree_copy(before, work / "after")
        apply_changes(after, diff.source)
        venv = venvs.ensure_venv(new_spec, cache, python=python)
        python_bin = venv / "bin" / "python"
        selection, before_runs, after_runs = compare_trees(before, after, python_bin, spec, files, runs=runs)
        # The failures as the task will show them: /testbed and the image's interpreter, not the builder's.
        messages = {t: task_paths(m, testbed=before, venv=venv) for t, m in before_runs[0].messages.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if selection.reject:
        return reject(selection.reject)
    stats.with_fail_to_pass += 1

    entry = find_entry(new_root, new.version)
    test_files = selection.test_files()
    instruction = write_release_issue(
        old.name,
        old.version,
        new.version,
        selection.fail_to_pass,
        entry=entry,
        messages=messages,
        pass_to_pass_count=len(selection.pass_to_pass),
        test_files=test_files,
    )
    # The manifest's `module`: the changed file of the old tree with the most changed lines.
    main = max((c for c in diff.source if c.old is not None), key=lambda c: c.changed_lines).path
    record = TaskRecord(
        id=task_id(old.name, old.version, new.version),
        package=old.name,
        version=old.version,
        module=main,
        function="",
        operator=OPERATOR,
        fail_to_pass=selection.fail_to_pass,
        pass_to_pass=selection.pass_to_pass,
        validate_s=round(max(r.seconds for r in after_runs), 3),
        test_files=test_files,
    )
    venv_in_set = venvs.copy_venv(venv, out / "_venvs" / old.name)
    task_dir = out / record.id
    write_task(
        task_dir,
        record=record,
        spec=spec,
        pristine_root=old_root,
        buggy_text=(old_root / main).read_bytes().decode("utf-8"),  # its line endings as released
        instruction=instruction,
        wheelhouse=venvs.package_wheelhouse(new_spec, cache, python=python),
        venv_dir=venv_in_set,
    )
    issue_source = "changelog" if entry else "tests"
    _finish_task(task_dir, diff, new.version, issue_source)
    if check:
        result = verify_task(task_dir, out)
        if not result.ok:
            shutil.rmtree(task_dir)
            return reject("checks failed: " + "; ".join(result.problems)[:300])
    stats.kept += 1
    stats.tasks.append(record.id)
    stats.issue_sources[issue_source] += 1
    log(
        f"[{key}] kept {record.id}: {len(selection.fail_to_pass)} F2P, {len(selection.pass_to_pass)} P2P, "
        f"{len(diff.source)} source files / {diff.source_lines} lines, issue from {issue_source}"
    )
    return {
        **record.to_json(),
        "new_version": new.version,
        "issue_source": issue_source,
        "source_files": len(diff.source),
        "source_lines": diff.source_lines,
    }


def build_releases(
    packages: list[str],
    out: Path,
    cache: Path,
    *,
    pairs: int = 3,
    versions: list[str] | None = None,
    python: str = venvs.DEBIAN_PYTHON,
    runs: int = 2,
    max_files: int = MAX_SOURCE_FILES,
    max_lines: int = MAX_SOURCE_LINES,
    test_deps: tuple[str, ...] | None = None,
    check: bool = True,
    command: str = "",
    log=print,
) -> dict:
    """Tasks from the last `pairs` consecutive release pairs of each package (or from the pairs between
    `versions`, one package only) into `out`; writes manifest.jsonl and releases.json (both keep the other
    packages' rows of earlier builds), returns this build's summary. `test_deps` replace every package's."""
    if not packages:
        raise ValueError("no package named")
    if versions and len(packages) != 1:
        raise ValueError(
            f"versions name the releases of one package, but {len(packages)} packages were named"
        )
    if versions and len(versions) < 2:
        raise ValueError(f"versions need at least two releases to make a pair (got {versions})")
    for name in packages:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise ValueError(f"{name!r} is not a PyPI package name")
        if name.lower() in RUNNER_PACKAGES:
            raise ValueError(
                f"{name} is one of pytest's own dependencies: its tests would run with the "
                "package under test inside the runner"
            )
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    per_package = []
    for name in packages:
        stats = ReleaseStats(name)
        t0 = time.monotonic()
        releases = list_releases(name, cache)
        for old, new in consecutive_pairs(releases, pairs=pairs, versions=versions):
            try:
                row = build_pair(
                    old,
                    new,
                    out,
                    cache,
                    stats,
                    python=python,
                    runs=runs,
                    max_files=max_files,
                    max_lines=max_lines,
                    test_deps=test_deps,
                    check=check,
                    log=log,
                )
            except (OSError, RuntimeError, ValueError) as e:  # a broken sdist or venv: this pair only
                stats.rejects[f"error: {type(e).__name__}"] += 1
                log(f"[{name} {old.version} -> {new.version}] error: {e}")
                continue
            if row:
                rows.append(row)
        stats.seconds = round(time.monotonic() - t0, 1)
        per_package.append(stats.to_json())
    _merge_manifest(out / "manifest.jsonl", rows, set(packages))
    summary = {
        "command": command,
        "python": python,
        "pytest": venvs.PYTEST_REQUIREMENT,
        "runs": runs,
        "max_source_files": max_files,
        "max_source_lines": max_lines,
        "seconds": round(time.monotonic() - start, 1),
        "tasks_built_now": len(rows),
        "packages": per_package,
    }
    summary_path = out / "releases.json"
    earlier = json.loads(summary_path.read_text()).get("packages", []) if summary_path.is_file() else []
    merged = [p for p in earlier if p["package"] not in set(packages)] + per_package
    summary_path.write_text(json.dumps({**summary, "packages": merged}, indent=1) + "\n")
    return summary


def _merge_manifest(manifest: Path, rows: list[dict], packages: set[str]) -> None:
    """Replace the release tasks of `packages` in the set's manifest with `rows` (others kept)."""
    kept = {}
    if manifest.is_file():
        for line in manifest.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if not (row.get("operator") == OPERATOR and row.get("package") in packages):
                    kept[row["id"]] = row
    kept.update({r["id"]: r for r in rows})
    manifest.write_text("".join(json.dumps(kept[k]) + "\n" for k in sorted(kept)))
