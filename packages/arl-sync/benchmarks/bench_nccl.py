"""Multi-GPU benchmark: the "nccl" transport from rank 0 (sender) to every other GPU (receivers),
against the bandwidth of a bare NCCL broadcast of the same bytes measured alone in the same run
(through torch.distributed and through CuPy, the binding arl-sync uses).

    NCCL_NVLS_ENABLE=0 PYTHONPATH=packages/arl-sync/src \
        python3 packages/arl-sync/benchmarks/bench_nccl.py [--gpus 2] [--model 0.5b,7b] [--buckets 4,16,64,256,1024]

One process per GPU. Every round changes every tensor's bits on the sender, and every receiver compares
what arrived bit for bit with a reference broadcast through torch.distributed after the (timed) sync.
One sender per bucket size: its first sync builds the NCCL group, the later ones must reuse it
(the `groups` column counts the groups built). `--same-gpu` puts every rank on cuda:0 (NCCL normally
refuses that; it is a probe).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_shapes import make_state_dict, total_bytes  # noqa: E402

from arl.sync import SyncConfig, WeightReceiver, WeightSender  # noqa: E402
from arl.sync.net import free_port  # noqa: E402

MiB = 1 << 20


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as integers, so that comparisons are bit for bit (NaN patterns included)."""
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.uint8)


def bench_model(rank: int, world: int, dev: torch.device, model: str, args) -> None:
    sd = make_state_dict(torch.bfloat16, device=str(dev), model=model) if rank == 0 else None
    n = torch.tensor([total_bytes(sd) if sd else 0], device=dev)
    dist.broadcast(n, 0)
    n = int(n.item())
    buf = torch.empty(n, dtype=torch.uint8, device=dev)

    def bench(fn, reps=5):
        times = []
        for _ in range(reps + 1):
            dist.barrier()
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            dist.barrier()
            times.append(time.perf_counter() - t)
        return min(times[1:])

    t_torch = bench(lambda: dist.broadcast(buf, 0))
    from arl.sync.transports.nccl import _nccl

    nccl = _nccl()
    uid = [nccl.get_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, 0)
    import cupy

    with cupy.cuda.Device(dev.index):
        comm = nccl.NcclCommunicator(world, uid[0], rank)
    stream = torch.cuda.current_stream(dev)
    t_cupy = bench(lambda: comm.bcast(buf.data_ptr(), n, nccl.NCCL_UINT8, 0, stream.cuda_stream))
    comm.destroy()
    buf = None  # frees it (a `del` would leave the lambdas above naming an unbound name)
    torch.cuda.empty_cache()
    limit = n / min(t_torch, t_cupy) / 1e9
    if rank == 0:
        ntensors = len(sd)
        print(
            f"{world} ranks, model {model}: {ntensors} tensors, {n / 1e9:.3f} GB bf16; NCCL {nccl.get_version()}"
        )
        print(
            f"limit (same run): bare broadcast of {n / 1e9:.2f} GB: torch.distributed {n / t_torch / 1e9:.1f} GB/s, "
            f"cupy {n / t_cupy / 1e9:.1f} GB/s"
        )
        print(
            f"{'bucket MiB':>10} {'best GB/s':>10} {'median':>8} {'% of limit':>11} {'first sync s':>13} "
            f"{'groups':>7} {'bit-exact':>10}",
            flush=True,
        )
    ref: list[torch.Tensor] | None = None
    for mb in [int(x) for x in args.buckets.split(",")]:
        cfg = SyncConfig(transport="nccl", bucket_bytes=mb * MiB, timeout_s=300)
        bad = torch.zeros(1, dtype=torch.int64, device=dev)
        checked = 0
        if rank == 0:
            assert sd is not None
            s = WeightSender(cfg, num_receivers=world - 1, device=dev)
            dist.broadcast_object_list([s.address], 0)
            rates, first = [], 0.0
            for v in range(args.rounds + 1):
                for t in sd.values():  # new bits every round: a stale byte cannot pass the check
                    _bits(t).add_(1)
                torch.cuda.synchronize(dev)
                st = s.send(sd, version=v)
                if v == 0:
                    first = st.seconds  # includes NCCL group creation
                else:
                    rates.append(st.gbps)
                for t in sd.values():  # the reference, outside the timed sync
                    dist.broadcast(t, 0)
                checked += 1
            groups = s._transport.groups_built  # type: ignore[attr-defined]
            s.close()
        else:
            addr = [None]
            dist.broadcast_object_list(addr, 0)
            with WeightReceiver(addr[0], cfg, device=dev) as r:
                for v in range(args.rounds + 1):
                    got = r.receive(timeout_s=300)
                    assert got == v, (got, v)
                    staged = r.staged()
                    if ref is None:
                        ref = [torch.empty_like(t) for _, t in staged]
                    for (_, t), want in zip(staged, ref, strict=True):
                        dist.broadcast(want, 0)
                        if not torch.equal(_bits(t), _bits(want)):
                            bad += 1
                    checked += 1
        dist.all_reduce(bad)
        if rank == 0:
            print(
                f"{mb:>10} {max(rates):>10.1f} {statistics.median(rates):>8.1f} "
                f"{100 * max(rates) / limit:>10.0f}% {first:>13.3f} {groups:>7} "
                f"{'yes' if int(bad.item()) == 0 else f'NO ({int(bad.item())} tensors differ)':>10}"
                f"  ({checked} syncs checked)",
                flush=True,
            )
        dist.barrier()
    del sd, ref
    torch.cuda.empty_cache()


def worker(rank: int, world: int, port: int, args) -> None:
    dev = torch.device("cuda", 0 if args.same_gpu else rank)
    torch.cuda.set_device(dev)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=dev
    )
    for model in args.model.split(","):
        bench_model(rank, world, dev, model, args)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    ap.add_argument("--model", default="0.5b", help="comma-separated: 0.5b,7b")
    ap.add_argument("--buckets", default="4,16,64,256,1024")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--same-gpu", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    world = args.gpus if not args.same_gpu else max(2, args.gpus)
    if world < 2:
        sys.exit("needs >= 2 ranks (GPUs), or --same-gpu")
    port = free_port()
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=worker, args=(r, world, port, args)) for r in range(world)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(900)
    sys.exit(max(p.exitcode or 0 for p in ps))


if __name__ == "__main__":
    main()
