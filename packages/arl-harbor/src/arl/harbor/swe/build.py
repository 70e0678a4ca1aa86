"""Build a SWE task set: per package, fetch, baseline, then try mutations until enough bugs are kept.

Candidates are (module, function, operator) triples in an order shuffled by the seed; they are
evaluated `jobs` at a time (each worker owns a copy of the pristine source) and accepted strictly in
that order, at most one task per function, so the same seed gives the same set whatever `jobs` is.
A package that cannot give tasks (no sdist, test deps that do not install, a suite that collects no tests,
does not collect, is slower than `max_suite_s` or passes nothing) is refused with the reason measured:
`build` lists it in the summary and goes on with the next package.
"""

from __future__ import annotations

import json
import queue
import random
import shutil
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from arl.harbor.errors import PackageRefusedError
from arl.harbor.swe import mutate, sources, venvs
from arl.harbor.swe.issue import task_paths, write_issue
from arl.harbor.swe.packages import PackageSpec
from arl.harbor.swe.runner import run_pytest
from arl.harbor.swe.validate import Baseline, classify, mapped_test_files, probe_suite, source_modules
from arl.harbor.swe.writer import TaskRecord, write_task

RUN_TIMEOUT_FLOOR_SEC = 30.0
MAX_SUITE_SECONDS = (
    60.0  # a package's whole suite, run once alone, must finish within this (--max-suite-seconds)
)


@dataclass
class PackageStats:
    """What building one package's tasks took and gave."""

    package: str
    version: str
    candidates: int = 0  # mutations that applied and were run
    considered: int = 0  # triples looked at (incl. operators that did not apply)
    kept: int = 0
    rejects: Counter = field(default_factory=Counter)
    operators: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    test_files: int = 0
    tests: int = 0  # tests the whole-suite probe ran
    suite_s: float = 0.0  # the whole-suite probe's wall time (alone)
    flaky_tests: list[str] = field(
        default_factory=list
    )  # pristine tests that did not pass in every baseline run


@dataclass
class _Candidate:
    index: int
    module: str
    function: str
    operator: str
    buggy: str
    test_files: list[str]


def _task_id(spec: PackageSpec, cand: _Candidate) -> str:
    module = (
        cand.module if spec.src_root == "." else cand.module.removeprefix(spec.src_root.rstrip("/") + "/")
    )
    stem = module.removesuffix(".py").replace("/", ".").replace("__init__", "init")
    func = cand.function.replace(".<locals>.", ".")
    short = cand.operator.removeprefix("func_pm_")
    raw = f"{spec.name}__{stem}.{func}__{short}".lower()
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in raw)


def _prepare(
    spec: PackageSpec, cache: Path, python: str, source_root: Path | None, venv: Path | None
) -> tuple[Path, Path, Path]:
    """The package's source tree, test venv and wheelhouse; a failure is the package's refusal."""
    try:
        root = source_root or sources.fetch(spec, cache, python=python)
    except sources.SourceError as e:
        raise PackageRefusedError(spec.key, "no_sdist", str(e)) from None
    if not (root / spec.src_root).is_dir():
        tops = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        raise PackageRefusedError(
            spec.key,
            "bad_src_root",
            f"src_root {spec.src_root!r} is not a folder of the sdist (its folders: {tops})",
        )
    if not source_modules(root, spec):
        raise PackageRefusedError(
            spec.key, "no_source", f"no Python module outside the tests under src_root {spec.src_root!r}"
        )
    try:
        venv = venv or venvs.ensure_venv(spec, cache, python=python)
        wheelhouse = venvs.package_wheelhouse(spec, cache, python=python)
    except venvs.VenvError as e:
        raise PackageRefusedError(spec.key, "test_deps", str(e)) from None
    return root, venv, wheelhouse


