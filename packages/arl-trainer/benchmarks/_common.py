"""Shared bits of the arl-trainer GPU benchmarks: model shapes, length mixes, the matmul peak, output."""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from pathlib import Path

import torch

# Make `arl.*` importable when run from a checkout without installation (the device has no uv).
_ROOT = Path(__file__).resolve().parents[3]
for _src in ("packages/arl-trainer/src", "packages/arl-queue/src", "packages/arl-sync/src"):
    if str(_ROOT / _src) not in sys.path:
        sys.path.insert(0, str(_ROOT / _src))

QWEN25 = {
    "0.5b": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "7b": dict(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    ),
}


# ARL_BENCH_SMOKE=1: a tiny shape on whatever device there is, to check a script end to end on a CPU.
SMOKE = os.environ.get("ARL_BENCH_SMOKE") == "1"
TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)


def qwen25_config(size: str, max_len: int = 32768, shape: dict | None = None):
    """A Qwen2 config of `size`'s shape (`shape` instead where given; the tiny one under SMOKE)."""
    from transformers import Qwen2Config

    shape = TINY if SMOKE else (shape or QWEN25[size])
    return Qwen2Config(
        **shape,
        max_position_embeddings=max_len,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        use_sliding_window=False,
        attention_dropout=0.0,
    )


def bench_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if not SMOKE:
        raise SystemExit("no CUDA device (set ARL_BENCH_SMOKE=1 for a tiny CPU run)")
    return torch.device("cpu")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0


def empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def long_tail_lengths(
    n: int, *, median: int, sigma: float, cap: int, seed: int = 0, floor: int = 64
) -> list[int]:
    rng = random.Random(seed)
    return [min(cap, max(floor, int(rng.lognormvariate(0.0, sigma) * median))) for _ in range(n)]


def matmul_tflops(device: torch.device, n: int = 8192, iters: int = 20) -> float:
    """Dense bf16 matmul rate measured now, on this GPU: the MFU denominator."""
    if device.type != "cuda":
        n, iters = 256, 3
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    t = time.perf_counter()
    for _ in range(iters):
        a @ b
    sync(device)
    return 2 * n**3 * iters / (time.perf_counter() - t) / 1e12


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def emit(name: str, result: dict) -> None:
    text = json.dumps(result, indent=1, default=lambda o: round(o, 4) if isinstance(o, float) else str(o))
    print(text, flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(text)


def percentile(values: list[int], q: float) -> int:
    s = sorted(values)
    return s[min(len(s) - 1, math.floor(q * len(s)))]


def fixed_length_batch(rows: int, length: int, prompt: int, vocab: int):
    """A GRPO-shaped `TrainBatch` of `rows` rows of exactly `length` tokens (`prompt` of them the
    prompt): groups of up to 8 responses per prompt, random ids (seed 0), rewards 0/1 alternating."""
    from arl.queue.types import Response, Sample
    from arl.trainer import assemble_batch

    g = torch.Generator().manual_seed(0)
    n = length - prompt
    samples = []
    for i in range(0, rows, 8):
        responses = [
            Response(
                response_ids=torch.randint(0, vocab, (n,), generator=g).tolist(),
                response_mask=[1] * n,
                response_logprobs=[-1.0] * n,
                weight_versions=[0] * n,
                reward=float(j % 2),
            )
            for j in range(min(8, rows - i))
        ]
        samples.append(
            Sample(
                uid=str(i),
                prompt_ids=torch.randint(0, vocab, (prompt,), generator=g).tolist(),
                responses=responses,
                start_version=0,
                end_version=0,
            )
        )
    return assemble_batch(samples, pad_token_id=0)
