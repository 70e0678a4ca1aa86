"""Build every task image of an SWE task set once, before training, and record it in the manifest.

    uv run python -m arl.harbor.swe.images <set>            # builds what is missing, in order
    uv run python -m arl.harbor.swe.images <set> --force    # rebuilds every image (docker build --no-cache)

Each task's `environment/` is built into `hb__<environment content hash>`, the tag under which
`arl.harbor.docker_environment.DockerEnvironment` finds it at trial start (so no trial builds, and every
trial of a task starts from the same image); `image` and `image_build_s` (seconds; kept from the earlier
build when the image already existed) are written back into `<set>/manifest.jsonl`. Needs a running
dockerd (`eval "$(scripts/docker/start.sh)"`) and the base image (`scripts/docker/build_base_image.sh`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from arl.harbor.docker_environment import DockerBuildError, build_task_image


class ImagesError(RuntimeError):
    """The task set or the Docker engine is not usable for building images."""


def _check_docker() -> None:
    try:
        proc = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ImagesError(
            f'docker does not answer ({e}); start it: eval "$(scripts/docker/start.sh)"'
        ) from None
    if proc.returncode != 0:
        host = os.environ.get("DOCKER_HOST", "the default socket")
        raise ImagesError(
            f"dockerd does not answer on {host}: {proc.stderr.strip()[-300:]}; "
            'start it with: scripts/docker/install.sh && eval "$(scripts/docker/start.sh)"'
        )


def _read_manifest(task_set: Path) -> list[dict[str, Any]]:
    manifest = task_set / "manifest.jsonl"
    if not manifest.is_file():
        raise ImagesError(
            f"{manifest} does not exist (build the set: python -m arl.harbor.swe build --out {task_set})"
        )
    return [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]


def _write_manifest(task_set: Path, rows: list[dict[str, Any]]) -> None:
    manifest = task_set / "manifest.jsonl"
    tmp = manifest.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.replace(manifest)


async def build_set_images(
    task_set: Path, *, force: bool = False, network: str | None = "none", timeout_sec: float = 1800.0
) -> list[dict[str, Any]]:
    """Builds (or finds) each task's image; returns the updated manifest rows (also written to disk)."""
    task_set = Path(task_set)
    rows = _read_manifest(task_set)
    for i, row in enumerate(rows):
        env_dir = task_set / str(row["id"]) / "environment"
        try:
            image, seconds = await build_task_image(
                env_dir, force=force, network=network, timeout_sec=timeout_sec
            )
        except DockerBuildError as e:
            raise ImagesError(f"task {row['id']}: {e}") from None
        if seconds is not None or row.get("image") != image:
            row["image_build_s"] = round(seconds, 3) if seconds is not None else row.get("image_build_s")
        row["image"] = image
        print(
            f"[{i + 1}/{len(rows)}] {row['id']}: {image} "
            + (f"built in {seconds:.1f}s" if seconds is not None else "exists"),
            flush=True,
        )
        _write_manifest(task_set, rows)  # progress survives an interruption
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m arl.harbor.swe.images", description=__doc__.split("\n")[0]
    )
    parser.add_argument("task_set", type=Path, help="the task set folder (holding manifest.jsonl)")
    parser.add_argument("--force", action="store_true", help="rebuild images that exist")
    parser.add_argument(
        "--network",
        default="none",
        help="docker build --network (default none: a task image must build offline)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one image build may take")
    args = parser.parse_args(argv)
    try:
        _check_docker()
        started = time.monotonic()
        rows = asyncio.run(
            build_set_images(
                args.task_set, force=args.force, network=args.network or None, timeout_sec=args.timeout
            )
        )
    except ImagesError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    built = [r["image_build_s"] for r in rows if r.get("image_build_s") is not None]
    mean = sum(built) / len(built) if built else 0.0
    print(
        f"{len(rows)} task images ready in {time.monotonic() - started:.1f}s (mean recorded build {mean:.1f}s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
