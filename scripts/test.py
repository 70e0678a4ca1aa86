#!/usr/bin/env python3
"""Run arl's tests in parts: lint, each package in an environment of its own, then the apps and cross-package tests.

The `lint` part comes first and takes seconds: `ruff check .` and `ruff format --check .` from the
repository root, with the ruff pinned in the workspace's dev group (`python -m ruff` in this script's
interpreter, the workspace's environment) and the settings of the root pyproject.toml.

A package's tests run in a virtual environment that holds only that package, its declared
dependencies and its `test` dependency group (`.venvs/<package>`, made by `uv sync --locked
--package <package> --group test`): an import the package does not declare fails there, as it would
for a user who installs the package alone. The apps' tests and the cross-package tests in tests/ run
in the workspace's environment (`.venv`, everything). Every part runs even when one fails; pytest's
`--durations` shows each part's slowest tests, and a summary gives every part's outcome and time, and
which tests were skipped and why (each part's JUnit XML, scripts/skip_report.py).

The project's Docker engine is made ready for the arl-harbor part where it can be (scripts/docker_setup.py:
the engine DOCKER_HOST names when it answers, else scripts/docker/ installs and starts the project's own,
stopped again once the parts that need it have ended if this run started it, and builds the SWE base
image); where it cannot be, the container tests skip and the summary says why. That runs in the
background from the start, beside the lint and the other parts (on a fresh machine it is an apt install
and a debootstrap, mostly waiting on the network and the disk); only the arl-harbor part waits for it,
and it does not hold a slot meanwhile: the slots run the other parts until the engine is ready.
`--no-docker` leaves Docker alone.

Parts run side by side, `--jobs` at a time (default 2, the CI machine's cores): the package parts in
that many processes, the longest first (each part's output printed whole when it ends), and the apps
part on that many pytest-xdist workers, whole test modules to a worker (`--dist loadscope`), so a
module's shared app run (a module-scoped fixture) still runs once. The apps part does not wait for the
last package part: it starts as soon as every package part has started and a slot is free, so the long
arl-harbor part runs beside it instead of alone while the other slots stand empty. The workers take
the modules in the order the root conftest.py sorts them (`--no-loadscope-reorder`: xdist would
otherwise hand out the modules with the most tests first and leave the long single-test app runs for
the end). Much of an app run's time is spent waiting on process starts, Ray and sandboxes (one alone
keeps the 2-core machine ~54% busy); two at a time fill it, and a third adds nothing
(docs/guide/testing.md).

    uv run scripts/test.py                     # everything (what CI runs)
    uv run scripts/test.py arl-proxy apps      # some parts
    uv run scripts/test.py lint                # ruff only
    uv run scripts/test.py --jobs 1            # one part and one test at a time
    uv run scripts/test.py -- -m "not slow"    # arguments after -- go to every pytest
    uv run scripts/test.py arl-harbor --no-docker
    uv run scripts/test.py --exhaustive        # also the repeats the default run skips (saying so)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

import docker_setup
from skip_report import Skip, format_skips, junit_args, read_skips

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["arl-queue", "arl-proxy", "arl-sync", "arl-rollout", "arl-trainer", "arl-harbor"]
# The package parts' usual seconds on the 2-core CI machine: side by side, the longest start first, so the
# last one to end is not a long part started late (a part not listed counts as the longest).
TYPICAL_SECONDS = {
    "arl-harbor": 400,
    "arl-rollout": 66,
    "arl-proxy": 53,
    "arl-trainer": 49,
    "arl-sync": 24,
    "arl-queue": 15,
}
APPS_PART = "apps"
LINT_PART = "lint"
# The lint part: these ruff commands, from the repository root, one line per finding (`uv run ruff
# format --diff .` shows the formatter's changes); pytest's arguments (after --) are not theirs.
LINT_COMMANDS = (
    ("check", "--output-format", "concise", "."),
    ("format", "--check", "--output-format", "concise", "."),
)
LINT_FIX = "to fix: uv run ruff format . && uv run ruff check --fix . (then what remains, by hand)"
APPS_PATHS = ["apps", "tests"]
# Enough to list every slow test of the apps part (~35), so the CI log prices each one (docs/guide/testing.md).
DURATIONS = 40
# A part's name, exit code, seconds and skipped tests (None for the lint part, which has none).
PartResult = tuple[str, int, float, "list[Skip] | None"]
# Set by --exhaustive: tests that repeat, at a cost, what the default run checks in a cheaper way run too.
EXHAUSTIVE_ENV = "ARL_TEST_EXHAUSTIVE"
# The parts with container tests (arl-harbor's docker environment): the Docker engine is made ready for them.
DOCKER_PARTS = ("arl-harbor",)


def _env() -> dict[str, str]:
    # PYTHONDONTWRITEBYTECODE (set on the CI machine) would make every process compile every module it
    # imports, every time: `import torch` 4.3 CPU-s instead of 1.6, `import vllm` 12.9 instead of 4.3, in
    # each of the suite's hundreds of processes (Ray workers, vLLM engine cores, gloo ranks). Without
    # it the first import writes the .pyc (into the test environments and the ignored __pycache__/).
    dropped = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.setdefault("UV_PYTHON_DOWNLOADS", "never")
    return env


def package_environment(package: str, env: dict[str, str]) -> Path:
    """`.venvs/<package>`: the package, its declared dependencies and its test group, at uv.lock's versions."""
    venv = REPO_ROOT / ".venvs" / package
    subprocess.run(
        ["uv", "sync", "--locked", "--package", package, "--group", "test", "--quiet"],
        cwd=REPO_ROOT,
        env=env | {"UV_PROJECT_ENVIRONMENT": str(venv)},
        check=True,
        timeout=1800,
    )
    return venv / "bin" / "python"


