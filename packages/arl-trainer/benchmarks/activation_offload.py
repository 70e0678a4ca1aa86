"""Benchmark: peak GPU memory and step time with activation offload off / on, Qwen2.5-0.5B shape, one GPU.

    python packages/arl-trainer/benchmarks/activation_offload.py

The same random-init model and batch (16 rows × 4096 tokens = 64k tokens, 16k-token packed
micro-batches, bf16 autocast, fp32 AdamW) through `HFPolicy.train_step` with activation
checkpointing none / selective / full, each with `activation_offload` off and on. Reports the update
phase's peak memory (`peak_mem_update_gib`), step time, tokens/s and the GiB of saved activations that
crossed to pinned host memory per step; ratios on/off side by side. Pinned host memory needed: one
micro-batch's saved activations (~25 GiB at 16k tokens without checkpointing). One JSON block;
$OUT/activation_offload.json.
"""

from __future__ import annotations

import gc
import os

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
import time

import _common  # noqa: F401  (sys.path for arl.*)
import torch
from _common import SMOKE, bench_device, emit, empty_cache, fixed_length_batch, is_oom, qwen25_config, sync

ROWS, LENGTH, BUDGET = (4, 256, 512) if SMOKE else (16, 4096, 16384)
STEPS = 1 if SMOKE else 2


def bench(cfg, batch, device, checkpointing: str, offload: bool) -> dict:
    from transformers import Qwen2ForCausalLM

    from arl.trainer import HFPolicy, TrainerConfig
    from arl.trainer.algorithm_config import AlgorithmConfig
    from arl.trainer.config import OptimConfig

    torch.manual_seed(0)
    tcfg = TrainerConfig(
        optim=OptimConfig(lr=1e-6),
        max_tokens_per_microbatch=BUDGET,
        mixed_precision="bf16",
        algorithm=AlgorithmConfig(proximal_mode="bypass"),
        activation_checkpointing=checkpointing,
        activation_offload=offload,
    )
    policy = HFPolicy(Qwen2ForCausalLM(cfg), tcfg, device=str(device))
    try:
        policy.train_step(batch, mini_batch_rows=ROWS)  # warm-up: allocator, kernels, pinned host blocks
        sync(device)
        t = time.perf_counter()
        peaks, last = [], {}
        for _ in range(STEPS):
            last = policy.train_step(batch, mini_batch_rows=ROWS)
            peaks.append(last.get("peak_mem_update_gib", 0.0))
        sync(device)
        step_s = (time.perf_counter() - t) / STEPS
        return {
            "step_s": step_s,
            "tokens_per_s": last["train_tokens"] / step_s,
            "peak_mem_update_gib": max(peaks),
            "offloaded_gib_per_step": last.get("offloaded_gib", 0.0),
            "microbatches": last.get("microbatches"),
        }
    finally:
        del policy
        gc.collect()
        empty_cache(device)


def main() -> None:
    device = bench_device()
    cfg = qwen25_config("0.5b", max_len=LENGTH)
    batch = fixed_length_batch(ROWS, LENGTH, 64, cfg.vocab_size)
    result = {
        "benchmark": "activation_offload",
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "rows": ROWS,
        "row_tokens": LENGTH,
        "max_tokens_per_microbatch": BUDGET,
        "runs": {},
        "ratios_on_over_off": {},
    }
    for ckpt in ("none", "selective", "full"):
        for offload in (False, True):
            name = f"{ckpt}_offload_{'on' if offload else 'off'}"
            try:
                result["runs"][name] = bench(cfg, batch, device, ckpt, offload)
            except Exception as exc:  # an OOM (or any failure) is a result of its configuration; keep going
                if not is_oom(exc):
                    import traceback

                    traceback.print_exc()
                gc.collect()
                empty_cache(device)
                result["runs"][name] = {
                    "error": ("OOM: " if is_oom(exc) else "") + f"{type(exc).__name__}: {str(exc)[:300]}"
                }
            print(name, result["runs"][name], flush=True)
        off, on = result["runs"][f"{ckpt}_offload_off"], result["runs"][f"{ckpt}_offload_on"]
        if "error" not in off and "error" not in on:
            result["ratios_on_over_off"][ckpt] = {
                "peak_mem": on["peak_mem_update_gib"] / off["peak_mem_update_gib"]
                if off["peak_mem_update_gib"]
                else None,
                "step_time": on["step_s"] / off["step_s"],
            }
    emit("activation_offload", result)


if __name__ == "__main__":
    main()
