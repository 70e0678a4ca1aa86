"""SWE-bench-format rows → ordinary Harbor task dirs, graded exactly like arl's own SWE tasks.

    python -m arl.harbor.swe convert <rows.jsonl|.json|.parquet|import.toml> --out <dir>
        [--image-template swebench|swe-gym|'<format>'] [--python /abs/python] [--test-cmd CMD]
        [--test-cmd OWNER/REPO=CMD ...] [--skip-invalid]
    data.source = "swebench:<rows file | import .toml>"     (converted once into a cache, see `imported_set`)

Each row (`arl.harbor.swe.rows.SweRow`) becomes `<out>/<instance_id>/`:
- `environment/Dockerfile`: `FROM` the instance's image (its `image` / `docker_image` / `image_name` column,
  else the image template), which holds the repository at `base_commit` in `/testbed`; a `RUN` step makes
  the grader's base copy `/arl/base` from the image's `/testbed` (unless the image has one already, as
  images exported by arl do); the test interpreter's folder first on `PATH`; `WORKDIR /testbed`;
- `instruction.md` = `problem_statement`; `solution/fix.patch` = the gold `patch` + `solve.sh` (the oracle);
- `tests/`: arl's grader (`task_files/test.sh` and the plugin files, the same as the builder writes), with
  `config.json` listing FAIL_TO_PASS / PASS_TO_PASS and `test.patch` = the row's `test_patch`, which the
  grader applies only after grading the change (the agent never sees those tests);
- `task.toml`: separate verifier mode, `artifacts = ["/testbed"]`, no network, `[metadata] arl_grading`.

The test command (the row's `test_cmd`, else the per-repo mapping, else `--test-cmd`, default `pytest`) must
run pytest: `[PYTHONPATH=<dir under /testbed>] (pytest | python[3] -m pytest | /abs/python -m pytest)
[pytest args]`; its `-c FILE` becomes the grader's pinned config, `PYTHONPATH` its source root, an
absolute interpreter the one that runs the tests, every other argument is passed to pytest. A row is
refused, with its number, instance id, field and the reason, when its tests are not pytest node ids
(Django's `runtests.py` ids, sympy's `bin/test` names: scoring them needs a log parser, not built yet) or
are cut short (unbalanced brackets), its test command is not pytest, its gold patch changes what the
grader puts back (tests, runner configs), or a patch is binary where the grader applies it with `patch`.
By default the bad rows stop the import, each listed; `skip_invalid` imports the rest and lists every
refused row in `<out>/refused.jsonl`. Without `-c`, the grader pins the repository's own pytest config as
the image's base copy has it (`auto`: found as pytest finds it, at grade time, since converting does not see
the image), or an empty one when it has none.

The grader refuses a change that adds references to the test harness or the interpreter's machinery
(`grade_change.DEFAULT_REACH_PATTERNS`). A real fix can need some (a fix of pytest itself names `_pytest`),
so each task's `reach_patterns` leave out exactly the patterns its gold patch adds.

arl's local sandbox cannot run these tasks: it runs the host's system dirs, not an image's filesystem, and
the repository exists only in the image (the Dockerfile's RUN steps have no `local_setup.sh` stand-in, so
the sandbox refuses such a task at start as `invalid_task`). They run in Harbor's docker environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from arl.harbor.errors import HarborConfigError
from arl.harbor.swe import grading
from arl.harbor.swe.rows import RowError, SweRow, is_pytest_node_id, parse_row, read_rows
from arl.harbor.swe.writer import BASE_DIR, GRADING, PLUGIN_FILES, SANDBOX_VENV, TASK_FILES

# The interpreter of SWE-bench's instance images: the `testbed` conda env its image builder creates
# (swebench.harness.test_spec.make_test_spec, env_name = "testbed"; miniconda at /opt/miniconda3).
SWEBENCH_PYTHON = "/opt/miniconda3/envs/testbed/bin/python"
# Image names of the published instance images. SWE-bench (swebench.harness.test_spec.TestSpec.
# instance_image_key): f"{namespace}/sweb.eval.{arch}.{instance_id.lower()}:latest" with "__" → "_1776_",
# namespace "swebench" on Docker Hub. SWE-Gym (OpenHands' get_instance_docker_image): "docker.io/xingyaoww/"
# + "sweb.eval.x86_64." + instance_id with "__" → "_s_", lowercased.
IMAGE_PRESETS: dict[str, tuple[str, str]] = {
    "swebench": ("swebench/sweb.eval.x86_64.{swebench_key}:latest", SWEBENCH_PYTHON),
    "swe-gym": ("docker.io/xingyaoww/sweb.eval.x86_64.{openhands_key}", SWEBENCH_PYTHON),
}
DEFAULT_TEST_CMD = "pytest"
SOURCE_ROWS_CACHE_ENV = "ARL_SWE_ROWS_CACHE"
# Bumped when what a row turns into changes (with the grader's files, part of an import's digest).
IMPORT_FORMAT = 1
_MARKER = "import.json"


class ImportOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How rows become tasks: `convert`'s flags, or the keys of a `swebench:<import.toml>` source."""

    # (import .toml only) the rows file, relative to the .toml's folder.
    rows: str = ""
    # (import .toml only) where the task dirs go; default: a cache folder keyed by the rows and options.
    out: str = ""
    # The image of a row that names none: a preset ("swebench", "swe-gym") or a str.format template over
    # instance_id, instance_id_lower, swebench_key, openhands_key, repo, owner, name, version, base_commit.
    image_template: str = ""
    # The interpreter in the image that runs the tests (its folder goes first on PATH); default: the
    # preset's (SWE-bench's conda env), else the image's python3. A test_cmd naming one wins.
    python: str = ""
    # The test command of rows with no `test_cmd` column and no per-repo entry (a pytest command line).
    test_cmd: str = DEFAULT_TEST_CMD
    # Per-repository test commands: {"owner/name": "pytest -rA ..."}.
    repo_test_cmds: dict[str, str] = msgspec.field(default_factory=dict)
    # Import the valid rows and list the refused ones in <out>/refused.jsonl instead of failing.
    skip_invalid: bool = False
    agent_timeout_sec: float = 1800.0
    # SWE-bench's harness gives an instance's tests 1800 s.
    verifier_timeout_sec: float = 1800.0
    # The first build of a task pulls its instance image (several GB) when the engine does not have it.
    build_timeout_sec: float = 1800.0
    cpus: int = 1
    memory_mb: int = 4096

    def check(self) -> None:
        for key in ("agent_timeout_sec", "verifier_timeout_sec", "build_timeout_sec"):
            if getattr(self, key) <= 0:
                raise HarborConfigError(f"import option {key} must be > 0, got {getattr(self, key)}")
        if self.verifier_timeout_sec <= 60:
            raise HarborConfigError("import option verifier_timeout_sec must be > 60 (pytest gets 30 s less)")
        if self.cpus < 1 or self.memory_mb < 256:
            raise HarborConfigError(
                f"import options cpus >= 1 and memory_mb >= 256, got {self.cpus}, {self.memory_mb}"
            )
        if self.python and not self.python.startswith("/"):
            raise HarborConfigError(
                f"import option python must be an absolute path in the image, got {self.python!r}"
            )
        template = IMAGE_PRESETS.get(self.image_template, (self.image_template, ""))[0]
        if template:
            try:
                image_name(
                    SweRow(
                        instance_id="o__r-1",
                        repo="o/r",
                        patch="x",
                        problem_statement="x",
                        FAIL_TO_PASS=["t.py::t"],
                        PASS_TO_PASS=[],
                    ),
                    template,
                )
            except (KeyError, IndexError, ValueError) as e:
                raise HarborConfigError(
                    f"image template {self.image_template!r} is not usable: {e!r}; its "
                    f"fields: {sorted(_TEMPLATE_FIELDS)}"
                ) from None


