"""arl-proxy is light: importing it (every module) loads no torch, vllm or ray."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
import arl.proxy, arl.proxy.cli, arl.proxy.testing, arl.proxy.upstream, arl.proxy.tool_parsers
heavy = [m for m in ("torch", "vllm", "ray") if m in sys.modules]
assert not heavy, heavy
"""


def test_import_loads_no_heavy_modules():
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
