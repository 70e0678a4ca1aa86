"""A 7B weight sync into a real vLLM replica on the same GPU (CUDA IPC), against a same-run device copy.

    source .device-stage/bin/env.sh   # vLLM on the device machine (../shared/tools/device-vllm)
    python packages/arl-rollout/benchmarks/sync_7b_vllm.py [--rounds 4] [--bucket-mb 1024]

The trainer side is a Qwen2.5-7B-shaped bf16 state dict on cuda:0 (random values, 15.2 GB in 339
tensors; what a trainer's `named_parameters_for_sync` hands over) and arl-sync's `WeightSender`; the
rollout side is arl's `VllmEngine` (vLLM's AsyncLLM, started with random "dummy" weights from a config
alone: nothing to download or write) whose worker receives through arl-sync and loads the tensors
into vLLM's own parameters in place (fused q/k/v and gate/up). Each round changes every tensor on
the sender first. Reported per round: the sender's phases (`SyncStats`), the engine's (`rpc_s`,
`receive_s`, `apply_s`, `reset_cache_s`) and GB/s of the whole `load_weights` call, beside one
device-to-device copy of the same bytes measured in the same run. After the last round the engine's
weights are compared with the sender's, tensor by tensor (vLLM's fused names mapped back).
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
from pathlib import Path

import msgspec
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "arl-sync" / "benchmarks"))
from model_shapes import QWEN25_7B, make_state_dict, total_bytes  # noqa: E402

from arl.rollout.engines.weights_check import compare_weights  # noqa: E402
from arl.sync import SyncConfig, WeightSender  # noqa: E402


def write_config(directory: Path) -> None:
    from transformers import Qwen2Config

    c = QWEN25_7B
    Qwen2Config(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["inter"],
                num_hidden_layers=c["layers"], num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"],
                max_position_embeddings=4096, tie_word_embeddings=False, torch_dtype="bfloat16").save_pretrained(directory)


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


async def main(args: argparse.Namespace) -> dict:
    from arl.rollout.engines.vllm_engine import VllmEngine, VllmEngineConfig

    sd = make_state_dict(torch.bfloat16, device="cuda", model="7b")
    named = list(sd.items())
    nbytes = total_bytes(sd)
    result: dict = {"benchmark": "sync_7b_vllm", "gpu": torch.cuda.get_device_name(0), "tensors": len(named),
                    "bytes": nbytes, "bucket_mb": args.bucket_mb, "d2d_gbps": device_copy_gbps(nbytes), "rounds": []}
    model_dir = Path(tempfile.mkdtemp(prefix="qwen25-7b-config-"))
    write_config(model_dir)
    engine = VllmEngine(VllmEngineConfig(
        model_path=str(model_dir), dtype="bfloat16", max_model_len=1024, enforce_eager=True,
        gpu_memory_utilization=args.gpu_memory_utilization,
        engine_args={"load_format": "dummy", "skip_tokenizer_init": True}))
    t = time.perf_counter()
    await engine.start()
    result["engine_start_s"] = time.perf_counter() - t
    cfg = SyncConfig(transport="cuda_ipc", bucket_bytes=args.bucket_mb << 20, timeout_s=300)
    sender = WeightSender(cfg, num_receivers=1, device=torch.device("cuda", 0))
    try:
        for version in range(1, args.rounds + 1):
            with torch.no_grad():
                for _, p in named:
                    p.add_(1e-3)  # new bits everywhere
            torch.cuda.synchronize()
            t = time.perf_counter()
            stats, _ = await asyncio.gather(
                asyncio.to_thread(sender.send, named, version),
                engine.load_weights(sender.address, msgspec.json.encode(cfg), version))
            wall = time.perf_counter() - t
            row = {"version": version, "wall_s": wall, "wall_gbps": nbytes / wall / 1e9,
                   "sender_gbps": stats.gbps, "plan_reused": stats.plan_reused,
                   **{k: getattr(stats, k) for k in ("setup_seconds", "stream_seconds", "land_seconds",
                                                      "confirm_seconds")},
                   **engine.last_sync}
            result["rounds"].append(row)
            print(json.dumps(row), flush=True)
        timed = result["rounds"][1:] or result["rounds"]  # the first sync sizes and maps the buffers
        result["median_wall_s"] = statistics.median(r["wall_s"] for r in timed)
        result["median_sender_fraction_of_d2d"] = statistics.median(r["sender_gbps"] for r in timed) / result["d2d_gbps"]
        result["median_wall_fraction_of_d2d"] = statistics.median(r["wall_gbps"] for r in timed) / result["d2d_gbps"]
        t = time.perf_counter()
        check = compare_weights({n: p.detach().cpu() for n, p in named}, await engine.worker_weights())
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
    res = asyncio.run(main(ap.parse_args()))
    text = json.dumps(res, indent=1, default=str)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "sync_7b_vllm.json").write_text(text)
