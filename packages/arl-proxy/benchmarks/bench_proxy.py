"""Benchmark: what the proxy adds per turn, and its tokenization cost as the history grows.

64 concurrent sessions x 30 turns of tool use (Qwen3 tokenizer and template, hermes tool calls,
ScriptedGenerator as the engine), driven over HTTP. Reported:
- the proxy's added time per turn (request handling minus the time spent waiting for the generator),
  p50 / p99 over all turns;
- its tokenization cost per turn (render + check + tokenize only the new messages) by turn index,
  side by side with re-rendering and re-tokenizing the whole history every turn (what AReaL/slime do).
Every setting (`_common.py`: `default`, or `key=value,...` over ProxyConfig's defaults) is measured in
turn, in this process; `--old REV` first measures REV's proxy the same way, so old and new print side by
side, each with the machine's load while it ran.

    uv run python packages/arl-proxy/benchmarks/bench_proxy.py [--sessions 64] [--turns 30] [--check window] \
        [--settings default tokenize_threads=0] [--old REV [--old-settings default]] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

TOOL_OUTPUT = "".join(
    f"src/module_{k}.py: def function_{k}(x): return x * {k}  # line {k}\n" for k in range(8)
)


class PerSession:
    """The engine: one ScriptedGenerator per session (request id)."""

    def __init__(self) -> None:
        self.gens: dict[str, ScriptedGenerator] = {}

    async def generate(self, request_id: str, prompt_ids: list[int], sp: SamplingParams) -> TokenOutput:
        await asyncio.sleep(0)  # an engine would await here
        return await self.gens[request_id].generate(request_id, prompt_ids, sp)


def script(i: int, turns: int) -> list[str]:
    calls = [
        f'I will inspect step {t} of task {i}.\n<tool_call>\n{{"name": "bash", "arguments": '
        f'{{"cmd": "grep -rn function_{t} src/ | head -20"}}}}\n</tool_call>'
        for t in range(turns - 1)
    ]
    return calls + [f"<think>\nAll steps checked.\n</think>\n\nTask {i} is complete."]


async def run_session(
    http: aiohttp.ClientSession, proxy: ChatProxy, engine: PerSession, tok, i: int, turns: int
) -> list[list[dict]]:
    s = proxy.open_session()
    engine.gens[s.id] = ScriptedGenerator(tok, script(i, turns))
    messages = [
        {"role": "system", "content": "You are a careful software engineering agent."},
        {"role": "user", "content": f"Task {i}: find and fix the bug in the repository.\n\n"},
    ]
    history = []
    for _ in range(turns):
        history.append(list(messages))
        async with http.post(
            s.base_url + "/chat/completions", json={"model": "m", "messages": messages, "tools": TOOLS}
        ) as resp:
            body = await resp.json()
            assert resp.status == 200, body
        msg = body["choices"][0]["message"]
        messages.append({k: v for k, v in msg.items() if v is not None})
        if msg.get("tool_calls"):
            messages.append(
                {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": TOOL_OUTPUT}
            )
    traj = proxy.pop_session(s.id)
    assert traj.rebuilds == 0 and traj.num_turns == turns
    return history


async def measure(tok, setting: str, sessions: int, turns: int, check: str) -> tuple[dict[str, Any], list]:
    """One setting: every turn's timings, summarized, and the conversations (for the re-render reference)."""
    engine = PerSession()
    proxy = ChatProxy(
        tok, engine, ProxyConfig(tool_parser="hermes", incremental_check=check, **parse_setting(setting))
    )
    await proxy.start()
    conn = aiohttp.TCPConnector(limit=sessions)
    with LoadMeter() as load:
        t0 = time.perf_counter()
        async with aiohttp.ClientSession(connector=conn) as http:
            histories = await asyncio.gather(
                *(run_session(http, proxy, engine, tok, i, turns) for i in range(sessions))
            )
        wall = time.perf_counter() - t0
    await proxy.stop()
    timings = list(proxy.timings)
    overhead = [t.overhead * 1e3 for t in timings]
    tokenize = [t.tokenize * 1e3 for t in timings]
    by_turn: dict[int, list[float]] = {}
    prompt_len: dict[int, list[int]] = {}
    for t in timings:
        by_turn.setdefault(t.turn, []).append(t.tokenize * 1e3)
        prompt_len.setdefault(t.turn, []).append(t.prompt_tokens)
    return {
        "rev": revision(),
        "setting": setting,
        "source": proxy_source(),
        "turns": len(timings),
        "wall_s": round(wall, 2),
        "turns_per_s": round(len(timings) / wall, 1),
        "overhead_p50_ms": statistics.median(overhead),
        "overhead_p99_ms": pct(overhead, 0.99),
        "tokenize_p50_ms": statistics.median(tokenize),
        "tokenize_p99_ms": pct(tokenize, 0.99),
        # index i: turn i + 1
        "tokenize_by_turn_ms": [statistics.median(v) for _, v in sorted(by_turn.items())],
        "prompt_tokens_by_turn": [statistics.median(v) for _, v in sorted(prompt_len.items())],
        **load.as_dict(),
    }, histories


