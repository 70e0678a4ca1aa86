"""Packed (varlen) causal attention on the CPU: arl's kernel path against SDPA's math kernel.

On the CPU, `arl.trainer.attention` runs scaled_dot_product_attention once per packed sequence. Given
3-D tensors SDPA silently takes its math kernel, which builds each sequence's s×s score matrix; given
4-D ones it takes the fused (flash) kernel. This times forward + backward over one packed row of
`--seqs` sequences of `--tokens` tokens (the tiny model's attention shape by default: 2 query heads,
1 KV head, head_dim 32), arl's path against the same call forced onto the math kernel, side by side
in one process, and prints the ratio.

    uv run python packages/arl-trainer/benchmarks/packed_attention_cpu.py [--seqs 8 --tokens 4400 --repeats 3]

Prints one JSON object; writes it to $OUT/packed_attention_cpu.json when $OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from arl.trainer.attention import varlen_causal


def fwd_bwd_seconds(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int
) -> float:
    for t in (q, k, v):
        t.grad = None
    start = time.perf_counter()
    varlen_causal(q, k, v, cu, max_len, None).sum().backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4400)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    total = args.seqs * args.tokens
    q = torch.randn(total, args.heads, args.head_dim, requires_grad=True)
    k = torch.randn(total, args.kv_heads, args.head_dim, requires_grad=True)
    v = torch.randn(total, args.kv_heads, args.head_dim, requires_grad=True)
    cu = torch.arange(0, total + 1, args.tokens, dtype=torch.int32)
    ours, math = [], []
    for _ in range(args.repeats):  # alternated, so that drift in the machine's load hits both alike
        ours.append(fwd_bwd_seconds(q, k, v, cu, args.tokens))
        with sdpa_kernel(SDPBackend.MATH):
            math.append(fwd_bwd_seconds(q, k, v, cu, args.tokens))
    result = {
        "shape": {
            k_: getattr(args, k_) for k_ in ("seqs", "tokens", "heads", "kv_heads", "head_dim", "threads")
        },
        "arl_s": round(statistics.median(ours), 3),
        "math_kernel_s": round(statistics.median(math), 3),
        "speedup": round(statistics.median(math) / statistics.median(ours), 2),
        "tokens_per_s": {
            "arl": round(total / statistics.median(ours)),
            "math": round(total / statistics.median(math)),
        },
        "load_1m": round(os.getloadavg()[0], 1),
    }
    print(json.dumps(result))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "packed_attention_cpu.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
