"""Router replay on one GPU with vLLM: the train/rollout log-prob gap of a Qwen3-30B-A3B-shaped MoE
(random init, cut to a few layers) with replay on and off, the fraction of sampled tokens whose
trainer routing differs from vLLM's, a dense Qwen3 of the same width as the baseline, and a partial
rollout (abort -> resume) whose routes must stay one row per token.

vLLM (arl's VllmEngine, `return_routed_experts=True`) samples in bfloat16; the trainer is the Hugging
Face model in bfloat16 (as an FSDP trainer would run it), log probs in float32.

On a GPU machine with vLLM (without uv: after the staged vLLM, tools/README.md):

    source .device-stage/bin/env.sh && python packages/arl-trainer/benchmarks/router_replay_gpu.py

Options: --layers 4 --prompts 64 --tokens 256 --no-dense --packed. Prints one JSON object (also written
to $OUT/router_replay.json when $OUT is set). ~3-5 minutes on one H200. `--packed` also runs the
trainer's own path on the same samples (`HFPolicy`: fp32 master weights, bf16 autocast, packed varlen
micro-batches): its replay on/off gap and one `train_step` with `router_replay="rollout"` (route
metrics, update time).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

# Qwen3-30B-A3B's shape (config.json of the released model), minus most of its 48 layers.
QWEN3_30B_A3B = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    rms_norm_eps=1e-6,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
    decoder_sparse_step=1,
    mlp_only_layers=[],
)
DEVICE = "cuda"  # a CPU dry run of build/measure sets "cpu"


def build(path: Path, layers: int, moe: bool) -> Path:
    """Random-init model written as an HF folder (built on the GPU: seconds, not minutes)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    if moe:
        cfg = Qwen3MoeConfig(num_hidden_layers=layers, **QWEN3_30B_A3B)
        cls = Qwen3MoeForCausalLM
    else:
        dense = {
            k: v
            for k, v in QWEN3_30B_A3B.items()
            if k
            not in (
                "moe_intermediate_size",
                "num_experts",
                "num_experts_per_tok",
                "norm_topk_prob",
                "decoder_sparse_step",
                "mlp_only_layers",
            )
        }
        cfg = Qwen3Config(num_hidden_layers=layers, **dense)
        cls = Qwen3ForCausalLM
    with torch.device(DEVICE):
        model = cls(cfg).to(torch.bfloat16)
    model.save_pretrained(path)
    del model
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return path


async def rollout(model_dir: Path, prompts: list[list[int]], tokens: int, routes: bool, resume_check: bool):
    from arl.proxy.types import SamplingParams
    from arl.rollout.engines.vllm_engine import VllmEngine, VllmEngineConfig
    from arl.rollout.server_manager import ServerManager

    engine = VllmEngine(
        VllmEngineConfig(
            model_path=str(model_dir),
            dtype="bfloat16",
            max_model_len=1024,
            enforce_eager=True,
            gpu_memory_utilization=0.35,
            return_routed_experts=routes,
            engine_args={"skip_tokenizer_init": True},
        )
    )
    t0 = time.perf_counter()
    await engine.start()
    info: dict[str, object] = {"vllm_start_s": round(time.perf_counter() - t0, 1)}
    manager = ServerManager([engine], generate_timeout_s=300)
    try:
        t0 = time.perf_counter()
        params = SamplingParams(max_tokens=tokens, temperature=1.0, seed=None)
        outs = await asyncio.gather(*(manager.generate(f"r{i}", p, params) for i, p in enumerate(prompts)))
        info["generate_s"] = round(time.perf_counter() - t0, 2)
        if resume_check:  # partial rollout: abort mid-generation, resume, expect one route row per token
            long = SamplingParams(max_tokens=768, temperature=1.0)
            tasks = [
                asyncio.create_task(manager.generate(f"p{i}", p, long)) for i, p in enumerate(prompts[:8])
            ]
            await asyncio.sleep(1.0)
            await manager.pause("abort")
            await manager.resume()
            partial = await asyncio.wait_for(asyncio.gather(*tasks), 300)
            info["resume"] = {
                "resumed_requests": manager.resumed_requests,
                "rows_match_tokens": all(
                    o.routed_experts is not None and len(o.routed_experts) == len(o.token_ids)
                    for o in partial
                ),
                "rows_missing": sum(1 for o in partial for r in (o.routed_experts or []) if not r),
                "tokens": sum(len(o.token_ids) for o in partial),
            }
    finally:
        await engine.stop()
        del engine, manager
        gc.collect()
        torch.cuda.empty_cache()
    return outs, info


