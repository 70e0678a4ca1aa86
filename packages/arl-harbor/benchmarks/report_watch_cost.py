"""What the SWE report plugin's watch costs a test run: pytest over many trivial tests, once in the
builder's mode (the report to a file, nothing watched) and once in the verifier's (report stream and nonce
through pipes, the runner watched, the audit hook on), alternated in one process so that both see the same
machine. Prints each mode's median wall time and their ratio.

    uv run python packages/arl-harbor/benchmarks/report_watch_cost.py --tests 5000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from arl.harbor.swe.testing import run_watched_pytest
from arl.harbor.swe.writer import TASK_FILES

NONCE = "0" * 32


def _write_repo(root: Path, tests: int) -> None:
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "test_many.py").write_text(
        f"import pytest\n\n\n@pytest.mark.parametrize('i', range({tests}))\ndef test_trivial(i):\n    assert i >= 0\n"
    )


def _pytest_command(root: Path) -> list[str]:
    return [sys.executable, "-P", "-m", "pytest", "-p", "arl_swe_report", "-p", "no:cacheprovider",
            f"--rootdir={root}", "-c", str(root / "pytest.ini"), "-q", "test_many.py"]  # fmt: skip


def _base_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "ARL_SWE"))}
    env.update(PYTHONPATH=f"{TASK_FILES}:{root}", PYTHONDONTWRITEBYTECODE="1")
    return env


def run_builder_mode(root: Path) -> float:
    env = _base_env(root) | {"ARL_SWE_REPORT": str(root / "report.json")}
    started = time.perf_counter()
    subprocess.run(
        _pytest_command(root), cwd=root, env=env, stdout=subprocess.DEVNULL, check=False, timeout=600
    )
    elapsed = time.perf_counter() - started
    json.loads((root / "report.json").read_text())  # the run really reported
    return elapsed


def run_verifier_mode(root: Path) -> float:
    (root / "change.json").write_text(json.dumps({"kept": []}))
    started = time.perf_counter()
    _, raw = run_watched_pytest(root, "test_many.py", NONCE)
    elapsed = time.perf_counter() - started
    document = json.loads(raw.splitlines()[-1])
    if document.get("nonce") != NONCE or document.get("tampered"):
        raise RuntimeError(f"the watched run did not report cleanly: {document.get('tampered')}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="arl-watch-cost-") as tmp:
        root = Path(tmp)
        _write_repo(root, args.tests)
        times: dict[str, list[float]] = {"builder": [], "verifier": []}
        for _ in range(args.repeats):
            times["builder"].append(run_builder_mode(root))
            times["verifier"].append(run_verifier_mode(root))
    builder, verifier = (statistics.median(times[k]) for k in ("builder", "verifier"))
    print(json.dumps({"tests": args.tests, "seconds": times}, indent=None))
    print(
        f"{args.tests} tests: builder's mode {builder:.2f} s, watched {verifier:.2f} s (median of {args.repeats}); "
        f"watched / builder = {verifier / builder:.3f}; load {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