_TEMPLATE_FIELDS = (
    "instance_id",
    "instance_id_lower",
    "swebench_key",
    "openhands_key",
    "repo",
    "owner",
    "name",
    "version",
    "base_commit",
)


def image_name(row: SweRow, template: str) -> str:
    owner, _, name = row.repo.partition("/")
    lower = row.instance_id.lower()
    return template.format(
        instance_id=row.instance_id,
        instance_id_lower=lower,
        swebench_key=lower.replace("__", "_1776_"),
        openhands_key=lower.replace("__", "_s_"),
        repo=row.repo,
        owner=owner,
        name=name,
        version=row.version,
        base_commit=row.base_commit,
    )


@dataclass(frozen=True)
class PytestCommand:
    """What the grader takes from a pytest command line (`parse_test_cmd`); `command()` writes it back."""

    python: str = ""  # an absolute interpreter in the image; "" = the image's python3
    src_root: str = "."  # from PYTHONPATH=: the folder under /testbed on the import path
    config: str = ""  # from -c / --config-file: the pytest config under /testbed ("" = an empty one)
    args: tuple[str, ...] = ()  # every other pytest argument

    def command(self) -> str:
        """The command line, as it runs from /testbed in the image (what `parse_test_cmd` reads back)."""
        words = [] if self.src_root == "." else [f"PYTHONPATH=/testbed/{self.src_root}"]
        words += [self.python or "python3", "-m", "pytest"]
        words += ["-c", self.config] if self.config else []
        return shlex.join([*words, *self.args])