def build_package(
    spec: PackageSpec,
    out: Path,
    cache: Path,
    *,
    max_tasks: int,
    max_candidates: int,
    jobs: int,
    seed: int,
    python: str,
    baseline_runs: int = 3,
    max_suite_s: float = MAX_SUITE_SECONDS,
    log=print,
    source_root: Path | None = None,
    venv: Path | None = None,
) -> tuple[list[TaskRecord], PackageStats]:
    """Build up to `max_tasks` tasks of `spec` into `out`; returns their records and the stats.

    Raises `PackageRefusedError` (before any task is written) when the package cannot give tasks: see the
    module docstring. `source_root` / `venv` replace the fetched sdist / the prepared venv (a local
    package, e.g. in tests; the set then links to that venv instead of copying it).
    """
    start = time.monotonic()
    stats = PackageStats(spec.name, spec.version)
    own_venv = venv is None
    root, venv, wheelhouse = _prepare(spec, cache, python, source_root, venv)
    py = venv / "bin" / "python"
    probe = probe_suite(root, py, spec, limit_s=max_suite_s)
    stats.tests, stats.suite_s = probe.tests, probe.seconds
    log(f"[{spec.key}] the whole suite: {probe.passed} of {probe.tests} tests pass in {probe.seconds:.1f} s")
    baseline = Baseline(root, py, spec, runs=baseline_runs)
    test_files = baseline.discover()
    stats.test_files = len(test_files)
    log(
        f"[{spec.key}] {len(test_files)} test files pass at baseline ({baseline_runs} runs side by side; "
        f"{len(baseline.flaky)} flaky tests left out)"
    )

    triples = []
    module_tests: dict[str, list[str]] = {}
    for module in source_modules(root, spec):
        text = (root / module).read_text()
        try:
            entities = mutate.function_entities(text)
        except SyntaxError:
            continue
        module_tests[module] = mapped_test_files(module, spec, root, test_files)
        triples += [(module, e.qualname, op) for e in entities for op in mutate.OPERATORS]
    random.Random(mutate.seed_for(seed, spec.key)).shuffle(triples)

    workers: queue.Queue[Path] = queue.Queue()
    work_root = cache / "work" / spec.key
    shutil.rmtree(work_root, ignore_errors=True)
    for i in range(jobs):
        dest = work_root / f"w{i}"
        shutil.copytree(root, dest, ignore=shutil.ignore_patterns("__pycache__"))
        workers.put(dest)

    def evaluate(cand: _Candidate):
        base_passed, base_s = baseline.passed(cand.test_files)
        worker = workers.get()
        path = worker / cand.module
        original = path.read_text()
        try:
            path.write_text(cand.buggy)
            run = run_pytest(
                worker,
                py,
                src_root=spec.src_root,
                files=cand.test_files,
                args=spec.pytest_args,
                timeout_sec=max(RUN_TIMEOUT_FLOOR_SEC, 10 * base_s),
            )
        finally:
            path.write_text(original)
            workers.put(worker)
        # The issue text shows the task's own paths, never the builder's cache or venv.
        run.messages = {k: task_paths(v, testbed=worker, venv=venv) for k, v in run.messages.items()}
        return classify(base_passed, run), run

    records: list[TaskRecord] = []
    used_functions: set[tuple[str, str]] = set()
    venv_in_set = venvs.copy_venv(venv, out / "_venvs" / spec.name, link=not own_venv)
    pos = 0
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        while len(records) < max_tasks and pos < len(triples) and stats.considered < max_candidates:
            batch: list[_Candidate] = []
            while len(batch) < 2 * jobs and pos < len(triples) and stats.considered < max_candidates:
                module, function, op = triples[pos]
                pos += 1
                if (module, function) in used_functions:
                    continue
                stats.considered += 1
                buggy = mutate.mutate_file(
                    root / module, function, op, seed=mutate.seed_for(seed, spec.key, module, function, op)
                )
                if buggy is None:
                    stats.rejects["operator does not apply"] += 1
                    continue
                batch.append(_Candidate(pos, module, function, op, buggy, module_tests[module]))
            for cand, (cls, run) in zip(batch, pool.map(evaluate, batch)):
                stats.candidates += 1
                if len(records) >= max_tasks or (cand.module, cand.function) in used_functions:
                    continue
                if not cls.kept:
                    stats.rejects[cls.reject] += 1
                    continue
                used_functions.add((cand.module, cand.function))
                f2p_files = {t.split("::", 1)[0] for t in cls.fail_to_pass}
                files = [
                    f
                    for f in cand.test_files
                    if f in f2p_files or any(t.startswith(f + "::") for t in cls.pass_to_pass)
                ]
                record = TaskRecord(
                    id=_task_id(spec, cand),
                    package=spec.name,
                    version=spec.version,
                    module=cand.module,
                    function=cand.function,
                    operator=cand.operator,
                    fail_to_pass=cls.fail_to_pass,
                    pass_to_pass=cls.pass_to_pass,
                    validate_s=round(run.seconds, 3),
                    test_files=files,
                    seed=seed,
                )
                instruction = write_issue(
                    spec.name, spec.version, cls.fail_to_pass, run.messages, len(cls.pass_to_pass)
                )
                write_task(
                    out / record.id,
                    record=record,
                    spec=spec,
                    pristine_root=root,
                    buggy_text=cand.buggy,
                    instruction=instruction,
                    wheelhouse=wheelhouse,
                    venv_dir=venv_in_set,
                )
                records.append(record)
                stats.operators[cand.operator] += 1
                log(
                    f"[{spec.key}] kept {record.id}: {len(cls.fail_to_pass)} F2P, {len(cls.pass_to_pass)} P2P "
                    f"({len(records)}/{max_tasks}, {stats.candidates} run)"
                )
    shutil.rmtree(work_root, ignore_errors=True)
    stats.flaky_tests = sorted(baseline.flaky)
    stats.kept = len(records)
    stats.seconds = round(time.monotonic() - start, 1)
    return records, stats


