"""One-GPU benchmark (H200): the CUDA IPC path and the host-staged path, each against the limit
measured in the same run, with the naive per-tensor copy as the baseline; bucket size swept.

    PYTHONPATH=packages/arl-sync/src python3 packages/arl-sync/benchmarks/bench_gpu.py \
        [--model 0.5b|7b] [--buckets 4,16,64,256] [--rounds 5] [--paths ipc,host_gpu,host_cpu]

Paths (sender tensors are on cuda:0 in every case; the receiver is another process):
  ipc       transport "cuda_ipc", receiver staging on cuda:0    limit: one device-to-device copy
            (one copy: the sender writes into the receiver's exported staging buffer)
  host_gpu  transport "cpu" (pinned shm), receiver on cuda:0    limit: min(pinned D2H, pinned H2D)
  host_cpu  transport "cpu" (pinned shm), receiver on the CPU   limit: pinned D2H
Baselines: per-tensor `.cpu()` (what a naive sync does), per-tensor `.clone()` on the device.
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
from arl.sync.plan import pack_chunks, plan_buckets  # noqa: E402

MiB = 1 << 20


def receiver_worker(q, answers) -> None:
    """Serves (address, cfg, rounds, device) jobs from the queue until None; ("export", nbytes) puts the
    CUDA IPC handle of a fresh buffer of its own on `answers` and holds the buffer until the next job."""
    held = None
    while (job := q.get()) is not None:
        held = None
        if job[0] == "export":
            from torch.multiprocessing.reductions import reduce_tensor

            held = torch.empty(job[1], dtype=torch.uint8, device="cuda:0")
            answers.put(reduce_tensor(held))
            continue
        address, cfg, rounds, device = job
        with WeightReceiver(address, cfg, device=device) as r:
            for _ in range(rounds):
                r.receive(timeout_s=300)


def placed_views(dst: torch.Tensor, srcs: list[torch.Tensor]) -> list[torch.Tensor]:
    """A view of the uint8 buffer `dst` for each tensor, laid out back to back."""
    views, off = [], 0
    for v in srcs:
        views.append(dst[off : off + v.numel() * v.element_size()].view(v.dtype).view(v.shape))
        off += v.numel() * v.element_size()
    return views


def per_tensor_copy_rate(dst: torch.Tensor, srcs: list[torch.Tensor]) -> float:
    """GB/s of copying every tensor into its place in the uint8 buffer `dst`, one `copy_` each."""
    views = placed_views(dst, srcs)
    nbytes = sum(v.numel() * v.element_size() for v in srcs)
    return nbytes / timed(lambda: [d.copy_(x, non_blocking=True) for d, x in zip(views, srcs)]) / 1e9


def timed(fn, reps: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="0.5b")
    ap.add_argument("--buckets", default="4,16,64,256")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--paths", default="ipc,host_gpu,host_cpu")
    ap.add_argument(
        "--profile", action="store_true", help="print a cProfile of one more send per bucket size"
    )
    ap.add_argument(
        "--json", default="", help="write the results here (default: $OUT/bench_gpu_<model>.json)"
    )
    args = ap.parse_args()
    results: dict = {"model": args.model, "rows": []}
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    sd = make_state_dict(torch.bfloat16, device="cuda", model=args.model)
    n = total_bytes(sd)
    print(
        f"GPU: {torch.cuda.get_device_name(0)}; model {args.model}: {len(sd)} tensors, {n / 1e9:.3f} GB bf16"
    )
    a = torch.empty(n + 256 * len(sd), dtype=torch.uint8, device=dev)  # room for the stream's alignment
    b = torch.empty_like(a)
    h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    lim = {
        "d2d": n / timed(lambda: b[:n].copy_(a[:n])) / 1e9,
        "d2h": n / timed(lambda: h.copy_(a[:n], non_blocking=True)) / 1e9,
        "h2d": n / timed(lambda: a[:n].copy_(h, non_blocking=True)) / 1e9,
    }
    # Packing floors: every tensor into its place in one flat buffer, one copy launch per tensor vs one
    # batched `_foreach_copy_`.
    srcs = list(sd.values())
    views = placed_views(a, srcs)
    lim["pack_per_tensor"] = per_tensor_copy_rate(a, srcs)
    lim["pack_foreach"] = n / timed(lambda: torch._foreach_copy_(views, srcs, non_blocking=True)) / 1e9

    # What the transports run: the stream planned in 1 GiB buckets, each packed by `pack_chunks` (a copy
    # per large chunk, the small ones batched), the planning included.
    def plan_and_pack() -> None:
        for bucket in plan_buckets(sd.items(), 1 << 30, 256):
            pack_chunks(a[bucket.index << 30 :], bucket.chunks, non_blocking=True)

    lim["pack_chunks"] = n / timed(plan_and_pack) / 1e9
    # The per-tensor copies alternated over two streams (does overlapping copies hide the gaps between them?)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]

    def two_streams() -> None:
        for st in streams:
            st.wait_stream(torch.cuda.current_stream())
        for i, (d, x) in enumerate(zip(views, srcs)):
            with torch.cuda.stream(streams[i % 2]):
                d.copy_(x, non_blocking=True)
        for st in streams:
            torch.cuda.current_stream().wait_stream(st)

    lim["pack_per_tensor_two_streams"] = n / timed(two_streams) / 1e9
    a = b = h = views = None  # frees them (a `del` would leave the closures above naming unbound names)
    ctx = mp.get_context("spawn")
    q, answers = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(target=receiver_worker, args=(q, answers), daemon=True)
    worker.start()
    # The same per-tensor copies into another process's buffer opened through CUDA IPC (what the
    # transport writes into): does a mapped destination make each copy launch dearer?
    q.put(("export", n))
    fn, fargs = answers.get(timeout=120)
    mapped = fn(*fargs)
    lim["pack_per_tensor_ipc"] = per_tensor_copy_rate(mapped, srcs)
    del mapped
    print(
        f"packing floors: per-tensor copy_ {lim['pack_per_tensor']:.1f} GB/s (into another process's CUDA IPC "
        f"buffer {lim['pack_per_tensor_ipc']:.1f}), _foreach_copy_ {lim['pack_foreach']:.1f} GB/s, planned and "
        f"packed as the transports do {lim['pack_chunks']:.1f} GB/s, per-tensor over two streams "
        f"{lim['pack_per_tensor_two_streams']:.1f} GB/s"
    )
    naive_cpu = n / timed(lambda: [v.cpu() for v in sd.values()], reps=2) / 1e9
    naive_clone = n / timed(lambda: [v.clone() for v in sd.values()]) / 1e9
    results.update(
        limits_gbps=lim,
        bytes=n,
        naive_cpu_gbps=naive_cpu,
        naive_clone_gbps=naive_clone,
        gpu=torch.cuda.get_device_name(0),
    )
    print(
        f"limits (same run): device-to-device copy {lim['d2d']:.1f} GB/s, pinned D2H {lim['d2h']:.1f} GB/s, "
        f"pinned H2D {lim['h2d']:.1f} GB/s"
    )
    print(
        f"baselines: per-tensor .cpu() {naive_cpu:.2f} GB/s; per-tensor .clone() on device {naive_clone:.1f} GB/s"
    )
    paths = {
        "ipc": ("cuda_ipc", "cuda:0", lim["d2d"], "D2D"),
        "host_gpu": ("cpu", "cuda:0", min(lim["d2h"], lim["h2d"]), "min(D2H,H2D)"),
        "host_cpu": ("cpu", "cpu", lim["d2h"], "D2H"),
    }
    print(
        f"{'path':>9} {'bucket MiB':>10} {'best GB/s':>10} {'median':>8} {'% of limit':>11} {'limit':>13} {'first':>7}"
    )
    for name in args.paths.split(","):
        transport, rdev, limit, lname = paths[name]
        for mb in [int(x) for x in args.buckets.split(",")]:
            cfg = SyncConfig(transport=transport, bucket_bytes=mb * MiB, timeout_s=300)
            with WeightSender(cfg, num_receivers=1, device=dev) as s:
                q.put((s.address, cfg, args.rounds + 1 + args.profile, rdev))
                first = s.send(sd, version=0)
                stats = [s.send(sd, version=v) for v in range(1, args.rounds + 1)]
                if args.profile:
                    import cProfile
                    import pstats

                    prof = cProfile.Profile()
                    prof.runcall(s.send, sd, version=args.rounds + 1)
                    pstats.Stats(prof).sort_stats("tottime").print_stats(14)
            rates = [st.gbps for st in stats]
            best, med = max(rates), statistics.median(rates)
            top = max(stats, key=lambda st: st.gbps)
            phases = {
                k: getattr(top, k) * 1e3
                for k in ("setup_seconds", "stream_seconds", "land_seconds", "confirm_seconds")
            }
            print(
                f"{name:>9} {mb:>10} {best:>10.1f} {med:>8.1f} {100 * best / limit:>10.0f}% "
                f"{lname:>13} {first.gbps:>7.1f}   best round ms: "
                + " ".join(f"{k.split('_')[0]} {v:.2f}" for k, v in phases.items()),
                flush=True,
            )
            results["rows"].append(
                dict(
                    path=name,
                    bucket_mb=mb,
                    best_gbps=best,
                    median_gbps=med,
                    fraction_of_limit=best / limit,
                    limit=lname,
                    first_gbps=first.gbps,
                    best_round_ms=phases,
                    buckets=top.buckets,
                    tensors=top.tensors,
                )
            )
    q.put(None)
    worker.join(60)
    import json

    ipc = [row for row in results["rows"] if row["path"] == "ipc"]
    if ipc:
        top = max(ipc, key=lambda row: row["best_gbps"])
        results["ipc_best_fraction_of_d2d"] = top["fraction_of_limit"]
        print(
            f"cuda_ipc best: {top['best_gbps']:.1f} GB/s = {100 * top['fraction_of_limit']:.0f}% of the same-run "
            f"device-to-device copy ({lim['d2d']:.1f} GB/s), bucket {top['bucket_mb']} MiB"
        )
    out = args.json or (
        os.path.join(os.environ["OUT"], f"bench_gpu_{args.model}.json") if os.environ.get("OUT") else ""
    )
    if out:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
    print("RESULT " + json.dumps({k: v for k, v in results.items() if k != "rows"}))


if __name__ == "__main__":
    main()
