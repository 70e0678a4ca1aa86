"""Every package builds, validates and imports alone: scripts/release_check.py (see RELEASING.md).

The light packages (arl-queue, arl-proxy) must in addition install and import without torch, vllm or
ray; the others with their declared dependencies only (an undeclared import fails the check, inside a
function too). The quick tests run the check's probe on a small package of their own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "release_check.py"


def _release_check():
    spec = importlib.util.spec_from_file_location("release_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_probe_resolves_imports_inside_functions(tmp_path):
    package = tmp_path / "probed"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "up.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "import json\n"
        "if TYPE_CHECKING:\n"
        "    from probed_missing_types import T\n"
        "def release():\n"
        "    import json.decoder\n"
        "    from probed_missing_app.colocated import release_cached_gpu_memory\n"
        "    return release_cached_gpu_memory()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", _release_check()._PROBE, "", "probed"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert report["imported"] == ["probed", "probed.up"]
    assert report["errors"] == {}
    assert report["in_functions"] == 2
    assert report["deferred"] == {"probed.up": [[7, "probed_missing_app.colocated", "probed_missing_app"]]}


def test_a_missing_import_inside_a_function_fails_unless_an_extra_or_a_listed_reason_covers_it(capsys):
    check = _release_check()
    deferred = {
        "arl.trainer.group": [[164, "arl_train.colocated", "arl_train"]],
        "arl.rollout.engines.vllm_engine": [[146, "vllm", "vllm"]],
        "arl.rollout.dataset": [[60, "pyarrow.parquet", "pyarrow"]],
        "arl.rollout.up": [[3, "arl.trainer.memory", "arl.trainer"]],
    }
    assert check.check_deferred("arl-trainer", {"arl.trainer.group": deferred["arl.trainer.group"]}, {}) == [
        "arl-trainer: arl.trainer.group:164 imports arl_train.colocated inside a function, but arl_train is not "
        "installed with arl-trainer alone (an undeclared dependency, or an import up the layers of "
        "docs/ARCHITECTURE.md)"
    ]
    rollout = {k: v for k, v in deferred.items() if k.startswith("arl.rollout")}
    problems = check.check_deferred("arl-rollout", rollout, {"vllm": "[vllm] or [vllm-cpu]"})
    assert len(problems) == 1 and "arl.rollout.up:3 imports arl.trainer.memory" in problems[0]
    assert "but arl.trainer is not installed with arl-rollout alone" in problems[0]
    printed = capsys.readouterr().out
    assert (
        "arl.rollout.engines.vllm_engine:146: a function imports vllm, from the [vllm] or [vllm-cpu] extra"
        in printed
    )
    assert (
        "arl.rollout.dataset:60: a function imports pyarrow.parquet, not installed: only `.parquet`"
        in printed
    )
    # An entry of OPTIONAL_IMPORTS that no longer applies is reported, so the list stays true.
    assert check.check_deferred("arl-rollout", {}, {}) == [
        "OPTIONAL_IMPORTS lists arl.rollout.dataset importing pyarrow, which it no longer does while pyarrow is "
        "missing: remove the entry"
    ]


@pytest.mark.slow
@pytest.mark.packaging
@pytest.mark.timeout(1800)
def test_every_package_builds_validates_installs_alone_and_imports():
    if shutil.which("uv") is None:
        pytest.skip("uv is not on PATH")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)],
        check=False,
        capture_output=True,
        text=True,
        timeout=1700,
        cwd=SCRIPT.parent.parent,
    )
    assert proc.returncode == 0, f"{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    assert "OK: arl-queue, arl-proxy, arl-sync, arl-rollout, arl-trainer, arl-harbor" in proc.stdout
