"""The round trip in docker: arl's SWE tasks → SWE-bench-format rows + images → tasks → the same grading.

A set of one real task (`arl.harbor.testing.write_swe_task`, the builder's own writer) is exported with its
image built (`python -m arl.harbor.swe export --build`), the rows are converted back (`convert`), and the
imported task — `FROM` the exported image, graded by arl's grader from the row's lists — passes the agent
checks through arl's shell agent in Harbor's docker environment: oracle 1.0, nop 0.0, edit-tests below 1.0
(the three trials at once). The whole built set is checked the same way by hand (the swe README's "SWE-bench-
format data"); images saved with `docker save` are checked here by their archive's tags.
"""

from __future__ import annotations

import asyncio
import json
import tarfile
from pathlib import Path

import pytest

from arl.harbor.agents.checks import run_check
from arl.harbor.swe.export_rows import export_set
from arl.harbor.swe.import_rows import convert_rows

from .test_swe_agents import _assert_check, docker_ready, tokenizer  # noqa: F401 - the fixtures
from .test_swe_rows import write_swe_set


@pytest.fixture(scope="module")
def round_trip(docker_ready, tmp_path_factory):  # noqa: F811 - the imported fixture
    """(the set, its exported rows, the imported task dir): export with the image built, convert back."""
    root = tmp_path_factory.mktemp("swe-round-trip")
    task_set = write_swe_set(root / "set")
    rows = asyncio.run(export_set(task_set, root / "rows.jsonl", build=True, log=lambda _: None))
    result = convert_rows(root / "rows.jsonl", root / "imported")
    assert result.tasks == ["tinycalc__clamp"] and not result.refused
    return task_set, rows, root / "imported" / "tinycalc__clamp"


async def test_round_trip_checks_hold_in_docker(round_trip, tmp_path, tokenizer):  # noqa: F811
    _, rows, task = round_trip
    assert (task / "environment" / "Dockerfile").read_text().startswith(f"FROM {rows[0]['image']}\n")
    scripts = ("oracle", "nop", "edit-tests")
    results = await asyncio.gather(
        *(
            run_check(
                task,
                agent="shell",
                script=s,
                env="docker",
                tokenizer=tokenizer,
                trials_dir=tmp_path / s,
                trial_timeout_sec=300,
            )
            for s in scripts
        )
    )
    for script, result in zip(scripts, results, strict=True):
        _assert_check(result, script)
        reward_dir = Path(result.trial_dir) / "verifier"
        assert json.loads((reward_dir / "reward.json").read_text())["reward"] == result.reward
    # The grader measured the change against the exported image's own base copy.
    change = json.loads((Path(results[0].trial_dir) / "verifier" / "change.json").read_text())
    assert change["kept"] == ["tinycalc/__init__.py"] and not change["refused"]


async def test_export_saves_the_images_with_docker_save(round_trip, tmp_path):
    task_set, _, _ = round_trip
    saved = await export_set(
        task_set, tmp_path / "rows.jsonl", images_dir=tmp_path / "images", log=lambda _: None
    )
    with tarfile.open(tmp_path / "images" / "images.tar") as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    assert {t for entry in manifest for t in entry["RepoTags"]} == {f"{saved[0]['image']}:latest"}
    listed = json.loads((tmp_path / "images" / "images.json").read_text())
    assert listed == {"archive": "images.tar", "images": {"tinycalc__clamp": saved[0]["image"]}}
