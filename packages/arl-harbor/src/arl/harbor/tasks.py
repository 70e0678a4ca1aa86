"""Harbor task sets as data: `harbor:<folder of task dirs | task dir | dataset file>` → arl `Task` rows;
`swebench:<SWE-bench-format rows | import .toml>` → the same, through `arl.harbor.swe.import_rows`.

A source names a built-in set (`harbor:builtin:small`: four one-line file tasks), a folder (one task dir
holding `task.toml`, or a folder of such dirs, sorted by name) or a dataset file (`.jsonl`, one
object per line, or `.json`, a list of objects). Each row is a task reference in Harbor's own terms:
  {"path": "tasks/fix-bug"}                          a local task dir (relative to the file's folder)
  {"name": "org/task", "ref": "sha256:<digest>"}     a registry package, read from Harbor's local cache
  {"git_url": "...", "git_commit_id": "...", "path": "tasks/x"}   a git task, read from the cache
plus optional "id" and "metadata". Nothing is downloaded (no network here): a reference that is not
in the local cache (`cache_dir`, default Harbor's `~/.cache/harbor/tasks`) is an error naming it.

`swebench:<rows.jsonl|.json|.parquet>` (SWE-bench, SWE-Gym, SWE-smith, ... rows) or `swebench:<import.toml>`
(the rows file plus import options: image template, test commands, ...) converts the rows once into
ordinary task dirs graded like arl's own SWE tasks (cached by content; `arl.harbor.swe.import_rows`).

`validate_task` checks one task dir the way a trial would need it (task.toml parses, instruction.md,
tests/test.sh) and reports its timeouts and limits; `task_timeout_sec` is the longest one attempt of
it can take, from which the app derives its trial, drain and step timeouts.

Command line: `python -m arl.harbor.tasks {list,validate} <source>` (exit 1 when a task is invalid).
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from arl.harbor.errors import HarborConfigError
from arl.rollout.types import Task

SOURCE_PREFIX = "harbor:"
SWEBENCH_PREFIX = "swebench:"
# Every data.source prefix whose tasks are Harbor trials.
SOURCE_PREFIXES = (SOURCE_PREFIX, SWEBENCH_PREFIX)
# Harbor's defaults when task.toml leaves a timeout out (harbor.models.task.config, 0.25).
DEFAULT_BUILD_TIMEOUT_SEC = 600.0
DEFAULT_AGENT_TIMEOUT_SEC = 600.0
DEFAULT_VERIFIER_TIMEOUT_SEC = 600.0
# Agent setup (Harbor's per-agent DEFAULT_SETUP_TIMEOUT_SEC; 360 s for installed agents) and teardown.
AGENT_SETUP_ALLOWANCE_SEC = 360.0
TEARDOWN_ALLOWANCE_SEC = 60.0


class TaskInfo(msgspec.Struct, kw_only=True):
    """One task dir as `validate_task` sees it."""

    id: str
    path: str
    ok: bool
    problems: list[str] = msgspec.field(default_factory=list)
    build_timeout_sec: float = DEFAULT_BUILD_TIMEOUT_SEC
    agent_timeout_sec: float = DEFAULT_AGENT_TIMEOUT_SEC
    verifier_timeout_sec: float = DEFAULT_VERIFIER_TIMEOUT_SEC
    cpus: float | None = None
    memory_mb: int | None = None
    network_mode: str | None = None
    verifier_mode: str | None = None
    has_solution: bool = False


def _number(table: dict[str, Any], key: str, default: float, where: str, problems: list[str]) -> float:
    value = table.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        problems.append(f"{where}.{key} must be a positive number, got {value!r}")
        return default
    return float(value)


def validate_task(path: Path, task_id: str | None = None) -> TaskInfo:
    """Check a task dir without running it; `ok` is False with every problem listed."""
    path = Path(path)
    problems: list[str] = []
    info = TaskInfo(id=task_id or path.name, path=str(path), ok=False)
    if not path.is_dir():
        info.problems = [f"{path} is not a directory"]
        return info
    toml_path = path / "task.toml"
    config: dict[str, Any] = {}
    if not toml_path.is_file():
        problems.append("no task.toml")
    else:
        try:
            config = tomllib.loads(toml_path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            problems.append(f"task.toml does not parse: {e}")
    env = config.get("environment", {}) or {}
    agent = config.get("agent", {}) or {}
    verifier = config.get("verifier", {}) or {}
    info.build_timeout_sec = _number(
        env, "build_timeout_sec", DEFAULT_BUILD_TIMEOUT_SEC, "environment", problems
    )
    info.agent_timeout_sec = _number(agent, "timeout_sec", DEFAULT_AGENT_TIMEOUT_SEC, "agent", problems)
    info.verifier_timeout_sec = _number(
        verifier, "timeout_sec", DEFAULT_VERIFIER_TIMEOUT_SEC, "verifier", problems
    )
    info.cpus = env.get("cpus")
    info.memory_mb = env.get("memory_mb")
    info.network_mode = env.get("network_mode")
    info.verifier_mode = verifier.get("environment_mode")
    if not (path / "instruction.md").is_file():
        problems.append("no instruction.md")
    if not (path / "tests" / "test.sh").is_file():
        problems.append("no tests/test.sh")
    info.has_solution = (path / "solution" / "solve.sh").is_file()
    info.problems = problems
    info.ok = not problems
    return info


def task_timeout_sec(
    info: TaskInfo, *, multiplier: float = 1.0, agent_timeout_sec: float | None = None
) -> float:
    """The longest one attempt of this task may take: every phase's timeout, times `multiplier`."""
    agent = agent_timeout_sec if agent_timeout_sec is not None else info.agent_timeout_sec
    phases = info.build_timeout_sec + AGENT_SETUP_ALLOWANCE_SEC + agent + info.verifier_timeout_sec
    return phases * multiplier + TEARDOWN_ALLOWANCE_SEC


