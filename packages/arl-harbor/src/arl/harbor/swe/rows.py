"""SWE-bench-format rows: the published row shapes, a loader, and the row the importer reads.

SWE-bench, SWE-Gym, SWE-smith, R2E-Gym and SWE-rebench all publish one row per task instance with the
same core fields (`instance_id`, `repo`, `base_commit`, `patch`, `test_patch`, `problem_statement`,
`FAIL_TO_PASS`, `PASS_TO_PASS`), differing in a few columns and in how the test lists are stored:

- `SweBenchVerifiedRow`: princeton-nlp/SWE-bench_Verified (test split): 13 string columns, the test lists
  JSON-encoded into strings (`"[\\"tests/test_x.py::test_y\\"]"`);
- `SweGymRow`: SWE-Gym/SWE-Gym (train split): 11 columns, the test lists as lists of strings (no
  `environment_setup_commit`, no `difficulty`).

`validate_published(raw, shape)` checks a row against one of them exactly (every field, no other).
`SweRow` is what `arl.harbor.swe.import_rows` reads of a row of any of these datasets: the core fields
(the test lists in either encoding), optional ones with defaults, the instance's image from `image`,
`docker_image` (SWE-Next, R2E-Gym) or `image_name` (SWE-smith), and an optional per-row `test_cmd`;
other columns are ignored. `read_rows(path)` loads `.jsonl`, `.json` (a list, or JSON lines as
Hugging Face's `to_json` writes them) and `.parquet` (needs pyarrow: `pip install 'arl-harbor[parquet]'`).
Every problem is a `RowError` naming the file, the row number (1-based), the instance id and the field.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec

from arl.harbor.errors import HarborConfigError
from arl.harbor.tasks import json_lines


class SweBenchVerifiedRow(msgspec.Struct, forbid_unknown_fields=True):
    """A row of SWE-bench Verified as published: every column a string; FAIL_TO_PASS and PASS_TO_PASS are
    JSON-encoded lists of test ids; `difficulty` is the annotators' estimate ("<15 min fix", ...)."""

    repo: str
    instance_id: str
    base_commit: str
    patch: str
    test_patch: str
    problem_statement: str
    hints_text: str
    created_at: str
    version: str
    FAIL_TO_PASS: str
    PASS_TO_PASS: str
    environment_setup_commit: str
    difficulty: str


class SweGymRow(msgspec.Struct, forbid_unknown_fields=True):
    """A row of SWE-Gym as published: strings, and FAIL_TO_PASS / PASS_TO_PASS as lists of test ids."""

    instance_id: str
    hints_text: str
    patch: str
    test_patch: str
    created_at: str
    problem_statement: str
    repo: str
    base_commit: str
    version: str
    PASS_TO_PASS: list[str]
    FAIL_TO_PASS: list[str]


PUBLISHED_SHAPES: dict[str, type[msgspec.Struct]] = {
    "swe-bench-verified": SweBenchVerifiedRow,
    "swe-gym": SweGymRow,
}
# Columns that name the instance's image, in the order they are looked at.
IMAGE_COLUMNS = ("image", "docker_image", "image_name")
_TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")
# Optional string columns: a null there (pandas/parquet writes them) is the empty default.
_OPTIONAL_TEXT = ("test_patch", "base_commit", "environment_setup_commit", "created_at", "hints_text")
# A task dir is named after its instance: a plain file name.
_INSTANCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")


class SweRow(msgspec.Struct, kw_only=True):
    """One instance as the importer reads it (see the module docstring for where each field comes from)."""

    instance_id: str
    repo: str
    patch: str  # the gold fix: the oracle
    problem_statement: str  # the instruction
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    test_patch: str = ""  # tests that come with the fix: applied by the grader only
    base_commit: str = ""
    version: str = ""
    environment_setup_commit: str = ""
    created_at: str = ""
    hints_text: str = ""
    image: str | None = None
    test_cmd: str | None = None


class RowError(HarborConfigError):
    """A row that cannot become a task: which file, row, instance and field, and why."""

    def __init__(self, where: str, number: int, instance_id: str | None, field: str, reason: str) -> None:
        self.where, self.number, self.instance_id, self.field, self.reason = (
            where,
            number,
            instance_id,
            field,
            reason,
        )
        prefix = f"{where} " if where else ""
        super().__init__(f"{prefix}row {number} ({instance_id or 'no instance_id'}): {field}: {reason}")

    def to_json(self) -> dict[str, Any]:
        return {
            "row": self.number,
            "instance_id": self.instance_id,
            "field": self.field,
            "reason": self.reason,
        }


def _parquet_rows(path: Path) -> list[Any]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise HarborConfigError(
            f"{path}: reading .parquet rows needs pyarrow, which is not installed "
            "(pip install 'arl-harbor[parquet]', or convert the file to .jsonl)"
        ) from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise HarborConfigError(f"{path}: not a readable parquet file ({type(e).__name__}: {e})") from None


