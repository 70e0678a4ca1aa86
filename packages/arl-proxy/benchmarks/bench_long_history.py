"""Benchmark: latency the proxy adds per turn with many long histories, tokenization on vs off the loop.

256 concurrent sessions (Qwen3 tokenizer and chat template, hermes tool calls), each resuming an agent
conversation of 16k-32k tokens (its first request carries the whole history: a full render and
tokenize), then a few more tool turns (incremental). The engine is a ScriptedGenerator behind a fixed
`--engine-ms` sleep. Added latency per turn = what the client waited minus the engine's time; p50/p99
over all turns, and apart for the first (long) turns and the later (short) ones, measured side by side in
one run for every setting (`_common.py`: `default`, or `key=value,...` over ProxyConfig's defaults;
default: `tokenize_threads=0`, everything on the event loop, and the default); `--old REV` first measures
REV's proxy the same way, each with the machine's load while it ran.

    uv run python packages/arl-proxy/benchmarks/bench_long_history.py [--sessions 256] [--turns 4] \
        [--settings tokenize_threads=0 default] [--old REV [--old-settings tokenize_threads=0 default]]

Writes the figures as JSON to --json, or to $OUT/bench_long_history.json when $OUT is set.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from _common import (
    TOOLS,
    LoadMeter,
    add_compare_args,
    child_argv,
    describe_load,
    describe_machine,
    is_child,
    machine,
    parse_setting,
    pct,
    proxy_source,
    qwen3_path,
    revision,
    run_old,
)
from transformers import AutoTokenizer

from arl.proxy import ChatProxy, ProxyConfig, SamplingParams, TokenOutput
from arl.proxy.testing import ScriptedGenerator


def tool_output(k: int, lines: int) -> str:
    return "".join(
        f"src/pkg_{k}/module_{j}.py:{j * 7}: def handler_{j}(request): return route(request, {j})\n"
        for j in range(lines)
    )


def history(tok, i: int, target_tokens: int) -> list[dict]:
    """A resumed agent conversation of about `target_tokens` tokens (tool call / tool output rounds)."""
    msgs: list[dict] = [
        {"role": "system", "content": "You are a careful software engineering agent."},
        {"role": "user", "content": f"Task {i}: find and fix the bug in the repository."},
    ]
    per_round = len(tok.encode(tool_output(0, 60))) + 60
    for k in range(max(1, target_tokens // per_round)):
        call_id = f"call_{i}_{k}"
        msgs.append(
            {
                "role": "assistant",
                "content": f"Inspecting part {k}.",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "bash",
                            "arguments": json.dumps({"cmd": f"grep -rn handler src/pkg_{k}"}),
                        },
                    }
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": call_id, "content": tool_output(k, 60)})
    return msgs


class TimedEngine:
    """One ScriptedGenerator per session behind a fixed engine time."""

    def __init__(self, engine_s: float) -> None:
        self.gens: dict[str, ScriptedGenerator] = {}
        self.engine_s = engine_s

    async def generate(self, request_id: str, prompt_ids: list[int], sp: SamplingParams) -> TokenOutput:
        await asyncio.sleep(self.engine_s)
        return await self.gens[request_id].generate(request_id, prompt_ids, sp)


def script(i: int, turns: int) -> list[str]:
    return [
        f'Next check {t} of task {i}.\n<tool_call>\n{{"name": "bash", "arguments": '
        f'{{"cmd": "pytest -x tests/test_{t}.py"}}}}\n</tool_call>'
        for t in range(turns)
    ]


async def run_session(
    http, proxy: ChatProxy, engine: TimedEngine, tok, i: int, start: list[dict], turns: int
) -> list[float]:
    s = proxy.open_session()
    engine.gens[s.id] = ScriptedGenerator(tok, script(i, turns))
    messages = list(start)
    waited = []
    for _ in range(turns):
        t0 = time.perf_counter()
        async with http.post(
            s.base_url + "/chat/completions", json={"model": "m", "messages": messages, "tools": TOOLS}
        ) as resp:
            body = await resp.json()
            assert resp.status == 200, body
        waited.append(time.perf_counter() - t0 - engine.engine_s)
        msg = body["choices"][0]["message"]
        messages.append({k: v for k, v in msg.items() if v is not None})
        messages.append({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "ok\n"})
    proxy.pop_session(s.id)
    return waited


async def measure(tok, starts: list[list[dict]], turns: int, setting: str, engine_s: float) -> dict[str, Any]:
    engine = TimedEngine(engine_s)
    proxy = ChatProxy(
        tok, engine, ProxyConfig(tool_parser="hermes", max_context_len=1 << 20, **parse_setting(setting))
    )
    await proxy.start()
    with LoadMeter() as load:
        t0 = time.perf_counter()
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=len(starts)), timeout=aiohttp.ClientTimeout(total=3600)
        ) as http:
            waited = await asyncio.gather(
                *(run_session(http, proxy, engine, tok, i, st, turns) for i, st in enumerate(starts))
            )
        wall = time.perf_counter() - t0
    await proxy.stop()
    first = [w[0] * 1e3 for w in waited]
    later = [x * 1e3 for w in waited for x in w[1:]]
    every = first + later
    tokenize = [t.tokenize * 1e3 for t in proxy.timings]
    return {
        "rev": revision(),
        "setting": setting,
        "source": proxy_source(),
        "wall_s": round(wall, 2),
        "turns": len(every),
        "added_p50_ms": statistics.median(every),
        "added_p99_ms": pct(every, 0.99),
        "first_turn_p50_ms": statistics.median(first),
        "first_turn_p99_ms": pct(first, 0.99),
        "later_turns_p50_ms": statistics.median(later) if later else None,
        "later_turns_p99_ms": pct(later, 0.99) if later else None,
        "proxy_tokenize_p50_ms": statistics.median(tokenize),
        "proxy_tokenize_p99_ms": pct(tokenize, 0.99),
        **load.as_dict(),
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=256)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--min-tokens", type=int, default=16_000)
    ap.add_argument("--max-tokens", type=int, default=32_000)
    ap.add_argument("--engine-ms", type=float, default=50.0)
    ap.add_argument(
        "--tokenizer", default=None, help="a HF tokenizer folder (default: the vendored Qwen3 one)"
    )
    add_compare_args(ap, ["tokenize_threads=0", "default"])
    args = ap.parse_args()
    runs: list[dict[str, Any]] = []
    if args.old:
        runs += run_old(__file__, args.old, child_argv(sys.argv[1:]), args.old_settings)
    tok = AutoTokenizer.from_pretrained(args.tokenizer or qwen3_path())
    rng = random.Random(0)
    starts = [history(tok, i, rng.randint(args.min_tokens, args.max_tokens)) for i in range(args.sessions)]
    for setting in args.settings:
        run = await measure(tok, starts, args.turns, setting, args.engine_ms / 1e3)
        runs.append(run)
        print(
            f"{run['rev']} {setting}: added p50 {run['added_p50_ms']:.0f} / p99 {run['added_p99_ms']:.0f} ms; "
            f"{describe_load(run)}",
            flush=True,
        )
    path = args.json or (
        os.path.join(os.environ["OUT"], "bench_long_history.json") if os.environ.get("OUT") else None
    )
    if is_child():
        Path(path).write_text(json.dumps({"runs": runs}))
        return
    lengths = [
        len(tok.encode(tok.apply_chat_template(s, tools=TOOLS, add_generation_prompt=True, tokenize=False)))
        for s in starts[:8]
    ]
    m = machine()
    print(
        f"\n{args.sessions} sessions x {args.turns} turns of 16k-32k-token histories (sample: {lengths}), "
        f"engine {args.engine_ms:.0f} ms; {describe_machine(m)}"
    )
    print(
        "\n| proxy | setting | added p50 | added p99 | first turn p50 | later turns p50 / p99 | wall | "
        "load 1-min start -> end | CPU busy (others) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        print(
            f"| {r['rev']} | {r['setting']} | {r['added_p50_ms'] / 1e3:.2f} s | {r['added_p99_ms'] / 1e3:.2f} s | "
            f"{r['first_turn_p50_ms'] / 1e3:.2f} s | {r['later_turns_p50_ms'] / 1e3:.3f} / "
            f"{r['later_turns_p99_ms'] / 1e3:.3f} s | {r['wall_s']:.1f} s | {r['load1_start']:.1f} -> "
            f"{r['load1_end']:.1f} | {100 * r['cpu_busy']:.0f}% ({100 * r['others_busy']:.0f}%) |"
        )
    out = {
        "machine": m,
        "sessions": args.sessions,
        "turns_per_session": args.turns,
        "engine_ms": args.engine_ms,
        "history_tokens_sample": lengths,
        "runs": runs,
    }
    if path:
        Path(path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
