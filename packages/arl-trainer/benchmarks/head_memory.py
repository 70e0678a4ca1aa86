"""Benchmark (c): peak memory and time of the LM head + log-prob, naive vs chunked, at 8k and 32k tokens.

    python packages/arl-trainer/benchmarks/head_memory.py

Qwen2.5-7B head shape (hidden 3584, vocabulary 152064) and Qwen2.5-0.5B's (hidden 896, vocabulary
151936), bf16 hidden states and weight, forward + backward of Σ log π(target). Naive: `hidden @ W.T`
→ fp32 → log_softmax → gather (what a plain HF step does). Chunked: `arl.trainer.head.chunked_log_probs`.
GEMMs only: the three matmuls either needs (logits, and the two of backward) and nothing else — the
floor for any head. Peak is measured above what the inputs and their gradients already hold; time is
the best of 3 after a warm-up. Prints one JSON block; writes $OUT/head_memory.json.
"""

from __future__ import annotations

import gc
import time

import _common  # noqa: F401
import torch
from _common import SMOKE, bench_device, emit, empty_cache, is_oom, peak_gib, reset_peak, sync

SHAPES = {"7b": (64, 512), "0.5b": (32, 512)} if SMOKE else {"7b": (3584, 152064), "0.5b": (896, 151936)}
TOKENS = (256, 1024) if SMOKE else (8192, 32768)


def naive(hidden, weight, targets):
    logits = (hidden @ weight.t()).float()
    return torch.log_softmax(logits, -1).gather(1, targets[:, None]).squeeze(1)


def chunked(hidden, weight, targets):
    from arl.trainer.head import chunked_log_probs

    return chunked_log_probs(hidden, weight, targets)[0]


def gemms_only(hidden, weight, targets):
    """Forward logits and backward's two GEMMs, through autograd: the head's matmul floor."""
    return (hidden @ weight.t())[:, :1].float().squeeze(1)


def measure(fn, n, hidden_size, vocab, device, reps=3):
    g = torch.Generator(device=device).manual_seed(0)
    hidden = (
        (torch.randn(n, hidden_size, device=device, generator=g) * 0.5).to(torch.bfloat16).requires_grad_()
    )
    weight = (
        (torch.randn(vocab, hidden_size, device=device, generator=g) * 0.02)
        .to(torch.bfloat16)
        .requires_grad_()
    )
    targets = torch.randint(0, vocab, (n,), device=device, generator=g)
    hidden.grad = torch.zeros_like(hidden)
    weight.grad = torch.zeros_like(weight)
    sync(device)
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    reset_peak(device)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        logp = fn(hidden, weight, targets)
        logp.sum().backward()
        sync(device)
        best = min(best, time.perf_counter() - t)
    out = {
        "peak_above_inputs_gib": peak_gib(device) - base / 2**30,
        "fwd_bwd_s": best,
        "logp_sum": float(logp.sum()),
    }
    del hidden, weight, targets, logp
    return out


def best_time(fn, device, reps=10):
    fn()
    sync(device)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def chunk_passes(vocab: int, device: torch.device) -> dict:
    """GB/s of each per-chunk pass over one full chunk of bf16 logits (bytes read + written / time)."""
    from arl.trainer.head import DEFAULT_CHUNK_ELEMENTS, _chunk_rows, _logit_grads, _logit_stats
    from arl.trainer.head_triton import logit_grads, logit_stats

    rows = _chunk_rows(vocab, DEFAULT_CHUNK_ELEMENTS)
    z = torch.randn(rows, vocab, device=device).mul(3).to(torch.bfloat16)
    lse, _ = logit_stats(z, 1.0, torch.float32)
    a, b, c = (torch.randn(rows, device=device) for _ in range(3))
    targets = torch.randint(0, vocab, (rows,), device=device)
    out = torch.empty_like(z)
    nbytes = z.numel() * z.element_size()
    inductor_stats = torch.compile(_logit_stats, dynamic=True)
    compiled_grads = torch.compile(_logit_grads, dynamic=True)
    times = {
        "copy": (2 * nbytes, best_time(lambda: out.copy_(z), device)),
        "stats_triton": (nbytes, best_time(lambda: logit_stats(z, 1.0, torch.float32), device)),
        "stats_inductor": (nbytes, best_time(lambda: inductor_stats(z, 1.0, torch.float32), device)),
        "grads_inductor": (
            2 * nbytes,
            best_time(lambda: compiled_grads(z, lse, a, b, 1.0, torch.float32), device),
        ),
        # the Triton pass also adds c at the target (what Inductor's pass left to a gather + scatter)
        "grads_triton": (2 * nbytes, best_time(lambda: logit_grads(z, lse, a, b, c, targets, 1.0), device)),
    }
    res = {"rows": rows, "vocab": vocab}
    for name, (moved, sec) in times.items():
        res[f"{name}_ms"] = sec * 1e3
        res[f"{name}_gbps"] = moved / sec / 1e9
    res["stats_inductor_over_triton_time"] = res["stats_inductor_ms"] / res["stats_triton_ms"]
    res["stats_triton_fraction_of_copy_rate"] = res["stats_triton_gbps"] / res["copy_gbps"]
    res["grads_inductor_over_triton_time"] = res["grads_inductor_ms"] / res["grads_triton_ms"]
    res["grads_triton_fraction_of_copy_rate"] = res["grads_triton_gbps"] / res["copy_gbps"]
    return res


def main() -> None:
    device = bench_device()
    result = {"benchmark": "head_memory", "shapes": SHAPES, "dtype": "bfloat16", "runs": {}}
    if device.type == "cuda":
        result["chunk_passes"] = chunk_passes(SHAPES["0.5b"][1], device)
        print("chunk_passes", result["chunk_passes"], flush=True)
    for shape, (hidden_size, vocab) in SHAPES.items():
        for n in TOKENS:
            for name, fn in (("chunked", chunked), ("naive", naive), ("gemms_only", gemms_only)):
                key = f"{shape}_{name}_{n}"
                try:
                    measure(fn, min(n, 1024), hidden_size, vocab, device, reps=1)  # warm-up kernels
                    result["runs"][key] = measure(fn, n, hidden_size, vocab, device)
                except Exception as exc:
                    if not is_oom(exc):
                        raise
                    result["runs"][key] = {"error": f"OOM: {str(exc)[:200]}"}
                gc.collect()
                empty_cache(device)
                print(key, result["runs"][key], flush=True)
            runs = result["runs"]
            c, v, m = (runs.get(f"{shape}_{name}_{n}", {}) for name in ("chunked", "naive", "gemms_only"))
            if (
                "peak_above_inputs_gib" in c
                and "peak_above_inputs_gib" in v
                and c["peak_above_inputs_gib"] > 0
            ):
                result[f"{shape}_memory_ratio_naive_over_chunked_{n}"] = (
                    v["peak_above_inputs_gib"] / c["peak_above_inputs_gib"]
                )
                result[f"{shape}_logp_sum_rel_diff_{n}"] = abs(c["logp_sum"] - v["logp_sum"]) / abs(
                    v["logp_sum"]
                )
                result[f"{shape}_time_ratio_chunked_over_naive_{n}"] = c["fwd_bwd_s"] / v["fwd_bwd_s"]
            if "fwd_bwd_s" in c and "fwd_bwd_s" in m:
                result[f"{shape}_time_ratio_chunked_over_gemms_{n}"] = c["fwd_bwd_s"] / m["fwd_bwd_s"]
    emit("head_memory", result)


if __name__ == "__main__":
    main()
