"""Benchmark: what KL to a reference policy costs, Qwen2.5-0.5B shape, one GPU.

    python packages/arl-trainer/benchmarks/reference_policy.py

The same random-init model and long-tail batch (128 rows, lognormal lengths, median ~1k, cap 8k;
16k-token packed micro-batches, bf16 autocast) through `HFPolicy.train_step` with `kl_coef` 0 and
0.001 (KL in the loss, k3), side by side: step time, the reference pass's time (`ref_s`) and peak
memory (`peak_mem_ref_gib`), the memory the reference's weights take (bf16 linears, fp32 embedding)
next to the policy's fp32 weights, and the step-1 KL (0 when the bf16 reference reproduces the
autocast policy exactly). One JSON block; $OUT/reference_policy.json.
"""

from __future__ import annotations

import gc
import os

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
import time

import _common  # noqa: F401  (sys.path for arl.*)
import torch
from _common import SMOKE, bench_device, emit, empty_cache, long_tail_lengths, qwen25_config, sync

ROWS = 16 if SMOKE else 128
STEPS = 1 if SMOKE else 3


def run(cfg, batch, device, kl_coef: float) -> dict:
    from transformers import Qwen2ForCausalLM

    from arl.trainer import HFPolicy, TrainerConfig
    from arl.trainer.algorithm_config import AlgorithmConfig
    from arl.trainer.config import OptimConfig

    torch.manual_seed(0)
    tcfg = TrainerConfig(
        optim=OptimConfig(lr=1e-5),
        max_tokens_per_microbatch=16384,
        mixed_precision="bf16",
        algorithm=AlgorithmConfig(proximal_mode="bypass", kl_coef=kl_coef),
    )
    policy = HFPolicy(Qwen2ForCausalLM(cfg), tcfg, device=str(device))
    nbytes = lambda m: sum(p.numel() * p.element_size() for p in m.parameters()) / 2**30  # noqa: E731
    try:
        rows = batch.input_ids.shape[0]
        first = policy.train_step(batch, mini_batch_rows=rows)  # also the warm-up
        sync(device)
        t = time.perf_counter()
        metrics = [policy.train_step(batch, mini_batch_rows=rows) for _ in range(STEPS)]
        sync(device)
        out = {
            "step_s": (time.perf_counter() - t) / STEPS,
            "policy_weights_gib": nbytes(policy.model),
            "peak_mem_update_gib": max(m.get("peak_mem_update_gib", 0.0) for m in metrics),
        }
        if kl_coef > 0:
            out.update(
                reference_weights_gib=nbytes(policy.ref_packed),
                kl_ref_mean_step1=first["kl_ref_mean"],
                kl_ref_mean_last=metrics[-1]["kl_ref_mean"],
                ref_s=sum(m["ref_s"] for m in metrics) / STEPS,
                peak_mem_ref_gib=max(m.get("peak_mem_ref_gib", 0.0) for m in metrics),
            )
        return out
    finally:
        del policy
        gc.collect()
        empty_cache(device)


def main() -> None:
    from train_05b import make_batch

    device = bench_device()
    cfg = qwen25_config("0.5b")
    lengths = long_tail_lengths(
        ROWS, median=128 if SMOKE else 1024, sigma=1.0, cap=512 if SMOKE else 8192, floor=140
    )
    batch = make_batch(lengths, cfg.vocab_size)
    result = {
        "benchmark": "reference_policy",
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "rows": ROWS,
        "tokens": int(batch.attention_mask.sum()),
    }
    result["no_kl"] = run(cfg, batch, device, 0.0)
    print("no_kl", result["no_kl"], flush=True)
    result["kl_in_loss"] = run(cfg, batch, device, 1e-3)
    print("kl_in_loss", result["kl_in_loss"], flush=True)
    result["step_time_ratio_kl_over_none"] = result["kl_in_loss"]["step_s"] / result["no_kl"]["step_s"]
    emit("reference_policy", result)


if __name__ == "__main__":
    main()
