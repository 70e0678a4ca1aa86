"""Calibration from a measured bench run: the simulator's inputs taken from the machine itself.

`measure_decode_curve` times an engine replica directly at several batch sizes (tokens/s of
`batch` concurrent requests); `calibration_from_bench` takes the train rate and sync times from a
`compare` result (bench.json) and pairs them with that curve. The CPU test uses both to check that
the simulator reproduces the CPU bench; on the device, raw_vllm_rates.py does the same for vLLM.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from arl.proxy.types import SamplingParams
from arl.rollout.testing import DecodeCost
from arl_bench.simulate import Calibration, SyncCost, TrainCost


async def measure_decode_curve(
    engine: Any, batch_sizes: list[int], *, tokens: int = 16, prompt_len: int = 32, repeats: int = 2
) -> DecodeCost:
    """Aggregate decode tokens/s of `engine` with b concurrent requests of exactly `tokens` tokens."""
    rates = []
    warm = SamplingParams(max_tokens=tokens, ignore_eos=True)
    await asyncio.gather(*(engine.generate(f"cal-warm-{i}", [1] * prompt_len, warm) for i in range(max(batch_sizes))))
    for b in batch_sizes:
        best = 0.0
        for r in range(repeats):
            params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=1.0)
            prompts = [[(7 * i + j) % 200 + 1 for j in range(prompt_len)] for i in range(b)]
            started = time.perf_counter()
            outs = await asyncio.gather(*(engine.generate(f"cal-{b}-{r}-{i}", p, params) for i, p in enumerate(prompts)))
            elapsed = time.perf_counter() - started
            best = max(best, sum(len(o.token_ids) for o in outs) / elapsed)
        rates.append(best)
    return DecodeCost(batch_sizes=list(batch_sizes), tokens_per_s=rates)


def calibration_from_bench(bench: dict[str, Any], decode: DecodeCost, *, prompt_len: int, n: int) -> Calibration:
    """Train tokens/s and sync seconds as measured in a bench run (split side: mode d; colocated side:
    the colocated run), with the directly measured decode curve."""
    modes = bench["modes"]
    split = modes.get("d") or next(iter(modes.values()))
    coloc = modes.get("colocated", split)
    prompts_per_s = split["samples_per_s"]
    # Tokens the trainer processed per second of its own compute: (prompt + response) per trajectory.
    tokens_per_step = prompts_per_s * split["step_s_mean"] * n * (prompt_len + split["response_length_mean"])
    train_rate = tokens_per_step / max(1e-9, split["train_s_per_step"])
    return Calibration(
        decode=decode,
        train=TrainCost(tokens_per_s_per_gpu=train_rate),
        sync=SyncCost(split_s=split["sync_s_per_step"], colocated_s=coloc["sync_s_per_step"]),
        meta={"source": "measured by the bench run itself", "bench_output": bench.get("model", "")},
    )
