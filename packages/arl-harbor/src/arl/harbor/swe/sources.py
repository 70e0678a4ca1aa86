"""Fetch and unpack the pinned sdists into the cache (`<cache>/sdists`, `<cache>/src/<name>-<version>`).

pip downloads them (PyPI is reachable here; nothing else is): `pip download --no-deps --no-binary <name>`
so that the sdist, not a wheel, is fetched. An unpacked tree is reused when present.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

from arl.harbor.swe.packages import PackageSpec

DOWNLOAD_TIMEOUT_SEC = 600


class SourceError(RuntimeError):
    """An sdist could not be fetched or unpacked."""


def _find_sdist(folder: Path, spec: PackageSpec) -> Path | None:
    # An sdist is named by the project's name as its release spelled it, or normalized (PEP 625: [-_.] → "_").
    stems = {
        spec.name.lower(),
        spec.name.lower().replace("-", "_"),
        re.sub(r"[-_.]+", "_", spec.name.lower()),
    }
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        name = path.name.lower()
        for stem in stems:
            for ext in (".tar.gz", ".zip"):
                if name == f"{stem}-{spec.version}{ext}":
                    return path
    return None


def download_sdist(spec: PackageSpec, cache: Path, *, python: str) -> Path:
    """The sdist of `spec` in `<cache>/sdists`, downloaded with `python -m pip` when missing."""
    folder = cache / "sdists"
    folder.mkdir(parents=True, exist_ok=True)
    found = _find_sdist(folder, spec)
    if found:
        return found
    cmd = [
        python,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--no-binary",
        spec.name,
        f"{spec.name}=={spec.version}",
        "-d",
        str(folder),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_SEC)
    except subprocess.TimeoutExpired:
        raise SourceError(f"pip download of {spec.key} timed out after {DOWNLOAD_TIMEOUT_SEC}s") from None
    found = _find_sdist(folder, spec)
    if proc.returncode != 0 or not found:
        raise SourceError(
            f"pip download of the {spec.key} sdist failed ({proc.returncode}): {proc.stderr[-1500:]}"
        )
    return found


def unpack(sdist: Path, dest: Path) -> Path:
    """Unpack `sdist` so that its single top-level folder becomes `dest` (replaced if present)."""
    tmp = dest.with_name(dest.name + ".unpacking")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if sdist.name.endswith(".zip"):
        with zipfile.ZipFile(sdist) as z:
            z.extractall(tmp)
    else:
        with tarfile.open(sdist) as t:
            t.extractall(tmp, filter="data")
    tops = list(tmp.iterdir())
    if len(tops) != 1 or not tops[0].is_dir():
        raise SourceError(f"{sdist.name}: expected one top-level folder, found {[p.name for p in tops]}")
    shutil.rmtree(dest, ignore_errors=True)
    tops[0].rename(dest)
    tmp.rmdir()
    return dest


def fetch(spec: PackageSpec, cache: Path, *, python: str) -> Path:
    """The unpacked, pristine source tree of `spec` (`<cache>/src/<name>-<version>`)."""
    dest = cache / "src" / spec.key
    if (dest / "PKG-INFO").is_file():
        return dest
    return unpack(download_sdist(spec, cache, python=python), dest)