def read_rows(path: str | Path) -> list[Any]:
    """The rows of a `.jsonl`, `.json` or `.parquet` file, in file order (not yet checked)."""
    path = Path(path)
    if not path.is_file():
        raise HarborConfigError(f"{path}: no such rows file")
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    if path.suffix not in (".jsonl", ".json"):
        raise HarborConfigError(
            f"{path}: SWE-bench-format rows must be .jsonl, .json or .parquet, got {path.suffix!r}"
        )
    text = path.read_text()
    if path.suffix == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg != "Extra data":  # JSON lines in a .json file (Hugging Face's to_json): read as lines
                raise HarborConfigError(f"{path}: invalid JSON ({e})") from None
            return json_lines(path, text)
        if isinstance(rows, dict):  # one row (JSON lines of one line)
            return [rows]
        if not isinstance(rows, list):
            raise HarborConfigError(f"{path}: expected a JSON list of rows, got {type(rows).__name__}")
        return rows
    return json_lines(path, text)


def is_pytest_node_id(test_id: str) -> bool:
    """Whether `test_id` is a pytest node id relative to the repository root (`path/to/test_x.py::test[p]`):
    what arl's grader looks up in its report. Django's `test_x (module.Class)` or sympy's bare `test_x` are
    not."""
    path, sep, name = test_id.partition("::")
    parts = path.split("/")
    return (
        bool(sep)
        and bool(name)
        and not path.startswith("/")
        and "." in parts[-1]
        and not any(c.isspace() for c in path)
        and ".." not in parts
        and "" not in parts
    )


def _field_and_reason(error: msgspec.ValidationError) -> tuple[str, str]:
    """(field, reason) of msgspec's "Expected `str`, got `int` - at `$.version`" / "missing required field"."""
    text = str(error)
    field = re.search(r"at `\$\.(\w+)", text) or re.search(r"field `(\w+)`", text)
    return (field.group(1) if field else "(row)"), text.split(" - at ")[0]


def _test_list(value: Any, field: str, fail: Any) -> list[str]:
    """A FAIL_TO_PASS / PASS_TO_PASS value as a list: SWE-bench's JSON-encoded string or a list."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            fail(field, f"a string here must be a JSON-encoded list of test ids (SWE-bench's encoding): {e}")
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        fail(field, f"must be a list of test id strings (or a JSON-encoded one), got {type(value).__name__}")
    return value


def parse_row(raw: Any, number: int, where: str) -> SweRow:
    """The `SweRow` of one raw row (`number`: 1-based, for errors); raises `RowError` on the first problem."""
    instance_id = raw.get("instance_id") if isinstance(raw, dict) else None
    instance_id = instance_id if isinstance(instance_id, str) else None

    def fail(field: str, reason: str) -> None:
        raise RowError(where, number, instance_id, field, reason)

    if not isinstance(raw, dict):
        fail("(row)", f"expected an object, got {type(raw).__name__}")
    if instance_id is None:
        fail("instance_id", "missing or not a string")
    if not _INSTANCE_ID.fullmatch(instance_id):
        fail(
            "instance_id",
            f"{instance_id!r} must be 1-200 characters of letters, digits and ._+- (it names the task dir)",
        )
    row = {k: v for k, v in raw.items() if k in SweRow.__struct_fields__}
    for field in _TEST_LISTS:
        if field in raw:
            row[field] = _test_list(raw[field], field, fail)
    for field in _OPTIONAL_TEXT:
        if row.get(field, "") is None:
            row[field] = ""
    version = raw.get("version")
    if isinstance(version, int | float) and not isinstance(version, bool):
        fail("version", f"must be a string, got the number {version!r} (a number loses digits: 3.10 is 3.1)")
    row["version"] = "" if version is None else version
    images = {c: raw[c] for c in IMAGE_COLUMNS if raw.get(c) not in (None, "")}
    if len(set(images.values())) > 1:
        fail("image", f"the image columns disagree: {images}")
    row["image"] = next(iter(images.values()), None)
    if row.get("test_cmd") == "":
        row["test_cmd"] = None
    try:
        parsed = msgspec.convert(row, SweRow, strict=True)
    except msgspec.ValidationError as e:
        fail(*_field_and_reason(e))
    for field in ("patch", "problem_statement", "repo"):
        if not getattr(parsed, field).strip():
            fail(field, "is empty")
    if not parsed.FAIL_TO_PASS:
        fail("FAIL_TO_PASS", "is empty: the task would have nothing to fix")
    return parsed


def validate_published(raw: Any, shape: str, *, number: int = 1, where: str = "") -> msgspec.Struct:
    """`raw` decoded as exactly the published row of `shape` ("swe-bench-verified" or "swe-gym"): every
    column there with its published type and no other; raises `RowError` naming the field."""
    if shape not in PUBLISHED_SHAPES:
        raise ValueError(f"unknown row shape {shape!r}; known: {sorted(PUBLISHED_SHAPES)}")
    instance_id = raw.get("instance_id") if isinstance(raw, dict) else None
    try:
        return msgspec.convert(raw, PUBLISHED_SHAPES[shape], strict=True)
    except msgspec.ValidationError as e:
        raise RowError(
            where, number, instance_id if isinstance(instance_id, str) else None, *_field_and_reason(e)
        ) from None
