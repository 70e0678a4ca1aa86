"""A 7B weight sync into a real vLLM replica on the same GPU (CUDA IPC), against a same-run device copy.

    source .device-stage/bin/env.sh   # without uv: the staged vLLM first (tools/README.md)
    python packages/arl-rollout/benchmarks/sync_7b_vllm.py [--rounds 4] [--bucket-mb 1024] [--source fsdp2]

The trainer side (`--source`):
* `state-dict` (default): a Qwen2.5-7B-shaped bf16 state dict on cuda:0 (random values, 15.2 GB in
  339 tensors; what a single-device trainer's `named_parameters_for_sync` hands over).
* `fsdp2`: arl-trainer's `FSDPPolicy` of the same shape as one FSDP2 rank (fp32 master shards, bf16
  mixed precision), streaming `named_parameters_for_sync()`: each parameter cast to bf16 and gathered
  (`full_tensor`) one at a time as the sender draws it, exactly what an FSDP2 trainer's sync sends. With
  one rank the gather moves nothing between GPUs; `gather_only_s` times drawing the stream alone.
The rollout side is arl's `VllmEngine` (vLLM's AsyncLLM, started with random "dummy" weights from a
config alone: nothing to download or write) whose worker receives through arl-sync and loads the
tensors into vLLM's own parameters in place (fused q/k/v and gate/up). Each round changes every tensor
on the sender first. Reported per round: the sender's phases (`SyncStats`), the engine's (`rpc_s`,
`receive_s`, `apply_s`, `reset_cache_s`) and GB/s of the whole `load_weights` call, beside one
device-to-device copy of the same bytes measured in the same run. After the last round the engine's
weights are checked against the sender's by digests taken where each side holds them
(`weights_digest`: the trainer side streams its tensors once more; `--check tensors` fetches them all
and compares tensor by tensor instead, vLLM's fused names mapped back).
Prints one JSON block; writes $OUT/sync_7b_vllm.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "arl-sync" / "benchmarks"))
from model_shapes import QWEN25_7B, make_state_dict, total_bytes  # noqa: E402

from arl.rollout.engines.weights_check import compare_weights  # noqa: E402
from arl.rollout.engines.weights_digest import compare_digests  # noqa: E402
from arl.sync import SyncConfig, WeightSender  # noqa: E402


def qwen25_7b_config(**extra: object):
    """The transformers config of the Qwen2.5-7B shape (both sides build their model from it)."""
    from transformers import Qwen2Config

    c = QWEN25_7B
    return Qwen2Config(
        vocab_size=c["vocab"],
        hidden_size=c["hidden"],
        intermediate_size=c["inter"],
        num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"],
        num_key_value_heads=c["kv_heads"],
        tie_word_embeddings=False,
        **extra,
    )


def write_config(directory: Path) -> None:
    qwen25_7b_config(max_position_embeddings=4096, torch_dtype="bfloat16").save_pretrained(directory)


def device_copy_gbps(nbytes: int) -> float:
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    del a, b
    torch.cuda.empty_cache()
    return nbytes / best / 1e9


class StateDictSource:
    """The trainer side as plain bf16 tensors on the GPU."""

    def __init__(self) -> None:
        self.named = list(make_state_dict(torch.bfloat16, device="cuda", model="7b").items())
        self.nbytes = total_bytes(dict(self.named))

    def parameters(self) -> list[torch.Tensor]:
        return [t for _, t in self.named]

    def stream(self) -> list[tuple[str, torch.Tensor]]:
        return self.named


class FSDP2Source:
    """The trainer side as arl-trainer's FSDP2 policy (one rank): every sync gathers shard by shard."""

    def __init__(self) -> None:
        from arl.sync.net import free_port
        from arl.trainer import TrainerConfig  # arl-rollout's `bench` group
        from arl.trainer.distributed import DistributedSpec
        from arl.trainer.fsdp import FSDPPolicy

        self.policy = FSDPPolicy(
            qwen25_7b_config(),
            TrainerConfig(mixed_precision="bf16"),
            DistributedSpec("127.0.0.1", free_port(), 0, 1),
            sync_dtype=torch.bfloat16,
        )
        self.named = list(self.policy.model.named_parameters())
        self.nbytes = sum(p.numel() for _, p in self.named) * 2  # sent as bf16

    def parameters(self) -> list[torch.Tensor]:
        return [p for _, p in self.named]

    def stream(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.policy.named_parameters_for_sync()  # a fresh gathering iterator per sync


async def main(args: argparse.Namespace) -> dict:
    from arl.rollout.engines.vllm_engine import VllmEngine, VllmEngineConfig

    source = FSDP2Source() if args.source == "fsdp2" else StateDictSource()
    nbytes = source.nbytes
    result: dict = {
        "benchmark": "sync_7b_vllm",
        "source": args.source,
        "gpu": torch.cuda.get_device_name(0),
        "tensors": len(source.named),
        "bytes": nbytes,
        "bucket_mb": args.bucket_mb,
        "d2d_gbps": device_copy_gbps(nbytes),
        "rounds": [],
    }
    if args.source == "fsdp2":
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in source.stream():
            pass
        torch.cuda.synchronize()
        result["gather_only_s"] = time.perf_counter() - t
    model_dir = Path(tempfile.mkdtemp(prefix="qwen25-7b-config-"))
    write_config(model_dir)
    engine = VllmEngine(
        VllmEngineConfig(
            model_path=str(model_dir),
            dtype="bfloat16",
            max_model_len=1024,
            enforce_eager=True,
            gpu_memory_utilization=args.gpu_memory_utilization,
            engine_args={"load_format": "dummy", "skip_tokenizer_init": True},
        )
    )
    t = time.perf_counter()
    await engine.start()
    result["engine_start_s"] = time.perf_counter() - t
    cfg = SyncConfig(transport="cuda_ipc", bucket_bytes=args.bucket_mb << 20, timeout_s=300)
    sender = WeightSender(cfg, num_receivers=1, device=torch.device("cuda", 0))
    try:
        for version in range(1, args.rounds + 1):
            with torch.no_grad():
                for p in source.parameters():
                    p.add_(1e-3)  # new bits everywhere
            torch.cuda.synchronize()
            t = time.perf_counter()
            stats, _ = await asyncio.gather(
                asyncio.to_thread(sender.send, source.stream(), version),
                engine.load_weights(sender.address, msgspec.json.encode(cfg), version),
            )
            wall = time.perf_counter() - t
            row = {
                "version": version,
                "wall_s": wall,
                "wall_gbps": nbytes / wall / 1e9,
                "sender_gbps": stats.gbps,
                "plan_reused": stats.plan_reused,
                **{
                    k: getattr(stats, k)
                    for k in ("setup_seconds", "stream_seconds", "land_seconds", "confirm_seconds")
                },
                **engine.last_sync,
            }
            result["rounds"].append(row)
            print(json.dumps(row), flush=True)
        timed = result["rounds"][1:] or result["rounds"]  # the first sync sizes and maps the buffers
        result["median_wall_s"] = statistics.median(r["wall_s"] for r in timed)
        result["median_sender_fraction_of_d2d"] = (
            statistics.median(r["sender_gbps"] for r in timed) / result["d2d_gbps"]
        )
        result["median_wall_fraction_of_d2d"] = (
            statistics.median(r["wall_gbps"] for r in timed) / result["d2d_gbps"]
        )
        t = time.perf_counter()
        if args.check == "tensors":
            check = compare_weights(
                {n: t.detach().cpu() for n, t in source.stream()}, await engine.worker_weights()
            )
        else:
            check = await asyncio.to_thread(
                compare_digests, source.stream(), await engine.worker_digests_per_rank()
            )
        result["check_s"] = time.perf_counter() - t
        result["weights_equal"] = bool(check["equal"])
        result["weights_check"] = {k: v for k, v in check.items() if k != "equal"}
    finally:
        sender.close()
        await engine.stop()
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--bucket-mb", type=int, default=1024)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--source", choices=["state-dict", "fsdp2"], default="state-dict")
    ap.add_argument("--check", choices=["digests", "tensors"], default="digests")
    res = asyncio.run(main(ap.parse_args()))
    text = json.dumps(res, indent=1, default=str)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "sync_7b_vllm.json").write_text(text)