def _cached_path(row: dict[str, Any], cache_dir: Path | None, where: str) -> Path:
    """The local path of a Harbor name/ref or git_url reference (never downloads)."""
    try:
        from harbor.models.trial.config import TaskConfig
    except ImportError as e:  # pragma: no cover - harbor is a dependency
        raise HarborConfigError(f"{where}: resolving {row} needs the harbor package") from e
    fields = {k: row[k] for k in ("path", "git_url", "git_commit_id", "name", "ref") if k in row}
    try:
        task_id = TaskConfig(**fields).get_task_id()
        local = task_id.get_local_path()
    except ValueError as e:
        raise HarborConfigError(f"{where}: cannot resolve task reference {fields} offline: {e}") from None
    if cache_dir is not None:  # the same layout under another cache root
        from harbor.constants import TASK_CACHE_DIR

        local = Path(cache_dir) / local.relative_to(TASK_CACHE_DIR)
    if not local.is_dir():
        raise HarborConfigError(
            f"{where}: task {fields} is not in the local cache (expected {local}); "
            "download it where there is network (`harbor` CLI) and copy the cache here"
        )
    return local


def json_lines(path: Path, text: str) -> list[Any]:
    """One JSON value per non-blank line of `text` (read from `path`); an invalid line is an error naming it."""
    rows = []
    for i, line in enumerate(text.splitlines()):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise HarborConfigError(f"{path} line {i + 1}: invalid JSON ({e})") from None
    return rows


def _rows(path: Path) -> list[dict[str, Any]]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        return json_lines(path, text)
    if path.suffix == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise HarborConfigError(f"{path}: invalid JSON ({e})") from None
        if not isinstance(rows, list):
            raise HarborConfigError(f"{path}: expected a JSON list of task references")
        return rows
    raise HarborConfigError(f"{path}: a Harbor task set file must be .jsonl or .json, got {path.suffix!r}")


def resolve_source(
    source: str, *, cache_dir: str | Path | None = None
) -> list[tuple[str, Path, dict[str, Any]]]:
    """(id, task dir, metadata) per task of `harbor:<...>` (the prefix is optional) or `swebench:<...>`."""
    spec = source.removeprefix(SOURCE_PREFIX)
    if source.startswith(SWEBENCH_PREFIX):
        from arl.harbor.swe.import_rows import imported_set

        spec = str(imported_set(source.removeprefix(SWEBENCH_PREFIX)))
    elif spec.startswith("builtin:"):
        spec = str(builtin_task_set(spec.removeprefix("builtin:")))
    root = Path(spec).expanduser()
    cache = Path(cache_dir) if cache_dir else None
    if root.is_dir():
        if (root / "task.toml").is_file():
            return [(root.name, root.resolve(), {})]
        dirs = sorted(d for d in root.iterdir() if d.is_dir() and (d / "task.toml").is_file())
        if not dirs:
            raise HarborConfigError(f"{source}: no task dirs (folders with task.toml) in {root}")
        return [(d.name, d.resolve(), {}) for d in dirs]
    if not root.is_file():
        raise HarborConfigError(f"{source}: {root} is neither a task folder nor a task set file")
    out = []
    for i, row in enumerate(_rows(root)):
        where = f"{root} row {i}"
        if not isinstance(row, dict):
            raise HarborConfigError(f"{where}: expected an object, got {type(row).__name__}")
        if "name" in row or "git_url" in row:
            path = _cached_path(row, cache, where)
        elif "path" in row:
            path = Path(row["path"]).expanduser()
            path = (path if path.is_absolute() else root.parent / path).resolve()
        else:
            raise HarborConfigError(f"{where}: needs 'path', 'name' (+ 'ref') or 'git_url' (+ 'path')")
        metadata = row.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise HarborConfigError(f"{where}: 'metadata' must be an object")
        out.append((str(row.get("id") or path.name), path, metadata))
    if not out:
        raise HarborConfigError(f"{source}: the task set is empty")
    return out


