#!/usr/bin/env python3
"""Run arl's tests in parts: each package in an environment of its own, then the apps and cross-package tests.

A package's tests run in a virtual environment that holds only that package, its declared
dependencies and its `test` dependency group (`.venvs/<package>`, made by `uv sync --locked
--package <package> --group test`): an import the package does not declare fails there, as it would
for a user who installs the package alone. The apps' tests and the cross-package tests in tests/ run
in the workspace's environment (`.venv`, everything). Every part runs even when one fails; pytest's
`--durations` shows each part's slowest tests, and a summary gives every part's outcome and time.

    uv run scripts/test.py                     # everything (what CI runs)
    uv run scripts/test.py arl-proxy apps      # some parts
    uv run scripts/test.py -- -m "not slow"    # arguments after -- go to every pytest
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["arl-queue", "arl-proxy", "arl-sync", "arl-rollout", "arl-trainer", "arl-harbor"]
APPS_PART = "apps"
APPS_PATHS = ["apps", "tests"]
# Enough to list every slow test of the apps part (~35), so the CI log prices each one (docs/guide/testing.md).
DURATIONS = 40


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.setdefault("UV_PYTHON_DOWNLOADS", "never")
    return env


def package_environment(package: str, env: dict[str, str]) -> Path:
    """`.venvs/<package>`: the package, its declared dependencies and its test group, at uv.lock's versions."""
    venv = REPO_ROOT / ".venvs" / package
    subprocess.run(["uv", "sync", "--locked", "--package", package, "--group", "test", "--quiet"],
                   cwd=REPO_ROOT, env=env | {"UV_PROJECT_ENVIRONMENT": str(venv)}, check=True, timeout=1800)
    return venv / "bin" / "python"


def run_part(python: Path | str, paths: list[str], pytest_args: list[str], env: dict[str, str]) -> int:
    cmd = [str(python), "-m", "pytest", *paths, "-q", f"--durations={DURATIONS}", *pytest_args]
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=REPO_ROOT, env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pytest_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", default=[*PACKAGES, APPS_PART],
                        help=f"any of {', '.join(PACKAGES)}, {APPS_PART} (default: all, in this order)")
    args = parser.parse_args(argv)
    unknown = [p for p in args.parts if p not in (*PACKAGES, APPS_PART)]
    if unknown:
        parser.error(f"unknown part(s) {unknown}: choose from {PACKAGES + [APPS_PART]}")
    env = _env()
    results: list[tuple[str, int, float]] = []
    for part in args.parts:
        started = time.monotonic()
        print(f"\n=== {part} ===", flush=True)
        try:
            if part == APPS_PART:
                rc = run_part(sys.executable, APPS_PATHS, pytest_args, env)
            else:
                rc = run_part(package_environment(part, env), [f"packages/{part}/tests"], pytest_args, env)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            print(f"{part}: could not make its environment: {exc}", file=sys.stderr)
            rc = 1
        results.append((part, rc, time.monotonic() - started))
    print("\n=== summary ===")
    for part, rc, seconds in results:
        outcome = "passed" if rc == 0 else ("no tests" if rc == 5 else f"FAILED (exit {rc})")
        print(f"{part:12s} {outcome:18s} {seconds:7.0f} s")
    print(f"{'total':12s} {'':18s} {sum(s for _, _, s in results):7.0f} s")
    return 0 if all(rc in (0, 5) for _, rc, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
