#!/usr/bin/env python3
"""Check that arl's light packages (arl-queue, arl-proxy) install and import without torch, vllm or ray.

Builds each package's wheel alone (`uv build --package NAME --wheel`), creates a fresh virtual
environment outside the workspace, installs the wheels there (their dependencies come from PyPI),
then imports every module of `arl.queue` and `arl.proxy` in that environment and fails if any of
`torch`, `vllm`, `ray` ends up in `sys.modules` (or is installed at all), if an import fails, or if a
wheel ships `arl/__init__.py` (arl is a PEP 420 namespace).

Usage: python scripts/check_light_packages.py [--keep] [--python PY] [--workdir DIR]
Exit status 0 when every check passes, 1 otherwise (the reasons are printed). Needs `uv` and PyPI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"arl-queue": "arl.queue", "arl-proxy": "arl.proxy"}
FORBIDDEN = ("torch", "vllm", "ray")
STEP_TIMEOUT_S = 600

# Runs inside the fresh environment: imports each package and all its submodules, reports as JSON.
_PROBE = r"""
import importlib, importlib.util, json, pkgutil, sys, traceback

forbidden = sys.argv[1].split(",")
report = {"imported": [], "errors": {}, "forbidden_after": {}, "installed": []}
report["installed"] = [m for m in forbidden if importlib.util.find_spec(m) is not None]
for package in sys.argv[2:]:
    try:
        mod = importlib.import_module(package)
        names = [package] + sorted(
            info.name for info in pkgutil.walk_packages(mod.__path__, prefix=package + ".")
        )
    except Exception:
        report["errors"][package] = traceback.format_exc()
        continue
    for name in names:
        try:
            importlib.import_module(name)
            report["imported"].append(name)
        except Exception:
            report["errors"][name] = traceback.format_exc()
        pulled = [m for m in forbidden if m in sys.modules]
        if pulled and not report["forbidden_after"]:
            report["forbidden_after"] = {"module": name, "pulled": pulled}
report["loaded"] = [m for m in forbidden if m in sys.modules]
print(json.dumps(report))
"""


class CheckFailed(Exception):
    """A step of the check failed; the message says which and why."""


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None, label: str | None = None) -> str:
    """Run `cmd`, returning stdout; raise CheckFailed with its output when it fails or times out."""
    print("$ " + (label or " ".join(cmd)), flush=True)
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise CheckFailed(f"timed out after {STEP_TIMEOUT_S}s: {' '.join(cmd)}") from exc
    except FileNotFoundError as exc:
        raise CheckFailed(f"command not found: {cmd[0]}") from exc
    if proc.returncode != 0:
        raise CheckFailed(
            f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
        )
    return proc.stdout


def _clean_env() -> dict[str, str]:
    """The environment without anything that would point a child at the workspace's venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.setdefault("UV_PYTHON_DOWNLOADS", "never")
    return env


def _default_python() -> str:
    """The base interpreter behind the running Python (not the workspace venv's)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def build_wheels(dist: Path, env: dict[str, str]) -> dict[str, Path]:
    """Build each light package's wheel alone into `dist`; return {distribution: wheel path}."""
    wheels = {}
    for name in PACKAGES:
        out = dist / name
        _run(
            ["uv", "build", "--package", name, "--wheel", "--no-sources", "-o", str(out)],
            cwd=REPO_ROOT,
            env=env,
        )
        found = sorted(out.glob("*.whl"))
        if len(found) != 1:
            raise CheckFailed(f"expected one wheel for {name} in {out}, found {[p.name for p in found]}")
        wheels[name] = found[0]
    return wheels


def check_wheel_layout(wheels: dict[str, Path]) -> list[str]:
    """Problems with the wheels' contents (arl must stay a namespace package)."""
    problems = []
    for name, wheel in wheels.items():
        files = zipfile.ZipFile(wheel).namelist()
        if "arl/__init__.py" in files:
            problems.append(f"{wheel.name} ships arl/__init__.py (arl is a PEP 420 namespace package)")
        package_dir = PACKAGES[name].replace(".", "/") + "/"
        if not any(f.startswith(package_dir) and f.endswith(".py") for f in files):
            problems.append(f"{wheel.name} contains no module under {package_dir}")
    return problems


def install_and_probe(work: Path, wheels: dict[str, Path], python: str, env: dict[str, str]) -> list[str]:
    """Create a venv in `work`, install the wheels from PyPI, import everything; return the problems."""
    venv = work / "venv"
    _run(["uv", "venv", str(venv), "--python", python, "--no-project"], cwd=work, env=env)
    venv_python = venv / "bin" / "python"
    _run(
        ["uv", "pip", "install", "--python", str(venv_python), *map(str, wheels.values())],
        cwd=work,
        env=env,
    )
    out = _run(
        [str(venv_python), "-I", "-c", _PROBE, ",".join(FORBIDDEN), *PACKAGES.values()],
        cwd=work,
        env=env,
        label=f"{venv_python} -I -c <import every module of {', '.join(PACKAGES.values())}>",
    )
    report = json.loads(out.strip().splitlines()[-1])
    problems = []
    for module, tb in report["errors"].items():
        problems.append(f"import of {module} failed in the fresh environment:\n{tb}")
    if report["loaded"]:
        where = report["forbidden_after"]
        problems.append(
            f"{', '.join(report['loaded'])} in sys.modules after importing the light packages "
            f"(first pulled in by {where.get('module')}: {where.get('pulled')})"
        )
    if report["installed"]:
        problems.append(f"installing the light packages also installed {', '.join(report['installed'])}")
    print(f"imported {len(report['imported'])} modules: {', '.join(report['imported'])}")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Run the whole check; 0 on success, 1 on any problem."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder for inspection")
    parser.add_argument("--python", default=_default_python(), help="interpreter for the fresh venv")
    parser.add_argument(
        "--workdir", type=Path, help="use this folder (outside the workspace) instead of a temp one"
    )
    args = parser.parse_args(argv)

    if shutil.which("uv") is None:
        print("FAIL: uv is not on PATH", file=sys.stderr)
        return 1
    work = args.workdir or Path(tempfile.mkdtemp(prefix="arl-light-"))
    work.mkdir(parents=True, exist_ok=True)
    if work.resolve().is_relative_to(REPO_ROOT):
        print(f"FAIL: the work folder {work} must lie outside the workspace", file=sys.stderr)
        return 1
    env = _clean_env()
    started = time.monotonic()
    try:
        wheels = build_wheels(work / "dist", env)
        problems = check_wheel_layout(wheels)
        problems += install_and_probe(work, wheels, args.python, env)
    except CheckFailed as exc:
        problems = [str(exc)]
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    elapsed = time.monotonic() - started
    if problems:
        for p in problems:
            print(f"FAIL: {p}", file=sys.stderr)
        return 1
    print(f"OK: {', '.join(PACKAGES)} install and import without {', '.join(FORBIDDEN)} ({elapsed:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