def full_rerender(tok, histories: list) -> list[float]:
    """Median ms, turn by turn, of re-rendering and re-tokenizing the whole history (apply_chat_template)."""
    full: dict[int, list[float]] = {}
    for history in histories[:8]:
        for turn, msgs in enumerate(history, 1):
            ref = json.loads(json.dumps(msgs))
            for m in ref:
                for c in m.get("tool_calls") or []:
                    c["function"] = {**c["function"], "arguments": json.loads(c["function"]["arguments"])}
            t = time.perf_counter()
            tok.apply_chat_template(ref, tools=TOOLS, add_generation_prompt=True, tokenize=True)
            full.setdefault(turn, []).append((time.perf_counter() - t) * 1e3)
    return [statistics.median(v) for _, v in sorted(full.items())]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--check", default="window", choices=["window", "full"])
    add_compare_args(ap, ["default"])
    args = ap.parse_args()
    runs: list[dict[str, Any]] = []
    if args.old:
        runs += run_old(__file__, args.old, child_argv(sys.argv[1:]), args.old_settings)
    tok = AutoTokenizer.from_pretrained(qwen3_path())
    histories: list = []
    for setting in args.settings:
        run, histories = await measure(tok, setting, args.sessions, args.turns, args.check)
        runs.append(run)
        print(
            f"{run['rev']} {setting}: added per turn p50 {run['overhead_p50_ms']:.2f} / p99 "
            f"{run['overhead_p99_ms']:.2f} ms; {describe_load(run)}",
            flush=True,
        )
    if is_child():
        Path(args.json).write_text(json.dumps({"runs": runs}))
        return
    full = full_rerender(tok, histories) if histories else []

    print(
        f"\n{args.sessions} sessions x {args.turns} turns, check={args.check}; {describe_machine(machine())}"
    )
    print(
        "\n| proxy | setting | added per turn p50 / p99 (ms) | tokenization per turn p50 / p99 (ms) | "
        "turns/s | load 1-min start -> end | CPU busy (others) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in runs:
        print(
            f"| {r['rev']} | {r['setting']} | {r['overhead_p50_ms']:.2f} / {r['overhead_p99_ms']:.2f} | "
            f"{r['tokenize_p50_ms']:.2f} / {r['tokenize_p99_ms']:.2f} | {r['turns_per_s']:.0f} | "
            f"{r['load1_start']:.1f} -> {r['load1_end']:.1f} | {100 * r['cpu_busy']:.0f}% "
            f"({100 * r['others_busy']:.0f}%) |"
        )
    if full:
        labels = " | ".join(f"{r['rev']} {r['setting']}" for r in runs)
        print(
            "\nproxy tokenization per turn (median ms) by turn, and a full re-render + tokenize "
            "(apply_chat_template, measured after the runs):\n"
        )
        print(f"| turn | prompt tokens | {labels} | full re-render |")
        print("|---:|---:|" + "---:|" * len(runs) + "---:|")
        for turn in range(1, len(full) + 1):
            if turn in (1, 2, 5, 10, 15, 20, 25, 30) or turn == args.turns:
                cells = " | ".join(f"{r['tokenize_by_turn_ms'][turn - 1]:.3f}" for r in runs)
                tokens = runs[-1]["prompt_tokens_by_turn"][turn - 1]
                print(f"| {turn} | {tokens:.0f} | {cells} | {full[turn - 1]:.3f} |")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": machine(),
                    "sessions": args.sessions,
                    "turns": args.turns,
                    "check": args.check,
                    "runs": runs,
                    "full_rerender_by_turn_ms": full,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    asyncio.run(main())
