"""Every package builds, validates and imports alone: scripts/release_check.py (see RELEASING.md).

The light packages (arl-queue, arl-proxy) must in addition install and import without torch, vllm or
ray; the others with their declared dependencies only (an undeclared import fails the check).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "release_check.py"


@pytest.mark.slow
@pytest.mark.packaging
@pytest.mark.timeout(1800)
def test_every_package_builds_validates_installs_alone_and_imports():
    if shutil.which("uv") is None:
        pytest.skip("uv is not on PATH")
    proc = subprocess.run([sys.executable, str(SCRIPT)], check=False, capture_output=True, text=True,
                          timeout=1700, cwd=SCRIPT.parent.parent)
    assert proc.returncode == 0, f"{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    assert "OK: arl-queue, arl-proxy, arl-sync, arl-rollout, arl-trainer, arl-harbor" in proc.stdout
