"""Package specs from the user: `NAME==VERSION` pins on the command line, or a TOML file of them.

A specs file is a list of `[[package]]` tables with PackageSpec's fields (`name` and `version` required):

    [[package]]
    name = "humanize"
    version = "4.17.0"
    src_root = "src"                               # the folder that goes on PYTHONPATH (default ".")
    test_deps = ["freezegun==1.5.5"]               # extra wheels the tests need (pytest is always there)
    pytest_args = ["-o", "addopts="]               # added to every pytest run
    skip_test_files = ["tests/test_benchmarks.py"] # test files left out

Every error names the file, the table (`package[2]`, its name when known) and the field.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import msgspec

from arl.harbor.errors import HarborConfigError
from arl.harbor.swe.packages import PackageSpec


class SpecTable(msgspec.Struct, forbid_unknown_fields=True):
    """One `[[package]]` table of a specs file: PackageSpec's fields, as TOML gives them."""

    name: str
    version: str
    src_root: str = "."
    test_deps: list[str] = []
    pytest_args: list[str] = []
    skip_test_files: list[str] = []

    def to_spec(self) -> PackageSpec:
        return PackageSpec(
            self.name,
            self.version,
            src_root=self.src_root,
            test_deps=tuple(self.test_deps),
            pytest_args=tuple(self.pytest_args),
            skip_test_files=tuple(self.skip_test_files),
        )


class SpecsFile(msgspec.Struct, forbid_unknown_fields=True):
    """A specs file: its `[[package]]` tables."""

    package: list[SpecTable]


def parse_pin(text: str) -> tuple[str, str]:
    """`NAME==VERSION` → (name, version); anything else (a range, no version) is an error saying so."""
    name, sep, version = text.strip().partition("==")
    if not sep or not name.strip() or not version.strip():
        raise HarborConfigError(
            f"--package {text!r}: expected NAME==VERSION (one pinned release, e.g. 'humanize==4.17.0')"
        )
    return name.strip(), version.strip()


def spec_from_pin(
    text: str,
    *,
    src_root: str = ".",
    test_deps: tuple[str, ...] = (),
    pytest_args: tuple[str, ...] = (),
    skip_test_files: tuple[str, ...] = (),
) -> PackageSpec:
    """The PackageSpec of a `--package NAME==VERSION` with its options (checked by PackageSpec)."""
    name, version = parse_pin(text)
    try:
        return PackageSpec(
            name,
            version,
            src_root=src_root,
            test_deps=test_deps,
            pytest_args=pytest_args,
            skip_test_files=skip_test_files,
        )
    except HarborConfigError as e:
        raise HarborConfigError(f"--package {text}: {e}") from None


def load_specs_file(path: Path) -> list[PackageSpec]:
    """The specs of a TOML file of `[[package]]` tables (at least one)."""
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as e:
        raise HarborConfigError(f"{path}: cannot read the specs file: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise HarborConfigError(f"{path}: not valid TOML: {e}") from None
    tables = raw.get("package")
    if isinstance(tables, list):
        # Check table by table so that the error names the package, not only its index.
        for i, table in enumerate(tables):
            where = f"package[{i}]" + (
                f" ({table['name']})" if isinstance(table, dict) and "name" in table else ""
            )
            try:
                msgspec.convert(table, SpecTable)
            except msgspec.ValidationError as e:
                raise HarborConfigError(f"{path}: {where}: {_field_message(e)}") from None
    try:
        parsed = msgspec.convert(raw, SpecsFile)
    except msgspec.ValidationError as e:
        raise HarborConfigError(
            f"{path}: {_field_message(e)} (expected [[package]] tables with "
            f"{', '.join(SpecTable.__struct_fields__)})"
        ) from None
    if not parsed.package:
        raise HarborConfigError(f"{path}: no [[package]] table")
    specs = []
    for i, table in enumerate(parsed.package):
        try:
            specs.append(table.to_spec())
        except HarborConfigError as e:
            raise HarborConfigError(f"{path}: package[{i}]: {e}") from None
    return specs


def _field_message(error: msgspec.ValidationError) -> str:
    # msgspec says "... - at `$.package[0].test_deps`"; the field's path reads better without the "$.".
    return str(error).replace("`$.", "`").replace("`$`", "the file")


def check_unique(specs: list[PackageSpec]) -> list[PackageSpec]:
    """`specs` unchanged, or an error naming a package given twice (a set holds one version of each)."""
    seen: dict[str, PackageSpec] = {}
    for spec in specs:
        name = re.sub(r"[-_.]+", "-", spec.name.lower())  # PyPI's normalized name (PEP 503)
        other = seen.get(name)
        if other is not None:
            raise HarborConfigError(
                f"package {spec.name} is given twice ({other.key} and {spec.key}); a task set "
                "holds one version of each package"
            )
        seen[name] = spec
    return specs
