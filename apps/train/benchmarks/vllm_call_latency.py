"""Latency of the vLLM control calls a weight sync makes, on a GPU, idle and under load.

    python apps/train/benchmarks/vllm_call_latency.py      # one GPU, vLLM staged (no uv on the device)

The app's first GPU runs spent ~300 ms in each of pause, the weight RPC and the prefix-cache reset
while the transfer itself took ~4 ms. This times each AsyncLLM call on its own (tiny built-in model,
the app's engine settings) so the cost can be put on vLLM or on arl's layers above it. Prints one
JSON block (milliseconds, median of repeats) and writes $OUT/vllm_call_latency.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


async def _timed(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return round(statistics.median(samples), 2)


async def main() -> dict:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    from arl_train.tiny_model import build_tiny_model

    model = build_tiny_model(Path(tempfile.mkdtemp()) / "model", seed=0)
    results: dict = {}
    modes = os.environ.get("ARL_LATENCY_MODES", "graphs").split(",")  # graphs, eager
    for eager in [m == "eager" for m in modes]:
        args = AsyncEngineArgs(
            model=str(model),
            dtype="float32",
            max_model_len=512,
            enforce_eager=eager,
            gpu_memory_utilization=0.3,
            disable_log_stats=True,
            worker_extension_cls="arl.rollout.engines.vllm_worker.WeightSyncExtension",
        )
        llm = AsyncLLM.from_engine_args(args)
        row: dict = {}
        # The closures below bind this iteration's llm (and params, stop) as defaults.

        async def pause_abort(llm=llm):
            await llm.pause_generation(mode="abort", clear_cache=True)
            await llm.resume_generation()

        async def pause_keep(llm=llm):
            await llm.pause_generation(mode="keep", clear_cache=False)
            await llm.resume_generation()

        async def reset_cache(llm=llm):
            await llm.reset_prefix_cache()

        async def rpc_noop(llm=llm):
            await llm.collective_rpc("arl_ping", timeout=60)

        async def is_paused(llm=llm):
            await llm.is_paused()

        calls = {
            "pause_abort+resume": pause_abort,
            "pause_keep+resume": pause_keep,
            "reset_prefix_cache": reset_cache,
            "is_paused": is_paused,
        }
        try:
            await llm.collective_rpc("arl_ping", timeout=60)
            calls["collective_rpc_noop"] = rpc_noop
        except Exception as exc:  # older worker extension without arl_ping
            row["collective_rpc_noop"] = f"n/a: {exc}"[:120]
        for name, fn in calls.items():
            row[f"idle_{name}"] = await _timed(fn, 8)

        # Under load: 128 long generations in flight (re-submitted as they finish).
        params = SamplingParams(
            max_tokens=400,
            ignore_eos=True,
            temperature=1.0,
            logprobs=0,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        stop = asyncio.Event()

        async def client(i: int, llm=llm, params=params, stop=stop) -> None:
            n = 0
            while not stop.is_set():
                async for _ in llm.generate(TokensPrompt(prompt_token_ids=[1, 2, 3, 4]), params, f"r{i}-{n}"):
                    pass
                n += 1

        clients = [asyncio.create_task(client(i)) for i in range(128)]
        await asyncio.sleep(2.0)
        for name in (
            "reset_prefix_cache",
            "is_paused",
            "collective_rpc_noop",
            "pause_keep+resume",
            "pause_abort+resume",
        ):
            if name in calls:
                row[f"busy_{name}"] = await _timed(calls[name], 5)
                await asyncio.sleep(0.5)
        stop.set()
        await llm.pause_generation(mode="abort", clear_cache=True)
        await llm.resume_generation()
        await asyncio.gather(*clients, return_exceptions=True)
        llm.shutdown()
        results["eager" if eager else "cuda_graphs"] = row
        print(json.dumps({("eager" if eager else "cuda_graphs"): row}), flush=True)
    return results


if __name__ == "__main__":
    out = asyncio.run(main())
    text = json.dumps(out, indent=1)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "vllm_call_latency.json").write_text(text)
