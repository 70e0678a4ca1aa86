"""Benchmark: the colocated 8B app's trainer update outside the app, its last step profiled.

    python packages/arl-trainer/benchmarks/offload_app_update.py [--row-tokens 200,185,207,193] [--inflight-mb 256]

What the app runs in `h200x2_phases.sh offload8b` (one GPU, `HFPolicy`), without the app around it:
the random Qwen3-8B body on the app's 1,024-token vocabulary (~6.95B parameters, fp32 master weights,
bf16 autocast), fused AdamW, full activation checkpointing, `optimizer_offload` with the prefetch,
`recompute` proximal log probs, 32 rows (40 prompt tokens each) in one packed micro-batch, the
allocator's cache emptied after every step as the colocated app does. One step per `--row-tokens`
entry, each a new length as the app's batches are (5,924 / 6,396 / 6,636 tokens in its steps 1-3;
default 200,185,207,193 tokens per row), or one length repeated; the first step allocates the pinned
buffer. `--inflight-mb`: the prefetch's pace (`optimizer_prefetch_inflight_mb`; 0: every copy queued
at once). Per step the wall time, `update_s`, `proximal_s` and the state's way back
(`optimizer_load_s`, of it waited `optimizer_load_wait_s`) and way out. The last step runs under
torch.profiler (`arl.trainer.profiling`): $OUT/profile/step_N.txt and step_N.json. Against the app's own
step (`trainer.profile_step`) it says whether a slow update is the engine's or the app's; with new
lengths and `--inflight-mb 0` it shows the first backward matmul of each new shape waiting for the
whole prefetch (packages/arl-trainer/BENCHMARKS.md has the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import _common  # noqa: F401  (sys.path for arl.*)
import torch
from _common import SMOKE, bench_device, emit, fixed_length_batch, sync


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--row-tokens", default="200,185,207,193", help="tokens per row, one entry per step")
    parser.add_argument("--inflight-mb", type=int, default=256, help="optimizer_prefetch_inflight_mb")
    args = parser.parse_args()
    lengths = [int(x) for x in args.row_tokens.split(",")]
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from arl.trainer import HFPolicy, TrainerConfig
    from arl.trainer.algorithm_config import AlgorithmConfig
    from arl.trainer.config import OptimConfig
    from arl.trainer.profiling import profiled_step

    device = bench_device()
    layers, hidden, inter = (2, 256, 512) if SMOKE else (36, 4096, 12288)
    config = Qwen3Config(
        vocab_size=1024,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=16384,
    )
    torch.manual_seed(0)
    with device:
        model = Qwen3ForCausalLM(config)
    policy = HFPolicy(
        model,
        TrainerConfig(
            optim=OptimConfig(lr=1e-6, fused=device.type == "cuda"),
            max_tokens_per_microbatch=16384,
            mixed_precision="bf16" if device.type == "cuda" else "none",
            activation_checkpointing="full",
            optimizer_offload=True,
            optimizer_prefetch_inflight_mb=args.inflight_mb,
            algorithm=AlgorithmConfig(proximal_mode="recompute"),
        ),
        device=device.type,
    )
    out = Path(os.environ.get("OUT", "."))
    keys = [
        "update_s",
        "proximal_s",
        "optimizer_load_s",
        "optimizer_load_wait_s",
        "optimizer_offload_s",
        "train_tokens",
    ]
    steps = []
    for step, length in enumerate(lengths, start=1):
        batch = fixed_length_batch(32, length, 40, config.vocab_size)
        sync(device)
        t = time.perf_counter()
        if step == len(lengths):
            with profiled_step(out / "profile", step):
                metrics = policy.train_step(batch, mini_batch_rows=32)
        else:
            metrics = policy.train_step(batch, mini_batch_rows=32)
        sync(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        steps.append(
            {
                "step": step,
                "row_tokens": length,
                "wall_s": time.perf_counter() - t,
                **{k: metrics.get(k, 0.0) for k in keys},
            }
        )
        print(json.dumps(steps[-1]), flush=True)
    emit(
        "offload_app_update",
        {
            "parameters_b": sum(p.numel() for p in model.parameters()) / 1e9,
            "inflight_mb": args.inflight_mb,
            "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING", ""),
            "steps": steps,
        },
    )


if __name__ == "__main__":
    main()
