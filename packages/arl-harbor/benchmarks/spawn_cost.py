"""What one process spawn costs an agent-loop worker: from a small process vs one holding `--rss-gib`.

    uv run python packages/arl-harbor/benchmarks/spawn_cost.py [--spawns 200] [--rss-gib 1]

Every sandbox exec and start spawns processes from the agent-loop worker (a Ray actor holding ~1 GB), and
the worker's event loop waits in `create_subprocess_exec` while it does. This times `/bin/true` spawned the
way `LocalSandboxEnvironment` spawns (asyncio, new session, piped output) from a fresh process, then from
one that has touched `--rss-gib` of memory, side by side, each in its own child process.

Measured on the 2-core dev machine, idle (2026-11-30): 0.71 ms per spawn both ways (1.0×): CPython spawns
with vfork, so the worker's size does not matter; under load the wait is for a core, not for memory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time


async def _spawns(count: int) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), os.times()
    for _ in range(count):
        proc = await asyncio.create_subprocess_exec(
            "/bin/true",
            start_new_session=True,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        await proc.wait()
    c1 = os.times()
    return (time.perf_counter() - t0) / count, (c1.system + c1.user - c0.system - c0.user) / count


def _child(count: int, rss_gib: float) -> None:
    held = bytearray(int(rss_gib * (1 << 30)))
    for i in range(0, len(held), 4096):  # touch every page so it is resident
        held[i] = 1
    wall, cpu = asyncio.run(_spawns(count))
    print(f"{wall * 1e3:.3f} {cpu * 1e3:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=200)
    parser.add_argument("--rss-gib", type=float, default=1.0)
    parser.add_argument("--child", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.spawns, args.child)
        return
    rows = {}
    for rss in (0.0, args.rss_gib):
        out = subprocess.run(
            [sys.executable, __file__, "--spawns", str(args.spawns), "--child", str(rss)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        rows[rss] = (float(out[0]), float(out[1]))
        print(
            f"parent holding {rss:.1f} GiB: {rows[rss][0]:.2f} ms per spawn (wall), parent CPU {rows[rss][1]:.2f} ms"
        )
    print(f"ratio: {rows[args.rss_gib][0] / rows[0.0][0]:.1f}× the wall time per spawn")


if __name__ == "__main__":
    main()