def measure(model_dir: Path, prompts, outs) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    from arl.queue import Response, Sample, decode_sample, encode_sample
    from arl.queue.routed_experts import pack_routes
    from arl.trainer.batch import assemble_batch
    from arl.trainer.router_replay import replay_gap_metrics, routes_for_batch

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
        samples.append(
            decode_sample(
                encode_sample(Sample(uid=str(i), prompt_ids=p, responses=[r], start_version=0, end_version=0))
            )
        )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(DEVICE).eval()
    batch = assemble_batch(samples, pad_token_id=0)
    routes = routes_for_batch(samples, batch.input_ids.shape[1])
    out = replay_gap_metrics(model, batch, routes, micro_rows=8)
    r0 = samples[0].responses[0].routed_experts
    if r0 is not None:
        out["queue_bytes_per_token"] = len(r0.data) / r0.shape[0]
        out["route_shape_per_token"] = list(r0.shape[1:])
    del model
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return out


def measure_packed(model_dir: Path, prompts, outs) -> dict[str, float]:
    """The trainer's path: `PackedPolicy.replay_gap` and one replayed `train_step` on the same samples."""
    from arl.queue import Response, Sample
    from arl.queue.routed_experts import pack_routes
    from arl.trainer import HFPolicy, TrainerConfig
    from arl.trainer.batch import assemble_batch
    from arl.trainer.router_replay import routes_for_batch

    # Groups of two (each response with its own prompt, rewards 0 and 1) so the update is not a no-op.
    responses = [
        Response(
            response_ids=o.token_ids,
            response_mask=[1] * len(o.token_ids),
            response_logprobs=o.log_probs,
            weight_versions=o.weight_versions,
            reward=float(i % 2),
            prompt_ids=p,
            routed_experts=pack_routes(o.routed_experts),
        )
        for i, (p, o) in enumerate(zip(prompts, outs, strict=True))
    ]
    samples = [
        Sample(
            uid=str(i), prompt_ids=prompts[i], start_version=0, end_version=0, responses=responses[i : i + 2]
        )
        for i in range(0, len(responses), 2)
    ]
    batch = assemble_batch(samples, pad_token_id=0)
    routes = routes_for_batch(samples, batch.input_ids.shape[1])
    policy = HFPolicy(
        model_dir, TrainerConfig(router_replay="rollout", mixed_precision="bf16"), device=DEVICE
    )
    out = {k.removeprefix("router_replay/"): v for k, v in policy.replay_gap(batch, routes).items()}
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    m = policy.train_step(batch, mini_batch_rows=batch.input_ids.shape[0], routes=routes)
    out["train_step_s"] = round(time.perf_counter() - t0, 2)
    out.update(
        {
            k.removeprefix("router_replay/"): v
            for k, v in m.items()
            if k.startswith("router_replay/route_diff")
            or k in ("behaviour_proximal_abs_diff", "grad_norm", "microbatches")
        }
    )
    del policy
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--no-dense", action="store_true")
    ap.add_argument("--packed", action="store_true", help="also measure the trainer's packed path (HFPolicy)")
    args = ap.parse_args()
    import transformers
    import vllm

    started = time.perf_counter()
    result: dict[str, object] = {
        "gpu": torch.cuda.get_device_name(0),
        "vllm": vllm.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model": f"Qwen3-30B-A3B shape, {args.layers} layers, random init, bf16",
        "prompts": args.prompts,
        "max_tokens": args.tokens,
    }
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(100, 150000, (int(n),), generator=gen).tolist()
        for n in torch.randint(32, 256, (args.prompts,), generator=gen)
    ]
    try:
        with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
            t0 = time.perf_counter()
            moe = build(Path(tmp) / "moe", args.layers, moe=True)
            result["build_s"] = round(time.perf_counter() - t0, 1)
            outs, info = asyncio.run(rollout(moe, prompts, args.tokens, routes=True, resume_check=True))
            result["moe_engine"] = info
            m = measure(moe, prompts, outs)
            result["moe"] = {k.removeprefix("router_replay/"): v for k, v in m.items()}
            if args.packed:
                result["moe_packed_trainer"] = measure_packed(moe, prompts, outs)
            if not args.no_dense:
                dense = build(Path(tmp) / "dense", args.layers, moe=False)
                d_outs, d_info = asyncio.run(
                    rollout(dense, prompts, args.tokens, routes=False, resume_check=False)
                )
                d = measure(dense, prompts, d_outs)
                result["dense"] = {
                    "gap_mean": d["router_replay/logp_gap_off_mean"],
                    "gap_max": d["router_replay/logp_gap_off_max"],
                    **d_info,
                }
        mo = result["moe"]
        result["summary"] = {
            "route_diff_frac": mo["route_diff_frac"],
            "gap_replay_off_mean": mo["logp_gap_off_mean"],
            "gap_replay_on_mean": mo["logp_gap_on_mean"],
            "gap_dense_mean": result.get("dense", {}).get("gap_mean"),
            "queue_bytes_per_token": mo.get("queue_bytes_per_token"),
        }
    except Exception as exc:  # report what failed in the JSON, not only in a traceback
        result["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    result["seconds"] = round(time.perf_counter() - started, 1)
    text = json.dumps(result, indent=1)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "router_replay.json").write_text(text)
    sys.exit(1 if "error" in result else 0)


if __name__ == "__main__":
    main()
