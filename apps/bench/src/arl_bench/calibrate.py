"""Calibration from a measured bench run: the simulator's inputs taken from the machine itself.

`measure_decode_curve` times an engine replica directly at several batch sizes (tokens/s of
`batch` concurrent requests); `calibration_from_bench` takes one mode's train rate, sync time (and,
on shared hardware, decode rate while busy) from a `compare` result (bench.json) and pairs them with
that curve. The CPU test uses both to check that
the simulator reproduces the CPU bench; on the device, raw_vllm_rates.py does the same for vLLM.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from arl.proxy.types import SamplingParams
from arl.rollout.testing import DecodeCost
from arl_bench.simulate import Calibration, SyncCost, TrainCost


async def measure_decode_curve(
    engine: Any, batch_sizes: list[int], *, tokens: int = 16, prompt_len: int = 32, repeats: int = 2
) -> DecodeCost:
    """Aggregate decode tokens/s of `engine` with b concurrent requests of exactly `tokens` tokens."""
    rates = []
    warm = SamplingParams(max_tokens=tokens, ignore_eos=True)
    await asyncio.gather(
        *(engine.generate(f"cal-warm-{i}", [1] * prompt_len, warm) for i in range(max(batch_sizes)))
    )
    for b in batch_sizes:
        best = 0.0
        for r in range(repeats):
            params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=1.0)
            prompts = [[(7 * i + j) % 200 + 1 for j in range(prompt_len)] for i in range(b)]
            started = time.perf_counter()
            outs = await asyncio.gather(
                *(engine.generate(f"cal-{b}-{r}-{i}", p, params) for i, p in enumerate(prompts))
            )
            elapsed = time.perf_counter() - started
            best = max(best, sum(len(o.token_ids) for o in outs) / elapsed)
        rates.append(best)
    return DecodeCost(batch_sizes=list(batch_sizes), tokens_per_s=rates)


def calibration_from_bench(
    bench: dict[str, Any],
    decode: DecodeCost,
    *,
    prompt_len: int,
    n: int,
    mode: str,
    running_sequences: int | None = None,
) -> Calibration:
    """The simulator's inputs as measured in one mode's run of a bench result.

    Train tokens/s is (prompt + response tokens per step) / train seconds per step, and the sync time
    is the run's sync seconds per step. When the two sides share hardware (the CPU bench: one pair of
    cores), an engine decodes slower while the trainer runs than when measured alone; with
    `running_sequences` (the batch the engine ran at in that mode) the directly measured `decode`
    curve is scaled so that its rate at that batch equals the run's own decode rate while busy
    (generated tokens per busy second). Without it the curve is used as measured.
    """
    r = bench["modes"][mode]
    tokens_per_step = r["samples_per_s"] * r["step_s_mean"] * n * (prompt_len + r["response_length_mean"])
    train_rate = tokens_per_step / max(1e-9, r["train_s_per_step"])
    if running_sequences:
        busy_rate = r["generated_tokens_per_s"] / max(1e-9, 1.0 - r["rollout_idle_fraction"])
        scale = busy_rate / decode.rate(running_sequences)
        decode = msgspec.structs.replace(decode, tokens_per_s=[v * scale for v in decode.tokens_per_s])
    return Calibration(
        decode=decode,
        train=TrainCost(tokens_per_s_per_gpu=train_rate),
        sync=SyncCost(split_s=r["sync_s_per_step"], colocated_s=r["sync_s_per_step"]),
        meta={
            "source": f"measured by the bench run itself (mode {mode})",
            "bench_model": bench.get("model", ""),
        },
    )


def match_engine_speed(
    calib: Calibration, mode: str, gpus: int, workload: Any, busy_tokens_per_s: float, *, iterations: int = 3
) -> Calibration:
    """Scale the decode curve until the simulated replica's tokens per busy second in `mode` equals
    the measured one (`generated tokens/s ÷ (1 − rollout idle)` of the run): the engine's speed is an
    input taken from the run, the samples/s that results from the dynamics is what gets compared."""
    from arl_bench.simulate import simulate

    for _ in range(iterations):
        r = simulate(mode, gpus, calib, workload)
        simulated = r.tokens_per_s / max(1e-9, (1.0 - r.engine_idle_fraction) * r.replicas)
        scale = busy_tokens_per_s / simulated
        calib = msgspec.structs.replace(
            calib,
            decode=msgspec.structs.replace(
                calib.decode, tokens_per_s=[v * scale for v in calib.decode.tokens_per_s]
            ),
        )
        if abs(scale - 1) < 0.02:
            break
    return calib