# Built-in sets of tiny tasks that run in the local sandbox in about a second (for smoke runs and CI).
_BUILTIN_SETS = {
    "small": [
        ("hello", "Hello, world!"),
        ("goodbye", "Goodbye, world!"),
        ("digits", "0123456789"),
        ("arl", "fully asynchronous RL"),
    ]
}


def builtin_task_set(name: str) -> Path:
    """Writes built-in set `name` (`harbor:builtin:small`) under the temp dir once; returns its folder."""
    import tempfile

    from arl.harbor.testing import write_hello_task

    if name not in _BUILTIN_SETS:
        raise HarborConfigError(
            f"unknown built-in Harbor task set {name!r}; available: {sorted(_BUILTIN_SETS)}"
        )
    root = Path(tempfile.gettempdir()) / f"arl-harbor-builtin-{name}-v1"
    if not (root / ".complete").is_file():
        for task, line in _BUILTIN_SETS[name]:
            write_hello_task(
                root,
                task,
                instruction=f"Create a file /app/hello.txt whose only content is the line: {line}\n",
                test_script=(
                    "#!/bin/bash\n"
                    f'if [ "$(cat /app/hello.txt 2>/dev/null)" = "{line}" ]; then echo 1; else echo 0; fi'
                    " > /logs/verifier/reward.txt\n"
                ),
                solution_script=f"#!/bin/bash\necho '{line}' > /app/hello.txt\n",
                agent_timeout_sec=120.0,
            )
        (root / ".complete").write_text("")
    return root


def load_harbor_tasks(
    source: str, *, cache_dir: str | Path | None = None, task_path_key: str = "harbor_task_path"
) -> list[Task]:
    """The source's tasks as arl `Task`s for agent loop "harbor"; raises on the first invalid task."""
    tasks = []
    for task_id, path, metadata in resolve_source(source, cache_dir=cache_dir):
        info = validate_task(path, task_id)
        if not info.ok:
            raise HarborConfigError(
                f"{source}: task {task_id} ({path}) is invalid: {'; '.join(info.problems)}"
            )
        instruction = (path / "instruction.md").read_text(errors="replace")
        tasks.append(
            Task(
                id=task_id,
                messages=[{"role": "user", "content": instruction}],
                agent="harbor",
                metadata={**metadata, task_path_key: str(path)},
            )
        )
    return tasks


def describe_source(source: str, *, cache_dir: str | Path | None = None) -> list[TaskInfo]:
    """`validate_task` for every task of the source (the listing and validation command's data)."""
    return [validate_task(path, task_id) for task_id, path, _ in resolve_source(source, cache_dir=cache_dir)]


def main(argv: list[str] | None = None) -> int:
    """`python -m arl.harbor.tasks {list,validate} <source> [--cache-dir DIR] [--json]`."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m arl.harbor.tasks", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["list", "validate"])
    parser.add_argument(
        "source",
        help="harbor:<folder | task dir | .jsonl/.json task set> (prefix optional) "
        "or swebench:<rows .jsonl/.json/.parquet | import .toml>",
    )
    parser.add_argument(
        "--cache-dir", default=None, help="Harbor's task cache (default ~/.cache/harbor/tasks)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per task")
    args = parser.parse_args(argv)
    try:
        infos = describe_source(args.source, cache_dir=args.cache_dir)
    except HarborConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for info in infos:
        if args.json:
            print(msgspec.json.encode(info).decode())
        else:
            status = "ok" if info.ok else "INVALID: " + "; ".join(info.problems)
            print(
                f"{info.id:32s} agent {info.agent_timeout_sec:>6.0f}s verifier {info.verifier_timeout_sec:>5.0f}s "
                f"build {info.build_timeout_sec:>5.0f}s cpus {info.cpus or '-'} mem {info.memory_mb or '-'}MB "
                f"{'solution ' if info.has_solution else ''}{status}  {info.path}"
            )
    bad = [i for i in infos if not i.ok]
    if args.command == "validate":
        print(f"{len(infos) - len(bad)}/{len(infos)} tasks valid", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
