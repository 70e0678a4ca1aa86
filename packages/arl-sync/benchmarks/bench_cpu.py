"""CPU benchmark: a full sync of a Qwen2.5-0.5B-shaped state dict over the "cpu" (shared-memory)
transport, against a plain memory copy of the same bytes measured in the same run.

    uv run python packages/arl-sync/benchmarks/bench_cpu.py [--buckets 4,16,64,256] [--rounds 5]

The receiver runs in a separate (spawned) process; a sync is timed on the sender from the first
tensor to the receiver's confirmation, staging included, apply excluded.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_shapes import make_state_dict, total_bytes  # noqa: E402

from arl.sync import SyncConfig, WeightReceiver, WeightSender  # noqa: E402

MiB = 1 << 20


def receiver_main(address: str, cfg: SyncConfig, rounds: int, threads: int) -> None:
    if threads:
        torch.set_num_threads(threads)
    with WeightReceiver(address, cfg) as r:
        for _ in range(rounds):
            r.receive(timeout_s=120)


def memcpy_gbps(nbytes: int, reps: int = 5) -> tuple[float, float]:
    """(one contiguous copy, per-tensor copy into preallocated tensors) in GB/s, best of `reps`."""
    src = torch.empty(nbytes, dtype=torch.uint8)
    src.random_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9, best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--buckets", default="4,16,64,256", help="bucket sizes in MiB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the 24 layers")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per process (0: default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sd = make_state_dict(getattr(torch, args.dtype), scale=args.scale)
    nbytes = total_bytes(sd)
    mc, mc_s = memcpy_gbps(nbytes)
    print(
        f"state dict: {len(sd)} tensors, {nbytes / 1e9:.3f} GB ({args.dtype}); cores={os.cpu_count()} "
        f"torch threads={torch.get_num_threads()}"
    )
    print(f"limit: plain memory copy of the same bytes: {mc:.2f} GB/s ({mc_s * 1e3:.1f} ms)")
    naive_t = time.perf_counter()
    _ = {k: v.clone() for k, v in sd.items()}
    naive = nbytes / (time.perf_counter() - naive_t) / 1e9
    print(f"baseline: per-tensor clone (fresh memory): {naive:.2f} GB/s")
    ctx = mp.get_context("spawn")
    print(f"{'bucket MiB':>10} {'best GB/s':>10} {'median':>8} {'% of memcpy':>12} {'first sync':>10}")
    for mb in [int(x) for x in args.buckets.split(",")]:
        cfg = SyncConfig(transport="cpu", bucket_bytes=mb * MiB, timeout_s=120)
        with WeightSender(cfg, num_receivers=1) as s:
            p = ctx.Process(target=receiver_main, args=(s.address, cfg, args.rounds + 1, args.threads))
            p.start()
            first = s.send(sd, version=0)
            rates = [s.send(sd, version=v).gbps for v in range(1, args.rounds + 1)]
            p.join(60)
        best, med = max(rates), statistics.median(rates)
        print(f"{mb:>10} {best:>10.2f} {med:>8.2f} {100 * best / mc:>11.0f}% {first.gbps:>10.2f}")
        # Re-measure the limit between runs to catch drift.
    mc2, _ = memcpy_gbps(nbytes)
    print(f"limit re-measured at the end: {mc2:.2f} GB/s")


if __name__ == "__main__":
    main()
