"""arl's SWE tasks → SWE-bench-format rows (and their images), for another framework or SWE-bench's tools.

    python -m arl.harbor.swe export <set> --out rows.jsonl [--style swe-bench|swe-gym] [--build]
        [--images-dir DIR]

One row per task of a built set (`manifest.jsonl` order, else the task dirs by name), in the published
shape of SWE-bench Verified (`--style swe-bench`, the default: FAIL_TO_PASS / PASS_TO_PASS JSON-encoded
strings) or SWE-Gym (`--style swe-gym`: lists), plus two columns:
- `image`: the task's image, `hb__<environment content hash>` (the name `arl.harbor.docker_environment`
  builds and finds it under): `/testbed` is the repository at `base_commit`, `/arl/base` the grader's
  base copy, Debian's python3 with pytest and the test dependencies;
- `test_cmd`: the pytest command that runs the task's tests from `/testbed` in that image
  (`PYTHONPATH=/testbed/<src root> python3 -m pytest [-c <config>] [args]`), test node ids appended.
The other columns: `instance_id` = the task id; `repo` = `pypi/<package>` (the repository is the package's
sdist from PyPI, `version` its version); `base_commit` = the commit of the task's testbed (a git repository
of one commit, the bug in place: `git -C /testbed rev-parse HEAD` in the image prints it);
`environment_setup_commit` = `base_commit`; `patch` = the oracle's fix (`solution/fix.patch`); `test_patch`
= "" (the tests are in the repository already), or a release task's `tests/test.patch`; `problem_statement`
= `instruction.md`; `hints_text` = ""; `created_at` = when the task dir was written; `difficulty` = "" (not
estimated).

`--build` builds each task's image in the local engine (`build_task_image`, offline); `--images-dir DIR`
also saves them with `docker save` into `DIR/images.tar` (one archive: the tasks share the base image's
layers; `docker load -i images.tar` restores every tag) and lists them in `DIR/images.json`.
`python -m arl.harbor.swe convert rows.jsonl --out <dir>` turns the rows back into tasks (the round trip).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from arl.harbor.errors import HarborConfigError
from arl.harbor.swe.import_rows import PytestCommand
from arl.harbor.swe.rows import SweBenchVerifiedRow, SweGymRow
from arl.harbor.swe.verify import task_dirs

STYLES = ("swe-bench", "swe-gym")
REPO_PREFIX = "pypi/"


def set_task_dirs(task_set: Path) -> list[Path]:
    """The task dirs of a set: in `manifest.jsonl` order when it has one, else every dir with a task.toml."""
    manifest = task_set / "manifest.jsonl"
    if manifest.is_file():
        ids = [json.loads(line)["id"] for line in manifest.read_text().splitlines() if line.strip()]
        missing = [i for i in ids if not (task_set / i / "task.toml").is_file()]
        if missing:
            raise HarborConfigError(f"{manifest} lists tasks with no task dir: {missing[:5]}")
        return [task_set / i for i in ids]
    dirs = task_dirs(task_set)
    if not dirs:
        raise HarborConfigError(f"{task_set}: no task dirs (folders with task.toml)")
    return dirs


def _testbed_commit(testbed: Path) -> str:
    proc = subprocess.run(
        ["git", "-C", str(testbed), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:
        raise HarborConfigError(f"{testbed} is not a git repository of one commit: {proc.stderr.strip()}")
    return proc.stdout.strip()


def task_row(task_dir: Path, image: str, *, style: str = "swe-bench") -> dict[str, Any]:
    """The SWE-bench-format row of one task dir written by arl's SWE builder (see the module docstring)."""
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; choose one of {STYLES}")
    files = {name: task_dir / name for name in ("tests/config.json", "solution/fix.patch", "instruction.md")}
    missing = [name for name, path in files.items() if not path.is_file()]
    if missing or not (task_dir / "environment" / "testbed").is_dir():
        raise HarborConfigError(
            f"{task_dir} is not a task of arl's SWE builder (missing {missing or ['environment/testbed']})"
        )
    config = json.loads(files["tests/config.json"].read_text())
    commit = _testbed_commit(task_dir / "environment" / "testbed")
    created = datetime.fromtimestamp((task_dir / "task.toml").stat().st_mtime, UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    test = PytestCommand(
        src_root=config.get("src_root") or ".",
        config=config.get("pytest_config") or "",
        args=tuple(config.get("pytest_args") or ()),
    )
    test_patch = task_dir / "tests" / "test.patch"  # a release task's new tests; built tasks have none
    common = {
        "instance_id": task_dir.name,
        "repo": REPO_PREFIX + config["package"],
        "base_commit": commit,
        "patch": files["solution/fix.patch"].read_text(),
        "test_patch": test_patch.read_text() if test_patch.is_file() else "",
        "problem_statement": files["instruction.md"].read_text(),
        "hints_text": "",
        "created_at": created,
        "version": config["version"],
    }
    f2p, p2p = list(config["fail_to_pass"]), list(config["pass_to_pass"])
    if style == "swe-bench":
        row: msgspec.Struct = SweBenchVerifiedRow(
            **common,
            FAIL_TO_PASS=json.dumps(f2p),
            PASS_TO_PASS=json.dumps(p2p),
            environment_setup_commit=commit,
            difficulty="",
        )
    else:
        row = SweGymRow(**common, FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p)
    return {**msgspec.to_builtins(row), "image": image, "test_cmd": test.command()}


def _docker(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)


async def export_set(
    task_set: str | Path,
    out: str | Path,
    *,
    style: str = "swe-bench",
    build: bool = False,
    images_dir: str | Path | None = None,
    build_timeout_sec: float = 1800.0,
    save_timeout_sec: float = 3600.0,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Write the set's rows to `out` (.jsonl); build the images (`build`, or when `images_dir` is given) and
    save them to `images_dir/images.tar`. Returns the rows."""
    from arl.harbor.docker_environment import DockerBuildError, build_task_image, task_image_name

    task_set, out = Path(task_set), Path(out)
    if out.suffix != ".jsonl":
        raise HarborConfigError(f"{out}: the rows are written as .jsonl")
    dirs = set_task_dirs(task_set)
    build = build or images_dir is not None
    images: list[str] = []
    for i, task_dir in enumerate(dirs):
        env_dir = task_dir / "environment"
        if build:
            started = time.monotonic()
            try:
                image, seconds = await build_task_image(
                    env_dir, network="none", timeout_sec=build_timeout_sec
                )
            except DockerBuildError as e:
                raise HarborConfigError(f"task {task_dir.name}: {e}") from None
            log(
                f"[{i + 1}/{len(dirs)}] {task_dir.name}: {image} "
                + (
                    f"built in {seconds:.1f}s"
                    if seconds is not None
                    else f"exists ({time.monotonic() - started:.1f}s)"
                )
            )
        else:
            image = task_image_name(env_dir)
        images.append(image)
    rows = [task_row(d, image, style=style) for d, image in zip(dirs, images, strict=True)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    log(
        f"{len(rows)} rows ({style}) in {out}"
        + (
            ""
            if build
            else "; their images are not built here yet (--build, or python -m arl.harbor.swe images <set>)"
        )
    )
    if images_dir is not None:
        images_dir = Path(images_dir)
        images_dir.mkdir(parents=True, exist_ok=True)
        archive = images_dir / "images.tar"
        started = time.monotonic()
        unique = list(dict.fromkeys(images))
        proc = await asyncio.to_thread(_docker, "save", "-o", str(archive), *unique, timeout=save_timeout_sec)
        if proc.returncode != 0:
            raise HarborConfigError(
                f"docker save of {len(unique)} images failed: {proc.stderr.strip()[-500:]}"
            )
        (images_dir / "images.json").write_text(
            json.dumps(
                {"archive": archive.name, "images": {r["instance_id"]: r["image"] for r in rows}}, indent=1
            )
            + "\n"
        )
        log(
            f"{len(unique)} images saved to {archive} ({archive.stat().st_size / 1e6:.0f} MB, "
            f"{time.monotonic() - started:.1f}s); restore with: docker load -i {archive}"
        )
    return rows
