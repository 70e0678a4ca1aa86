"""A test venv per package, made with the Debian Python that the task image also uses, from wheelhouses.

`<cache>/wheels/_base` holds pytest and its dependencies (in the task image they come with the base
image, so they are never copied into a task); `<cache>/wheels/<name>-<version>` holds the package's extra
test dependencies only (copied into each task's `environment/wheels/` so the image builds offline).
The venv (`<cache>/venvs/<name>-<version>`) has pytest + those extras and NOT the package itself: tests
import it from the testbed through PYTHONPATH, as the verifier in the container does.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from arl.harbor.swe.packages import PackageSpec

DEBIAN_PYTHON = "/usr/bin/python3.11"  # Debian bookworm's python3, the same as the base image's
PYTEST_REQUIREMENT = "pytest==9.2.0"
PIP_TIMEOUT_SEC = 600


class VenvError(RuntimeError):
    """A wheelhouse or venv could not be prepared."""


def _run(cmd: list[str], what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_SEC)
    except subprocess.TimeoutExpired:
        raise VenvError(f"{what} timed out after {PIP_TIMEOUT_SEC}s") from None
    if proc.returncode != 0:
        raise VenvError(f"{what} failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-1500:]}")


def _dist_name(wheel: Path) -> str:
    return re.sub(r"[-_.]+", "_", wheel.name.split("-", 1)[0]).lower()


def _download_wheels(python: str, folder: Path, requirements: Sequence[str], what: str) -> None:
    """`pip download` of `requirements` (wheels only) for `python` into `folder`."""
    cmd = [python, "-m", "pip", "download", "--quiet", "--only-binary", ":all:", "-d", str(folder)]
    _run([*cmd, *requirements], f"pip download of {what}")


def base_wheelhouse(cache: Path, *, python: str) -> Path:
    """`<cache>/wheels/_base`: pytest and its dependencies as wheels for `python`."""
    folder = cache / "wheels" / "_base"
    if not list(folder.glob("pytest-*.whl")):
        folder.mkdir(parents=True, exist_ok=True)
        _download_wheels(python, folder, [PYTEST_REQUIREMENT], "pytest")
    return folder


def package_wheelhouse(spec: PackageSpec, cache: Path, *, python: str) -> Path:
    """`<cache>/wheels/<key>`: the package's extra test deps (and theirs), minus what the base has."""
    folder = cache / "wheels" / spec.key
    done = folder / ".complete"
    wanted = " ".join(spec.test_deps) + "\n"
    if done.is_file() and done.read_text() == wanted:  # the same deps (a user spec may change them)
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if spec.test_deps:
        _download_wheels(python, folder, spec.test_deps, f"{spec.key}'s test deps")
        base = {_dist_name(w) for w in base_wheelhouse(cache, python=python).glob("*.whl")}
        for wheel in folder.glob("*.whl"):
            if _dist_name(wheel) in base:
                wheel.unlink()
    done.write_text(wanted)
    return folder


def ensure_venv(spec: PackageSpec, cache: Path, *, python: str = DEBIAN_PYTHON) -> Path:
    """`<cache>/venvs/<key>` with pytest and the test deps (built once, from the wheelhouses, offline)."""
    venv = cache / "venvs" / spec.key
    marker = venv / ".arl-swe-complete"
    wanted = f"{PYTEST_REQUIREMENT} {' '.join(spec.test_deps)}\n"
    if marker.is_file() and marker.read_text() == wanted:
        return venv
    base = base_wheelhouse(cache, python=python)
    extra = package_wheelhouse(spec, cache, python=python)
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run([python, "-m", "venv", "--without-pip", str(venv)], f"venv for {spec.key}")
    _run(
        [
            python,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--quiet",
            "--no-index",
            "--find-links",
            str(base),
            "--find-links",
            str(extra),
            PYTEST_REQUIREMENT,
            *spec.test_deps,
        ],
        f"installing {spec.key}'s test deps into its venv",
    )
    marker.write_text(wanted)
    return venv


def copy_venv(venv: Path, dest: Path, *, link: bool = False) -> Path:
    """A copy of `venv` at `dest` (symlinks kept: bin/python points at the Debian interpreter), or a
    symlink to it with `link`."""
    if link:
        if dest.is_symlink() or dest.exists():
            if dest.is_symlink() and dest.resolve() == venv.resolve():
                return dest
            if dest.is_symlink():
                dest.unlink()
            else:
                shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.symlink_to(venv.resolve(), target_is_directory=True)
        return dest
    marker = dest / ".arl-swe-complete"
    if marker.is_file() and marker.read_text() == (venv / ".arl-swe-complete").read_text():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(venv, dest, symlinks=True)
    # The venv's activate scripts name its old path; `python -m pytest` does not use them.
    return dest
