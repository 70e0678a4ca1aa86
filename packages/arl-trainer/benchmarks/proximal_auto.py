"""Benchmark: what the default proximal mode ("auto") saves against "recompute", side by side.

    python packages/arl-trainer/benchmarks/proximal_auto.py            # CUDA: Qwen2.5-0.5B shape
    ARL_BENCH_CPU=1 python packages/arl-trainer/benchmarks/proximal_auto.py   # CPU: a small shape

In a step of one optimizer update, "auto" takes the proximal log probs from the update's own forward
instead of a no-grad pass before it. Two policies of the same random-init model train the same
long-tail batch (groups of 8, one mini-batch), one with `proximal_mode = "recompute"` and one with
"auto", their steps interleaved so that both see the same machine; without KL and with KL to a
reference in the loss (k3 clamped, `kl_coef` 0.001). Reported: each mode's median step time, the ratio
auto / recompute, and the recompute pass's own time (`proximal_s`). One JSON block;
$OUT/proximal_auto.json.
"""

from __future__ import annotations

import gc
import os
import statistics
import time

import _common  # noqa: F401  (sys.path for arl.*)
import torch
from _common import SMOKE, emit, empty_cache, long_tail_lengths, qwen25_config, sync

CPU = os.environ.get("ARL_BENCH_CPU") == "1"
# On the CPU: a shape whose step takes about a second on two cores.
CPU_SHAPE = dict(
    vocab_size=8192,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)
ROWS = 16 if SMOKE else (32 if CPU else 128)
STEPS = 2 if SMOKE else 5


def policy_for(cfg, device: torch.device, mode: str, kl_coef: float):
    from transformers import Qwen2ForCausalLM

    from arl.trainer import HFPolicy, TrainerConfig
    from arl.trainer.algorithm_config import AlgorithmConfig
    from arl.trainer.config import OptimConfig

    torch.manual_seed(0)
    tcfg = TrainerConfig(
        optim=OptimConfig(lr=1e-5),
        max_tokens_per_microbatch=16384 if device.type == "cuda" else 4096,
        mixed_precision="bf16" if device.type == "cuda" else "no",
        algorithm=AlgorithmConfig(proximal_mode=mode, kl_coef=kl_coef),
    )
    return HFPolicy(Qwen2ForCausalLM(cfg), tcfg, device=str(device))


def compare(cfg, batch, device: torch.device, kl_coef: float) -> dict:
    rows = batch.input_ids.shape[0]
    policies = {mode: policy_for(cfg, device, mode, kl_coef) for mode in ("recompute", "auto")}
    times: dict[str, list[float]] = {mode: [] for mode in policies}
    proximal_s: list[float] = []
    try:
        for policy in policies.values():
            policy.train_step(batch, mini_batch_rows=rows)  # warm-up
        for _ in range(STEPS):
            for mode, policy in policies.items():
                sync(device)
                t = time.perf_counter()
                metrics = policy.train_step(batch, mini_batch_rows=rows)
                sync(device)
                times[mode].append(time.perf_counter() - t)
                if mode == "recompute":
                    proximal_s.append(metrics["proximal_s"])
                else:
                    assert metrics["proximal_reused"] == 1.0, "auto did not reuse in a one-update step"
    finally:
        del policies
        gc.collect()
        empty_cache(device)
    med = {mode: statistics.median(ts) for mode, ts in times.items()}
    return {
        "recompute_step_s": med["recompute"],
        "auto_step_s": med["auto"],
        "auto_over_recompute": med["auto"] / med["recompute"],
        "recompute_proximal_s": statistics.median(proximal_s),
    }


def main() -> None:
    from train_05b import make_batch

    device = torch.device("cuda" if torch.cuda.is_available() and not CPU else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(os.cpu_count() or 1)
    cfg = qwen25_config("0.5b", shape=CPU_SHAPE if CPU else None)
    small = SMOKE or CPU
    lengths = long_tail_lengths(
        ROWS, median=256 if small else 1024, sigma=1.0, cap=1024 if small else 8192, floor=140
    )
    batch = make_batch(lengths, cfg.vocab_size)
    result = {
        "benchmark": "proximal_auto",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x{os.cpu_count()}",
        "torch": torch.__version__,
        "shape": {k: getattr(cfg, k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")},
        "rows": ROWS,
        "tokens": int(batch.attention_mask.sum()),
        "steps": STEPS,
    }
    for name, kl_coef in (("no_kl", 0.0), ("kl_in_loss", 1e-3)):
        result[name] = compare(cfg, batch, device, kl_coef)
        print(name, result[name], flush=True)
    emit("proximal_auto", result)


if __name__ == "__main__":
    main()