def build(
    specs: list[PackageSpec],
    out: Path,
    cache: Path,
    *,
    max_per_package: int,
    max_candidates: int,
    jobs: int,
    seed: int,
    python: str,
    baseline_runs: int = 3,
    max_suite_s: float = MAX_SUITE_SECONDS,
    command: str = "",
    log=print,
) -> dict:
    """Build every package's tasks into `out`, write manifest.jsonl and build.json; returns the summary.

    A refused package is logged and listed (`refused`, with its kind and reason) and the build goes on.
    """
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    all_records: list[TaskRecord] = []
    per_package = []
    refused = []
    for spec in specs:
        package_start = time.monotonic()
        try:
            records, stats = build_package(
                spec,
                out,
                cache,
                max_tasks=max_per_package,
                max_candidates=max_candidates,
                jobs=jobs,
                seed=seed,
                python=python,
                baseline_runs=baseline_runs,
                max_suite_s=max_suite_s,
                log=log,
            )
        except PackageRefusedError as e:
            log(f"[{spec.key}] refused ({e.kind}): {e.reason}")
            refused.append(
                {
                    "package": spec.name,
                    "version": spec.version,
                    "kind": e.kind,
                    "reason": e.reason,
                    "seconds": round(time.monotonic() - package_start, 1),
                }
            )
            continue
        all_records += records
        per_package.append(
            {
                "package": spec.name,
                "version": spec.version,
                "tests": stats.tests,
                "suite_s": stats.suite_s,
                "test_files": stats.test_files,
                "considered": stats.considered,
                "candidates_run": stats.candidates,
                "kept": stats.kept,
                "seconds": stats.seconds,
                "rejects": dict(stats.rejects),
                "operators": dict(stats.operators),
                "flaky_tests": stats.flaky_tests,
            }
        )
    # Merge with tasks already in the manifest from other packages (building one package at a time).
    manifest = out / "manifest.jsonl"
    rows = {}
    if manifest.is_file():
        for line in manifest.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["id"]] = row
    built = {s.name for s in specs}
    rows = {k: v for k, v in rows.items() if v["package"] not in built}
    rows.update({r.id: r.to_json() for r in all_records})
    manifest.write_text("".join(json.dumps(rows[k]) + "\n" for k in sorted(rows)))
    operators = Counter(r["operator"] for r in rows.values())
    summary = {
        "command": command,
        "seed": seed,
        "jobs": jobs,
        "baseline_runs": baseline_runs,
        "python": python,
        "pytest": venvs.PYTEST_REQUIREMENT,
        "seconds": round(time.monotonic() - start, 1),
        "max_suite_s": max_suite_s,
        "tasks_in_set": len(rows),
        "tasks_built_now": len(all_records),
        "packages": per_package,
        "refused": refused,
        "operators_in_set": dict(sorted(operators.items())),
    }
    (out / "build.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
