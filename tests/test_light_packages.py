"""The light packages (arl-queue, arl-proxy) install from their wheels alone and import without torch/vllm/ray."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "check_light_packages.py"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_light_packages_install_and_import_without_heavy_dependencies():
    if shutil.which("uv") is None:
        pytest.skip("uv is not on PATH")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)],
        check=False,
        capture_output=True,
        text=True,
        timeout=1100,
        cwd=SCRIPT.parent.parent,
    )
    assert proc.returncode == 0, f"{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    assert "OK:" in proc.stdout
