"""The pinned packages a SWE task set is built from by default: pure-Python sdists that ship fast test suites.

Each was built with the builder itself (its whole-suite probe and baseline): the tests are in the sdist and
the whole suite runs in seconds under the Debian Python 3.11 with pytest and at most a few small extra wheels
(`test_deps`). The per-package figures are in arl-harbor's BENCHMARKS.md. Any other package is built with
`PackageSpec`s from the command line or a TOML file (`arl.harbor.swe.specs`), checked the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from arl.harbor.errors import HarborConfigError

_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")  # PEP 508's project name
_VERSION = re.compile(r"^[0-9][A-Za-z0-9.+!_-]*$")  # a release, as PyPI spells it (no ranges, no wildcards)
# The runner and the grader pin pytest's rootdir and config file; a spec may not move them.
_PINNED_PYTEST_ARGS = ("--rootdir", "--config-file", "-c")


def _relative(path: str) -> bool:
    p = PurePosixPath(path)
    return bool(path) and not p.is_absolute() and ".." not in p.parts and "\\" not in path


@dataclass(frozen=True)
class PackageSpec:
    """One package: where its importable source lives inside the sdist and how its tests are run.

    Checked when made: a bad field raises `HarborConfigError` naming the package and the field.
    """

    name: str  # the PyPI name
    version: str
    src_root: str = "."  # the dir (relative to the sdist root) that goes on PYTHONPATH
    test_deps: tuple[str, ...] = ()  # extra requirements of the tests (pytest itself is in the base image)
    pytest_args: tuple[str, ...] = ()  # added to every pytest run (e.g. dropping a coverage addopts)
    skip_test_files: tuple[str, ...] = field(default=())  # test files left out (need deps we do not ship)

    def __post_init__(self) -> None:
        def bad(what: str) -> HarborConfigError:
            return HarborConfigError(f"package spec {self.name!r} {self.version!r}: {what}")

        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise bad("name must be a PyPI project name (letters, digits, '.', '_', '-')")
        if not isinstance(self.version, str) or not _VERSION.match(self.version):
            raise bad("version must be one released version, e.g. '1.2.0'")
        if not isinstance(self.src_root, str) or not (self.src_root == "." or _relative(self.src_root)):
            raise bad(f"src_root {self.src_root!r} must be a folder inside the sdist ('.', 'src', ...)")
        for fname in ("test_deps", "pytest_args", "skip_test_files"):
            value = getattr(self, fname)
            if not isinstance(value, tuple) or not all(isinstance(v, str) and v.strip() for v in value):
                raise bad(f"{fname} must be a tuple of non-empty strings, got {value!r}")
        for arg in self.pytest_args:
            if arg.split("=", 1)[0] in _PINNED_PYTEST_ARGS or arg.startswith(_PINNED_PYTEST_ARGS):
                raise bad(f"pytest_args may not set {arg!r}: the rootdir and config file are pinned")
        for path in self.skip_test_files:
            if not _relative(path):
                raise bad(f"skip_test_files entry {path!r} must be a path relative to the sdist root")

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


PACKAGES: tuple[PackageSpec, ...] = (
    PackageSpec("boltons", "26.2.0"),
    PackageSpec("cachetools", "8.0.2", src_root="src"),
    PackageSpec("toolz", "1.2.0"),
    PackageSpec("tabulate", "0.10.0"),
    PackageSpec("inflection", "0.5.1"),
    PackageSpec("six", "1.17.0"),
    # parse's addopts asks for pytest-cov; the doctest options it also sets are not needed here.
    PackageSpec("parse", "1.22.4", pytest_args=("-o", "addopts=")),
    PackageSpec(
        "humanize",
        "4.17.0",
        src_root="src",
        test_deps=("freezegun==1.5.5",),
        skip_test_files=("tests/test_benchmarks.py",),  # needs pytest-benchmark
    ),
    # tests/test_dos_prevention.py asserts sub-second parse times: under load a fix could fail it.
    PackageSpec("sqlparse", "0.6.1", skip_test_files=("tests/test_dos_prevention.py",)),
    PackageSpec("pyflakes", "4.1.0"),
    PackageSpec("h11", "0.16.0"),
    PackageSpec("isodate", "0.7.2", src_root="src"),
    PackageSpec("pathspec", "1.1.1"),
    PackageSpec("tomlkit", "0.15.3"),
    PackageSpec("python-slugify", "9.2.0", test_deps=("text-unidecode==1.3",)),
    PackageSpec("pyasn1", "0.6.5"),
    PackageSpec("pycparser", "3.12"),
    PackageSpec("json5", "0.17.3"),
    PackageSpec("voluptuous", "0.16.0"),
    PackageSpec("rfc3986", "2.0.0", src_root="src"),
)

BY_NAME = {p.name: p for p in PACKAGES}


def select(names: list[str] | None) -> list[PackageSpec]:
    """The specs named (all when `names` is empty); an unknown name is an error listing the known ones."""
    if not names:
        return list(PACKAGES)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise HarborConfigError(
            f"unknown package(s) {unknown}; known: {sorted(BY_NAME)} (any other package: "
            "--package NAME==VERSION or --packages-file)"
        )
    return [BY_NAME[n] for n in names]
