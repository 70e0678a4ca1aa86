"""Benchmark: page-locked host memory for AdamW's state, a pinned tensor each vs one `HostArena`.

    python packages/arl-trainer/benchmarks/host_state_memory.py [--layers 4] [--embeddings]

The state `optimizer_offload` moves: two fp32 moments per parameter of the Qwen2.5-7B shape
(`--layers` decoder layers; `--embeddings` adds the embedding and LM head). Side by side in one run:
(a) what the offload did before, `torch.empty(shape, pin_memory=True)` per tensor (torch's pinned
allocator rounds each to a power of two), and (b) `HostArena` (one exact-size buffer registered with
`cudaHostRegister`), allocated twice: registered as it comes (the driver faults its pages in) and with
its pages touched on every core first (the default; the one whose copies are measured). Per way:
seconds to allocate, host bytes page-locked (a: the allocator's own count; b: the buffer), and GB/s of
the device→host and host→device copies of the whole state
(non_blocking, one stream, as the offload does); the arena's round trip is checked bit for bit.
One JSON block; $OUT/host_state_memory.json.
"""

from __future__ import annotations

import argparse
import time

import _common  # noqa: F401  (sys.path for arl.*)
import torch
from _common import QWEN25, emit

from arl.trainer.host_arena import HostArena


def state_specs(layers: int, embeddings: bool) -> list[tuple[tuple[int, ...], torch.dtype]]:
    c = QWEN25["7b"]
    h, inter, kv = (
        c["hidden_size"],
        c["intermediate_size"],
        c["num_key_value_heads"] * (c["hidden_size"] // c["num_attention_heads"]),
    )
    per_layer = [
        (h, h),
        (h,),
        (kv, h),
        (kv,),
        (kv, h),
        (kv,),
        (h, h),
        (inter, h),
        (inter, h),
        (h, inter),
        (h,),
        (h,),
    ]
    shapes = [s for _ in range(layers) for s in per_layer]
    if embeddings:
        shapes += [(c["vocab_size"], h), (c["vocab_size"], h)]
    return [(s, torch.float32) for s in shapes for _ in range(2)]  # exp_avg, exp_avg_sq


def timed(fn) -> tuple[float, object]:
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t, out


def copies(device_tensors: list[torch.Tensor], hosts: list[torch.Tensor]) -> tuple[float, float]:
    def d2h():
        for t, h in zip(device_tensors, hosts, strict=True):
            h.copy_(t, non_blocking=True)

    def h2d():
        for t, h in zip(device_tensors, hosts, strict=True):
            t.copy_(h, non_blocking=True)

    return timed(d2h)[0], timed(h2d)[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--embeddings", action="store_true")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_state_memory.py measures page-locked memory for a GPU: it needs CUDA")
    specs = state_specs(args.layers, args.embeddings)
    nbytes = sum(torch.Size(s).numel() * d.itemsize for s, d in specs)
    gen = torch.Generator(device="cuda").manual_seed(0)
    device_tensors = [torch.randn(s, dtype=d, device="cuda", generator=gen) for s, d in specs]
    reference = [t.clone() for t in device_tensors[:4]]
    result: dict = {"tensors": len(specs), "state_gib": nbytes / 2**30}

    before = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    alloc_s, hosts = timed(lambda: [torch.empty(s, dtype=d, pin_memory=True) for s, d in specs])
    locked = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0) - before
    d2h_s, h2d_s = copies(device_tensors, hosts)
    result["pinned_per_tensor"] = {
        "alloc_s": alloc_s,
        "locked_gib": locked / 2**30,
        "d2h_gbps": nbytes / d2h_s / 1e9,
        "h2d_gbps": nbytes / h2d_s / 1e9,
    }
    del hosts
    torch._C._host_emptyCache()  # return the cached pinned blocks before the arena takes its own

    # The registration alone first (the driver faults the pages in), then with the pages touched on
    # every core before it (HostArena's default); the second arena is the one measured below.
    untouched_s, arena = timed(lambda: HostArena(specs, pinned=True, touch_first=False))
    del arena
    alloc_s, arena = timed(lambda: HostArena(specs, pinned=True))
    d2h_s, h2d_s = copies(device_tensors, arena.views)  # the arena now holds the state
    for t, view in zip(device_tensors[:4], arena.views, strict=False):  # back from the host only
        t.zero_()
        t.copy_(view, non_blocking=True)
    torch.cuda.synchronize()
    round_trip = all(torch.equal(t, ref) for t, ref in zip(device_tensors, reference, strict=False))
    result["arena"] = {
        "alloc_s": alloc_s,
        "alloc_untouched_s": untouched_s,
        "locked_gib": arena.nbytes / 2**30,
        "d2h_gbps": nbytes / d2h_s / 1e9,
        "h2d_gbps": nbytes / h2d_s / 1e9,
        "views_pinned": all(v.is_pinned() for v in arena.views[:8]),
        "round_trip_equal": round_trip,
    }
    a, b = result["pinned_per_tensor"], result["arena"]
    result["ratios"] = {
        "locked_per_tensor_over_arena": a["locked_gib"] / b["locked_gib"],
        "alloc_per_tensor_over_arena": a["alloc_s"] / b["alloc_s"],
        "alloc_untouched_over_touched": b["alloc_untouched_s"] / b["alloc_s"],
        "d2h_arena_over_per_tensor": b["d2h_gbps"] / a["d2h_gbps"],
        "h2d_arena_over_per_tensor": b["h2d_gbps"] / a["h2d_gbps"],
    }
    emit("host_state_memory", result)


if __name__ == "__main__":
    main()