def _under_testbed(path: str, what: str) -> str:
    rel = path.removeprefix("/testbed/") if path.startswith("/testbed/") else path
    if rel in ("/testbed", "."):
        return "."
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts or "" in parts:
        raise ValueError(f"{what} {path!r} must be a folder or file under /testbed")
    return rel


def parse_test_cmd(cmd: str) -> PytestCommand:
    """`PytestCommand` of `[PYTHONPATH=DIR] (pytest | py.test | python[3] -m pytest | /abs/python -m pytest)
    [args]`; ValueError saying why for anything else (another runner, shell operators, a pinned option)."""
    try:
        lexer = shlex.shlex(cmd, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError as e:
        raise ValueError(f"cannot parse {cmd!r}: {e}") from None
    if any(w and set(w) <= set("();<>|&") for w in words):
        raise ValueError(f"{cmd!r} has shell operators: give one pytest command")
    src_root = "."
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        if name != "PYTHONPATH" or ":" in value or not value:
            raise ValueError(
                f"{cmd!r} sets {name}={value}: the grader runs pytest in a pinned environment and "
                "takes only PYTHONPATH=<one folder under /testbed>"
            )
        src_root = _under_testbed(value, "PYTHONPATH")
    runner = words[0] if words else ""
    base = runner.rsplit("/", 1)[-1]
    python = ""
    if base in ("pytest", "py.test"):
        if "/" in runner:
            if not runner.startswith("/"):
                raise ValueError(f"{cmd!r}: the runner {runner!r} must be on PATH or an absolute path")
            python = runner.rsplit("/", 1)[0] + "/python"
        rest = words[1:]
    elif re.fullmatch(r"python(3(\.\d+)?)?", base) and words[1:3] == ["-m", "pytest"]:
        if "/" in runner and not runner.startswith("/"):
            raise ValueError(f"{cmd!r}: the interpreter {runner!r} must be on PATH or an absolute path")
        python = runner if runner.startswith("/") else ""
        rest = words[3:]
    else:
        raise ValueError(
            f"{cmd!r} does not run pytest (pytest ... | python -m pytest ...): arl's grader scores pytest "
            "node ids from its own pytest plugin; other runners (Django's runtests.py, sympy's bin/test, tox) "
            "need a log parser, which is not built yet"
        )
    config, args = "", []
    while rest:
        word = rest.pop(0)
        if word in ("-c", "--config-file"):
            if not rest:
                raise ValueError(f"{cmd!r}: {word} needs a file")
            config = _under_testbed(rest.pop(0), "the pytest config")
        elif word.startswith("--config-file="):
            config = _under_testbed(word.partition("=")[2], "the pytest config")
        elif word == "--rootdir" or word.startswith("--rootdir="):
            raise ValueError(
                f"{cmd!r}: the grader pins --rootdir=/testbed (pytest's node ids are relative to it)"
            )
        else:
            args.append(word)
    if config == ".":
        raise ValueError(f"{cmd!r}: the pytest config must be a file under /testbed")
    return PytestCommand(python=python, src_root=src_root, config=config, args=tuple(args))


@dataclass
class FilePatch:
    """One file's part of a unified diff: its added and removed lines, whether it is binary."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    binary: bool = False


_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_GIT_HEADER = re.compile(r"^diff --git a/(.+?) b/(.+)$")


def _diff_path(header: str) -> str:
    path = header[4:].split("\t")[0].strip()
    return path if path == "/dev/null" else re.sub(r"^[ab]/", "", path)


def patch_files(patch: str) -> dict[str, FilePatch]:
    """The files a unified (or git) diff changes, by path, with their added/removed lines."""
    files: dict[str, FilePatch] = {}
    current: FilePatch | None = None
    old_path = ""
    old_left = new_left = 0
    for line in patch.splitlines():
        if (old_left > 0 or new_left > 0) and current is not None:
            if line.startswith("+"):
                new_left -= 1
                current.added.append(line[1:])
            elif line.startswith("-"):
                old_left -= 1
                current.removed.append(line[1:])
            elif not line.startswith("\\"):  # context ("\ No newline at end of file" is neither)
                old_left, new_left = old_left - 1, new_left - 1
            continue
        if m := _GIT_HEADER.match(line):
            current = files.setdefault(m.group(2), FilePatch())
        elif line.startswith("--- "):
            old_path = _diff_path(line)
        elif line.startswith("+++ "):
            path = _diff_path(line)
            current = files.setdefault(old_path if path == "/dev/null" else path, FilePatch())
        elif (m := _HUNK.match(line)) and current is not None:
            old_left, new_left = int(m.group(1) or 1), int(m.group(2) or 1)
        elif line.startswith(("GIT binary patch", "Binary files ")) and current is not None:
            current.binary = True
    return files


def needed_reach_patterns(patch: dict[str, FilePatch]) -> set[str]:
    """The grader's default reach patterns that the gold patch adds to some file (it would be refused)."""
    needed: set[str] = set()
    for part in patch.values():
        needed |= grading.needed_reach_patterns("\n".join(part.added), "\n".join(part.removed))
    return needed


@dataclass
class RowTask:
    """A row checked and resolved into everything its task dir needs (`prepare_row`)."""

    row: SweRow
    number: int
    image: str
    test: PytestCommand
    test_cmd: str  # as given (row, repo map or default)
    test_files: list[str]  # the files of the listed tests: what pytest runs
    protected_tests: list[str]  # + what test_patch changes: put back by the grader like the test files
    reach_patterns: list[str] | None  # None: the grader's defaults


def prepare_row(raw: Any, number: int, where: str, options: ImportOptions) -> RowTask:
    """Check one raw row and resolve its image, test command and grading inputs; `RowError` if refused."""
    row = parse_row(raw, number, where)

    def refuse(field_name: str, reason: str) -> RowError:
        return RowError(where, number, row.instance_id, field_name, reason)

    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        for i, test_id in enumerate(getattr(row, key)):
            if not is_pytest_node_id(test_id):
                raise refuse(
                    f"{key}[{i}]",
                    f"{test_id!r} is not a pytest node id (path/to/test_file.py::name): "
                    "this repository's tests run under another runner (e.g. Django's "
                    "runtests.py, sympy's bin/test), whose results arl's grader cannot "
                    "read yet (a log parser for them is future work)",
                )
            name = test_id.partition("::")[2]
            if name.count("[") != name.count("]"):
                raise refuse(
                    f"{key}[{i}]",
                    f"{test_id!r} is cut short (unbalanced brackets: a log parser that splits "
                    "on spaces truncated a parameter id): no test has this node id, so "
                    "the task could never pass",
                )
    both = sorted(set(row.FAIL_TO_PASS) & set(row.PASS_TO_PASS))
    if both:
        raise refuse("PASS_TO_PASS", f"lists tests also in FAIL_TO_PASS: {both[:3]}")
    test_cmd = row.test_cmd or options.repo_test_cmds.get(row.repo) or options.test_cmd
    try:
        test = parse_test_cmd(test_cmd)
    except ValueError as e:
        raise refuse("test_cmd", str(e)) from None
    preset_template, preset_python = IMAGE_PRESETS.get(options.image_template, (options.image_template, ""))
    image = row.image or (image_name(row, preset_template) if preset_template else "")
    if not image:
        raise refuse(
            "image",
            "the row names no image (image / docker_image / image_name column) and no image "
            "template is given (--image-template swebench | swe-gym | '<format>')",
        )
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*", image):
        raise refuse("image", f"{image!r} is not a docker image reference")
    python = test.python or options.python or preset_python
    test = PytestCommand(python=python, src_root=test.src_root, config=test.config, args=test.args)

    gold = patch_files(row.patch)
    if not gold:
        raise refuse("patch", "names no file (not a unified diff)")
    tests = patch_files(row.test_patch) if row.test_patch.strip() else {}
    if row.test_patch.strip() and not tests:
        raise refuse("test_patch", "names no file (not a unified diff)")
    binary = sorted(p for p, part in tests.items() if part.binary)
    if binary:
        raise refuse(
            "test_patch", f"has binary changes ({binary[:3]}), which the grader's `patch -p1` cannot apply"
        )
    test_files = sorted({t.split("::", 1)[0] for t in row.FAIL_TO_PASS + row.PASS_TO_PASS})
    protected_tests = sorted(set(test_files) | set(tests))
    rules = grading.grade_change_module()
    import_roots = [""] if test.src_root == "." else ["", test.src_root]
    for path in gold:
        reason = rules.protected_reason(path, "file", False, {}, import_roots, set(protected_tests))
        if reason is not None:
            raise refuse(
                "patch",
                f"changes {path}, which the grader puts back before grading ({reason}): "
                "the oracle could never pass",
            )
    reach = grading.reach_patterns_without(needed_reach_patterns(gold))
    return RowTask(
        row=row,
        number=number,
        image=image,
        test=test,
        test_cmd=test_cmd,
        test_files=test_files,
        protected_tests=protected_tests,
        reach_patterns=reach,
    )


def _write(path: Path, text: str, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        path.chmod(mode)


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


def write_row_task(task_dir: Path, task: RowTask, options: ImportOptions) -> Path:
    """Write the task dir of a prepared row (the layout in the module docstring); returns `task_dir`."""
    row, test, q = task.row, task.test, shlex.quote
    docker = [
        f"FROM {task.image}",
        "# The repository at base_commit is the image's /testbed (a SWE-bench-format instance image); the grader",
        f"# measures the agent's change against {BASE_DIR}, a copy of it taken here (images arl exported have one).",
        (
            f"RUN test -d /testbed || {{ echo \"the repository of this task is its image's /testbed, and {task.image} "
            'has none" >&2; exit 1; }'
        ),
        (
            f"RUN [ -d {BASE_DIR} ] || {{ mkdir -p {BASE_DIR.rsplit('/', 1)[0]} && cp -a /testbed {BASE_DIR} "
            f"&& rm -rf {BASE_DIR}/.git; }}"
        ),
    ]
    if test.python:
        docker.append(f"ENV PATH={test.python.rsplit('/', 1)[0]}:$PATH")
    docker += ["WORKDIR /testbed", ""]
    _write(task_dir / "environment" / "Dockerfile", "\n".join(docker))

    tests_dir = task_dir / "tests"
    for name in PLUGIN_FILES:
        (tests_dir / "plugin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(TASK_FILES / name, tests_dir / "plugin" / name)
    test_sh = (TASK_FILES / "test.sh").read_text()
    for key, value in {
        "@SRC_ROOT@": q(test.src_root),
        "@TEST_FILES@": " ".join(q(f) for f in task.test_files),
        "@PYTEST_ARGS@": " ".join(q(a) for a in test.args),
        "@PYTEST_TIMEOUT_SEC@": str(int(options.verifier_timeout_sec - 30)),
        "@VENV_PYTHON@": q(test.python or f"{SANDBOX_VENV}/bin/python"),
        "@BASE_DIR@": BASE_DIR,
        "@PYTEST_CONFIG@": q(test.config or "auto"),
    }.items():
        test_sh = test_sh.replace(key, value)
    _write(tests_dir / "test.sh", test_sh, 0o755)
    config: dict[str, Any] = {
        "fail_to_pass": row.FAIL_TO_PASS,
        "pass_to_pass": row.PASS_TO_PASS,
        # What grade_change.py puts back as tests: the listed files and everything test_patch changes.
        "test_files": task.protected_tests,
        "src_root": test.src_root,
        "pytest_args": list(test.args),
        "pytest_config": test.config or "auto",
        "instance_id": row.instance_id,
        "repo": row.repo,
        "base_commit": row.base_commit,
        "version": row.version,
        "image": task.image,
        "test_cmd": task.test_cmd,
    }
    if task.reach_patterns is not None:
        config["reach_patterns"] = task.reach_patterns
    _write(tests_dir / "config.json", json.dumps(config, indent=1) + "\n")
    if row.test_patch.strip():
        _write(
            tests_dir / "test.patch",
            row.test_patch if row.test_patch.endswith("\n") else row.test_patch + "\n",
        )

    _write(task_dir / "solution" / "fix.patch", row.patch if row.patch.endswith("\n") else row.patch + "\n")
    _write(
        task_dir / "solution" / "solve.sh",
        """#!/bin/bash
# The oracle: the row's gold patch, applied in the testbed.
set -e
SOLUTION_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "${ARL_SWE_TESTBED:-/testbed}"
git apply --whitespace=nowarn "$SOLUTION_DIR/fix.patch" 2>/dev/null \\
  || patch -p1 --forward --batch < "$SOLUTION_DIR/fix.patch"
""",
        0o755,
    )
    _write(
        task_dir / "instruction.md",
        row.problem_statement if row.problem_statement.endswith("\n") else row.problem_statement + "\n",
    )
    metadata = {
        "source": "swebench-row",
        "instance_id": row.instance_id,
        "repo": row.repo,
        "base_commit": row.base_commit,
        "version": row.version,
        "image": task.image,
        "category": "swe",
        "arl_grading": GRADING,
    }
    _write(
        task_dir / "task.toml",
        "\n".join(
            [
                'schema_version = "1.4"',
                'artifacts = ["/testbed"]',
                "",
                "[metadata]",
                *(f"{k} = {_toml_str(v)}" for k, v in metadata.items()),
                "",
                # Graded in a separate environment from the same image: the agent's /testbed is carried there
                # after every process of the agent's environment ended (Harbor's separate verifier mode).
                "[verifier]",
                f"timeout_sec = {float(options.verifier_timeout_sec)}",
                'environment_mode = "separate"',
                "",
                "[agent]",
                f"timeout_sec = {float(options.agent_timeout_sec)}",
                "",
                "[environment]",
                f"build_timeout_sec = {float(options.build_timeout_sec)}",
                f"cpus = {options.cpus}",
                f"memory_mb = {options.memory_mb}",
                'workdir = "/testbed"',
                'network_mode = "no-network"',
                "",
            ]
        ),
    )
    return task_dir


@dataclass
class ImportResult:
    """What `convert_rows` made: the task ids (in row order) and the refused rows."""

    out: Path
    rows: int
    tasks: list[str]
    refused: list[RowError]


def _grader_digest() -> str:
    digest = hashlib.sha256()
    for name in ("test.sh", *PLUGIN_FILES):
        digest.update((TASK_FILES / name).read_bytes())
    return digest.hexdigest()


def import_digest(rows_path: Path, options: ImportOptions) -> str:
    """What an import's content depends on: the rows, the options (not `out`/`rows`), the grader, the format."""
    digest = hashlib.sha256()
    with open(rows_path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    settings = msgspec.structs.replace(options, out="", rows="")
    digest.update(msgspec.json.encode(settings) + f"|{IMPORT_FORMAT}|{GRADING}|{_grader_digest()}".encode())
    return digest.hexdigest()


def convert_rows(
    rows_path: str | Path,
    out: str | Path,
    options: ImportOptions | None = None,
    *,
    log: Callable[[str], None] | None = None,
) -> ImportResult:
    """Every row of `rows_path` as a task dir under `out` (replaced whole; it must be empty, absent or an
    earlier import), plus `manifest.jsonl` (one row per task), `refused.jsonl` (with `skip_invalid`) and
    `import.json` (what it was made from). Raises `HarborConfigError` listing the refused rows otherwise."""
    options = options or ImportOptions()
    options.check()
    rows_path, out = Path(rows_path), Path(out)
    if out.exists() and any(out.iterdir()) and not (out / _MARKER).is_file():
        raise HarborConfigError(
            f"{out} exists and is not an import of SWE-bench-format rows: not replacing it"
        )
    where = str(rows_path)
    prepared: list[RowTask] = []
    refused: list[RowError] = []
    seen: dict[str, int] = {}
    raw_rows = read_rows(rows_path)
    for number, raw in enumerate(raw_rows, 1):
        try:
            task = prepare_row(raw, number, where, options)
            if task.row.instance_id in seen:
                raise RowError(
                    where,
                    number,
                    task.row.instance_id,
                    "instance_id",
                    f"repeats row {seen[task.row.instance_id]}",
                )
        except RowError as e:
            refused.append(e)
            continue
        seen[task.row.instance_id] = number
        prepared.append(task)
    if refused and not options.skip_invalid:
        listed = "\n  ".join(str(e) for e in refused[:20])
        more = f"\n  ... and {len(refused) - 20} more" if len(refused) > 20 else ""
        raise HarborConfigError(
            f"{len(refused)} of {len(raw_rows)} rows cannot become tasks:\n  {listed}{more}\n"
            "(skip_invalid / --skip-invalid imports the others and lists these in refused.jsonl)"
        )
    if not prepared:
        raise HarborConfigError(
            f"{rows_path}: no row became a task"
            + (f" ({len(refused)} refused; first: {refused[0]})" if refused else " (no rows)")
        )
    # Written next to `out` and swapped in whole: a half-written import is never used.
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    manifest = []
    for task in prepared:
        write_row_task(tmp / task.row.instance_id, task, options)
        manifest.append(
            {
                "id": task.row.instance_id,
                "instance_id": task.row.instance_id,
                "repo": task.row.repo,
                "base_commit": task.row.base_commit,
                "row": task.number,
                "test_cmd": task.test_cmd,
                "fail_to_pass": task.row.FAIL_TO_PASS,
                "pass_to_pass": task.row.PASS_TO_PASS,
                "test_files": task.test_files,
                "image": None,
                "image_build_s": None,
                "base_image": task.image,
            }
        )
    (tmp / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in manifest))
    if refused:
        (tmp / "refused.jsonl").write_text("".join(json.dumps(e.to_json()) + "\n" for e in refused))
    marker = {
        "rows": str(rows_path.resolve()),
        "digest": import_digest(rows_path, options),
        "options": msgspec.to_builtins(options),
        "rows_read": len(raw_rows),
        "tasks": len(prepared),
        "refused": len(refused),
    }
    (tmp / _MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    if log is not None:
        for e in refused:
            log(f"refused: {e}")
        log(
            f"{len(prepared)} tasks from {len(raw_rows)} rows of {rows_path} in {out}"
            + (f"; {len(refused)} refused (refused.jsonl)" if refused else "")
        )
    return ImportResult(
        out=out, rows=len(raw_rows), tasks=[t.row.instance_id for t in prepared], refused=refused
    )


def load_import_spec(spec: str | Path) -> tuple[Path, ImportOptions, Path | None]:
    """(rows file, options, explicit out or None) of a `swebench:` source: a rows file, or an import .toml
    whose keys are `ImportOptions`' (paths relative to the .toml's folder)."""
    path = Path(spec).expanduser()
    if path.suffix != ".toml":
        return path, ImportOptions(), None
    if not path.is_file():
        raise HarborConfigError(f"{path}: no such import file")
    try:
        options = msgspec.convert(tomllib.loads(path.read_text()), ImportOptions)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as e:
        raise HarborConfigError(f"{path}: not a valid SWE-bench-format import file: {e}") from None
    if not options.rows:
        raise HarborConfigError(f"{path}: `rows` (the rows file) is required")
    out = (path.parent / Path(options.out).expanduser()) if options.out else None
    return path.parent / Path(options.rows).expanduser(), options, out


def rows_cache_root() -> Path:
    """Where `swebench:` sources are converted to (`$ARL_SWE_ROWS_CACHE`, else ~/.cache/arl/swe-rows)."""
    root = os.environ.get(SOURCE_ROWS_CACHE_ENV)
    if root:
        return Path(root).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "arl" / "swe-rows"


def imported_set(spec: str | Path, *, log: Callable[[str], None] | None = None) -> Path:
    """The task folder of a `swebench:<spec>` source, converted once: reused while the rows, options and
    grader are unchanged (`import.json`'s digest), converted again otherwise."""
    import filelock

    rows_path, options, out = load_import_spec(spec)
    if not rows_path.is_file():
        raise HarborConfigError(f"swebench:{spec}: no such rows file {rows_path}")
    options.check()
    digest = import_digest(rows_path, options)
    out = out or rows_cache_root() / f"{rows_path.stem}-{digest[:16]}"
    out.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(out.parent / f".{out.name}.lock"), timeout=1800):
        marker = out / _MARKER
        if marker.is_file() and json.loads(marker.read_text()).get("digest") == digest:
            return out
        convert_rows(rows_path, out, options, log=log or (lambda msg: print(msg, file=sys.stderr)))
    return out


def options_from_args(
    spec: str, *, image_template: str | None, python: str | None, test_cmds: list[str], skip_invalid: bool
) -> tuple[Path, ImportOptions]:
    """`convert`'s flags over a rows file or an import .toml: (rows file, options)."""
    rows_path, options, _ = load_import_spec(spec)
    changes: dict[str, Any] = {}
    if image_template is not None:
        changes["image_template"] = image_template
    if python is not None:
        changes["python"] = python
    if skip_invalid:
        changes["skip_invalid"] = True
    repo_cmds = dict(options.repo_test_cmds)
    for item in test_cmds:
        repo, sep, cmd = item.partition("=")
        # "OWNER/REPO=CMD" maps a repository; anything else (a command, which may hold "=" itself) is the default.
        if sep and re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
            repo_cmds[repo] = cmd
        else:
            changes["test_cmd"] = item
    changes["repo_test_cmds"] = repo_cmds
    return rows_path, msgspec.structs.replace(options, **changes)
