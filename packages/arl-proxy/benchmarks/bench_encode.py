"""Benchmark: what tokenizing one text costs, by length, on the event loop and handed to a thread.

The measurements behind where the proxy tokenizes (`ProxyConfig.tokenize_inline_chars`,
`tokenize_threads`). Texts are prefixes of a rendered 30k-token agent history (Qwen3 tokenizer and
template). For each length, interleaved, best of `--repeat` rounds of medians:
- `encode`: HF tokenizers' one-text call (computes character offsets; holds the GIL throughout);
- `batch_fast`: `encode_batch_fast([text])` (no offsets; releases the GIL), what `ChatCodec.encode` calls;
- `handed off`: the same call awaited from an event loop through a one-thread pool (hand-off included);
- `loop left`: the share of the time the event loop still ran its own Python while a thread tokenized
  (1.0: the thread took none of the loop's time; 0: it held the GIL throughout), for both calls.

    uv run python packages/arl-proxy/benchmarks/bench_encode.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _common import TOOLS, LoadMeter, describe_load, describe_machine, machine, qwen3_path
from bench_long_history import history
from transformers import AutoTokenizer

from arl.proxy.chat import ChatCodec

LENGTHS = (256, 1024, 2048, 4096, 8192, 16384, 32768, 84000)


def timed(fn: Any, n: int) -> float:
    """Median ms of `n` calls."""
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


async def handed_off(pool: ThreadPoolExecutor, fn: Any, n: int) -> float:
    loop = asyncio.get_running_loop()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        await loop.run_in_executor(pool, fn)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def loop_left(fn: Any, seconds: float = 0.3) -> float:
    """Python work done on this thread while another thread calls `fn` in a loop, over the same work alone."""

    def spin() -> int:
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            n += 1
        return n

    alone = spin()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            fn()

    t = threading.Thread(target=work)
    t.start()
    shared = spin()
    stop.set()
    t.join()
    return shared / alone


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(qwen3_path())
    codec = ChatCodec(tok)
    backend = tok.backend_tokenizer
    text = codec.render(history(tok, 0, 30_000), TOOLS, True)
    rows = []
    with LoadMeter() as load, ThreadPoolExecutor(1) as pool:
        for n in LENGTHS:
            t = text[:n]
            ntok = len(codec.encode(t))
            calls = max(3, min(200, 200_000 // n))

            def one(t: str = t) -> Any:
                return backend.encode(t, add_special_tokens=False)

            def fast(t: str = t) -> Any:
                return backend.encode_batch_fast([t], add_special_tokens=False)

            rounds = [
                (timed(one, calls), timed(fast, calls), await handed_off(pool, fast, calls))
                for _ in range(args.repeat)
            ]
            best = [min(r[i] for r in rounds) for i in range(3)]
            rows.append((len(t), ntok, *best, loop_left(one), loop_left(fast)))
            print(f"{len(t)} chars done", flush=True)
    print(f"\n{describe_machine(machine())}; {describe_load(load.as_dict())}\n")
    print(
        "| chars | tokens | encode (ms) | batch_fast (ms) | batch_fast handed off (ms) | loop left: encode | "
        "loop left: batch_fast |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.3f} | {r[4]:.3f} | {r[5]:.2f} | {r[6]:.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