def run_part(
    python: Path | str,
    paths: list[str],
    pytest_args: list[str],
    env: dict[str, str],
    *,
    capture: bool = False,
) -> tuple[int, str]:
    """pytest on `paths` with `python`: (exit code, its output when `capture`, else "" and it streams)."""
    cmd = [str(python), "-m", "pytest", *paths, "-q", f"--durations={DURATIONS}", *pytest_args]
    header = "$ " + " ".join(cmd)
    if not capture:
        print(header, flush=True)
        return subprocess.run(cmd, cwd=REPO_ROOT, env=env, check=False).returncode, ""
    done = subprocess.run(
        cmd, cwd=REPO_ROOT, env=env, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return done.returncode, header + "\n" + done.stdout


def run_package(
    package: str, pytest_args: list[str], env: dict[str, str], *, capture: bool
) -> tuple[int, str]:
    """One package's part: its own environment, then its tests; (exit code, output when `capture`)."""
    try:
        python = package_environment(package, env)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        return 1, f"{package}: could not make its environment: {exc}"
    return run_part(python, [f"packages/{package}/tests"], pytest_args, env, capture=capture)


def run_lint(env: dict[str, str], root: Path = REPO_ROOT) -> tuple[int, str]:
    """The lint part: each of LINT_COMMANDS, all run even when one fails; (exit code, their output)."""
    rc, output = 0, []
    for args in LINT_COMMANDS:
        cmd = [sys.executable, "-m", "ruff", *args]
        done = subprocess.run(
            cmd, cwd=root, env=env, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        output += [f"$ ruff {' '.join(args)}", done.stdout.rstrip()]
        rc = rc or done.returncode
    if rc:
        output.append(LINT_FIX)
    return rc, "\n".join(output)


def run_parts(
    packages: list[str],
    jobs: int,
    package_part: Callable[[str], PartResult],
    apps_part: Callable[[], PartResult] | None,
    ready: Callable[[str], bool] = lambda _part: True,
) -> list[PartResult]:
    """The package parts, `jobs` at a time, and the apps part (when not None); their results in the
    given order. A free slot takes the first part in the given order that is `ready` (the arl-harbor part
    once the Docker engine is: until then the slots run the parts behind it instead of one waiting). With
    `jobs` > 1 the apps part starts as soon as every package part has started and a slot is free, beside
    those still running: the long one (arl-harbor) would otherwise run alone while the other slots stand
    empty. With `jobs` 1, one part at a time, in order, the apps part last."""
    pending = list(packages)
    futures: dict[str, Future[PartResult]] = {}
    running: set[Future[PartResult]] = set()

    def next_part() -> str | None:
        """The part a free slot takes now: the first ready one (with one slot, the next in order or none)."""
        return next((p for p in (pending[:1] if jobs == 1 else pending) if ready(p)), None)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        while pending:
            part = next_part() if len(running) < jobs else None
            if part is not None:
                pending.remove(part)
                futures[part] = pool.submit(package_part, part)
                running.add(futures[part])
            elif running:  # a slot frees, or a waiting part becomes ready: look again within a second
                _, running = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
            else:
                time.sleep(1.0)
        while running and (jobs == 1 or len(running) >= jobs):
            _, running = wait(running, return_when=FIRST_COMPLETED)
        apps = apps_part() if apps_part is not None else None
        results = [futures[p].result() for p in packages]
    return results + ([apps] if apps is not None else [])


def summary(
    results: list[tuple[str, int, float, list[Skip] | None]], wall_s: float, docker_note: str | None = None
) -> list[str]:
    """The summary's lines: every part's outcome, time and skips, the wall time, the Docker engine's
    state (when a part needed it), then each skip reason with its tests. The lint part has no skips
    (its `skips` is None)."""
    lines = []
    for part, rc, seconds, skips in results:
        outcome = "passed" if rc == 0 else ("no tests" if rc == 5 else f"FAILED (exit {rc})")
        skipped = "" if skips is None else f"   {len(skips)} skipped"
        lines.append(f"{part:12s} {outcome:18s} {seconds:7.0f} s{skipped}")
    lines.append(f"{'wall':12s} {'':18s} {wall_s:7.0f} s")
    if docker_note is not None:
        lines.append(f"{'docker':12s} {docker_note}")
    skips_by_part = {
        part: skips for part, _, _, skips in results if part != LINT_PART and (skips is None or skips)
    }
    if skips_by_part:
        lines += ["", "skipped, and why:", *format_skips(skips_by_part)]
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pytest_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "parts",
        nargs="*",
        default=[LINT_PART, *PACKAGES, APPS_PART],
        help=f"any of {LINT_PART}, {', '.join(PACKAGES)}, {APPS_PART} (default: all)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="package parts at a time, and pytest-xdist workers of the apps part (default 2)",
    )
    parser.add_argument(
        "--exhaustive",
        action="store_true",
        help="also the repeats the default run leaves out, each skipped there saying so "
        f"(sets {EXHAUSTIVE_ENV}=1; docs/guide/testing.md)",
    )
    parser.add_argument(
        "--no-docker",
        action="store_true",
        help="leave Docker alone (default: make the project's engine ready for the container tests)",
    )
    args = parser.parse_args(argv)
    unknown = [p for p in args.parts if p not in (LINT_PART, *PACKAGES, APPS_PART)]
    if unknown:
        parser.error(f"unknown part(s) {unknown}: choose from {[LINT_PART, *PACKAGES, APPS_PART]}")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    began = time.monotonic()
    env = _env() | ({EXHAUSTIVE_ENV: "1"} if args.exhaustive else {})
    results: list[tuple[str, int, float, list[Skip] | None]] = []

    def prepare_docker() -> docker_setup.DockerEngine:
        docker = docker_setup.prepare(env)
        print(f"docker: {docker.note}", flush=True)
        return docker

    # The Docker engine, made ready in the background; the parts that need it wait for it (`docker_env`).
    background = ThreadPoolExecutor(max_workers=1)
    docker_future = (
        background.submit(prepare_docker)
        if not args.no_docker and any(p in DOCKER_PARTS for p in args.parts)
        else None
    )
    if LINT_PART in args.parts:
        started = time.monotonic()
        rc, output = run_lint(env)
        print(f"\n=== {LINT_PART} ===\n{output}", flush=True)
        results.append((LINT_PART, rc, time.monotonic() - started, None))
    print_lock = threading.Lock()

    def docker_env() -> dict[str, str]:
        """`env` with the engine's DOCKER_HOST, once the engine is ready (or known not to be)."""
        if docker_future is None:
            return env
        docker = docker_future.result()
        return env | {"DOCKER_HOST": docker.host} if docker.host else env

    reports = Path(tempfile.mkdtemp(prefix="arl-test-"))  # each part's JUnit XML: its skips and their reasons
    # The engine is stopped (where this run started it) as soon as the last part that needs it ends, not
    # after the parts still running beside it.
    docker_parts_left = {p for p in args.parts if p in DOCKER_PARTS}
    docker_lock = threading.Lock()

    def stop_docker_when_unneeded(ended: str | None = None) -> None:
        """`ended` has ended (None: the whole run): stop the engine once no part left needs it (once)."""
        with docker_lock:
            needed_before = bool(docker_parts_left)
            if ended is None:
                docker_parts_left.clear()
            else:
                docker_parts_left.discard(ended)
            if docker_future is not None and needed_before and not docker_parts_left:
                docker_setup.stop(docker_future.result(), env)

    def package_part(package: str) -> PartResult:
        started = time.monotonic()
        if args.jobs == 1:
            print(f"\n=== {package} ===", flush=True)
        junit = reports / f"{package}.xml"
        part_env = docker_env() if package in DOCKER_PARTS else env
        rc, output = run_package(package, [*junit_args(junit), *pytest_args], part_env, capture=args.jobs > 1)
        seconds = time.monotonic() - started
        if package in DOCKER_PARTS:
            stop_docker_when_unneeded(package)
        if output:
            with print_lock:
                print(f"\n=== {package} ({seconds:.0f} s) ===\n{output}", flush=True)
        return package, rc, seconds, read_skips(junit)

    def apps_part() -> PartResult:
        started = time.monotonic()
        with print_lock:
            print(f"\n=== {APPS_PART} ===", flush=True)
        # Whole modules to a worker, in the order the root conftest.py sorts them (xdist's default would
        # hand out the modules with the most tests first: the long single-test app runs last).
        workers = (
            ["-n", str(args.jobs), "--dist", "loadscope", "--no-loadscope-reorder"] if args.jobs > 1 else []
        )
        junit = reports / f"{APPS_PART}.xml"
        rc, _ = run_part(sys.executable, APPS_PATHS, [*workers, *junit_args(junit), *pytest_args], env)
        return APPS_PART, rc, time.monotonic() - started, read_skips(junit)

    try:
        packages = sorted(
            (p for p in args.parts if p in PACKAGES), key=lambda p: -TYPICAL_SECONDS.get(p, 1e9)
        )
        results += run_parts(
            packages,
            args.jobs,
            package_part,
            apps_part if APPS_PART in args.parts else None,
            # A part that needs the engine takes a slot once the engine is ready (or known not to be).
            ready=lambda p: p not in DOCKER_PARTS or docker_future is None or docker_future.done(),
        )
    finally:
        shutil.rmtree(reports, ignore_errors=True)
        docker = docker_future.result() if docker_future is not None else None
        background.shutdown()
        stop_docker_when_unneeded()
    print("\n=== summary ===")
    print("\n".join(summary(results, time.monotonic() - began, docker.note if docker else None)))
    return 0 if all(rc in (0, 5) for _, rc, _, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
