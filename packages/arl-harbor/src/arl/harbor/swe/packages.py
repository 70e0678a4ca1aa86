"""The pinned packages a SWE task set is built from: pure-Python sdists that ship fast test suites.

Each was checked with `pip download --no-binary <name> --no-deps <name>==<version>`: the tests are in
the sdist and the whole suite runs in a few seconds under the Debian Python 3.11 with pytest and at most
a few small extra wheels (`test_deps`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PackageSpec:
    """One package: where its importable source lives inside the sdist and how its tests are run."""

    name: str  # the PyPI name
    version: str
    src_root: str = "."  # the dir (relative to the sdist root) that goes on PYTHONPATH
    test_deps: tuple[str, ...] = ()  # extra requirements of the tests (pytest itself is in the base image)
    pytest_args: tuple[str, ...] = ()  # added to every pytest run (e.g. dropping a coverage addopts)
    skip_test_files: tuple[str, ...] = field(default=())  # test files left out (need deps we do not ship)

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
        "humanize", "4.17.0", src_root="src", test_deps=("freezegun==1.5.5",),
        skip_test_files=("tests/test_benchmarks.py",),  # needs pytest-benchmark
    ),
)

BY_NAME = {p.name: p for p in PACKAGES}


def select(names: list[str] | None) -> list[PackageSpec]:
    """The specs named (all when `names` is empty); an unknown name is an error listing the known ones."""
    if not names:
        return list(PACKAGES)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown package(s) {unknown}; known: {sorted(BY_NAME)}")
    return [BY_NAME[n] for n in names]
