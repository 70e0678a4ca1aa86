"""Benchmark (b): the FSDP2 trainer step at the Qwen2.5-7B shape on 2 GPUs, 8k-token rows.

    python packages/arl-trainer/benchmarks/train_7b_fsdp.py [--shape 7b|0.5b] [--configs 16384:full:compile,...]
        [--fused-optimizer]

`--configs`: token budget:checkpointing[:compile] per run (default: 16384:full, 8192:selective,
8192:none, eager); `:compile` sets `compile_layers` (each decoder layer's forward compiled, FSDP2's
hooks eager), so a list like `16384:full,16384:full:compile` measures the two side by side.
`--fused-optimizer`: AdamW's fused step (`optim.fused`), whose update makes no full-size temporaries
(the default multi-tensor step's square-root list alone is the size of the fp32 parameters): what lets
the 7B shape's ~122 GB of fp32 weights, gradients and AdamW state train as one rank on one H200.

One command, no torchrun: the script spawns one process per visible GPU (torch.multiprocessing via
`arl.trainer.distributed.spawn_local`, NCCL). Random init on the meta device → sharded (no weights
file). Per configuration (token budget × activation checkpointing): warm-up step, then timed steps of
`FSDPPolicy.train_step` (forward + backward + AdamW, bf16 params / fp32 reduce, fp32 master + Adam).
Reports tokens/s per GPU, MFU against the bf16 matmul rate each rank measures in the same run, peak
memory per GPU, and the time to gather all weights one tensor at a time in bf16 (what a sync sends).
A configuration that runs out of memory is reported as such. Prints JSON; writes $OUT/train_7b_fsdp.json.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import _common  # noqa: F401,E402
import torch  # noqa: E402
from _common import SMOKE, emit, fixed_length_batch, is_oom, matmul_tflops, qwen25_config  # noqa: E402

ROW_TOKENS = 512 if SMOKE else 8192
ROWS = 8 if SMOKE else 16
STEPS = 1 if SMOKE else 2
DEFAULT_CONFIGS = "1024:full" if SMOKE else "16384:full,8192:selective,8192:none"


def rank_main(
    spec, shape: str, max_tokens: int, checkpointing: str, compiled: bool, out_dir: str, fused: bool = False
) -> None:
    from arl.trainer import TrainerConfig
    from arl.trainer.algorithm_config import AlgorithmConfig
    from arl.trainer.config import OptimConfig
    from arl.trainer.fsdp import FSDPPolicy

    result: dict = {"rank": spec.rank}
    path = Path(out_dir) / f"rank{spec.rank}.pt"
    try:
        policy = FSDPPolicy(
            qwen25_config(shape),
            TrainerConfig(
                optim=OptimConfig(lr=1e-6, fused=fused),
                max_tokens_per_microbatch=max_tokens,
                algorithm=AlgorithmConfig(proximal_mode="bypass"),
                mixed_precision="bf16" if policy_device_is_cuda() else "none",
                activation_checkpointing=checkpointing,
                compile_layers=compiled,
            ),
            spec,
            sync_dtype=torch.bfloat16,
        )
        device = policy.device
        result["bf16_matmul_tflops"] = matmul_tflops(device)
        batch = fixed_length_batch(ROWS, ROW_TOKENS, 32 if SMOKE else 256, policy.model.config.vocab_size)
        rows = batch.input_ids.shape[0]
        policy.train_step(batch, mini_batch_rows=rows)  # warm-up
        steps = []
        for _ in range(STEPS):
            steps.append(policy.train_step(batch, mini_batch_rows=rows))
        result["update_s"] = sum(s["update_s"] for s in steps) / len(steps)
        result["tokens_per_s_per_gpu"] = sum(s["train_tokens_per_s_per_gpu"] for s in steps) / len(steps)
        result["tflops_per_gpu"] = sum(s["train_tflops_per_gpu"] for s in steps) / len(steps)
        result["mfu"] = result["tflops_per_gpu"] / result["bf16_matmul_tflops"]
        result["peak_mem_gib"] = steps[-1].get("peak_mem_update_gib", 0.0)
        result["microbatches_per_rank"] = steps[-1]["microbatches"]
        result["rank_imbalance"] = steps[-1]["rank_imbalance"]
        result["loss"] = steps[-1]["loss"]
        torch.cuda.synchronize(device) if device.type == "cuda" else None
        t = time.perf_counter()
        n_bytes = 0
        for _, tensor in policy.iter_sync_parameters():
            n_bytes += tensor.numel() * tensor.element_size()
        torch.cuda.synchronize(device) if device.type == "cuda" else None
        result["gather_bf16_s"] = time.perf_counter() - t
        result["gather_gb"] = n_bytes / 1e9
    except Exception as exc:
        result["error"] = ("OOM: " if is_oom(exc) else "") + f"{type(exc).__name__}: {str(exc)[:300]}"
        torch.save(result, path)
        raise
    torch.save(result, path)


def policy_device_is_cuda() -> bool:
    return torch.cuda.is_available()


def parse_configs(text: str) -> list[tuple[int, str, bool]]:
    runs = []
    for item in text.split(","):
        tokens, checkpointing, *rest = item.split(":")
        if checkpointing not in ("none", "selective", "full") or rest not in ([], ["compile"]):
            raise SystemExit(f"--configs: {item!r} is not tokens:none|selective|full[:compile]")
        runs.append((int(tokens), checkpointing, rest == ["compile"]))
    return runs


def main() -> None:
    from arl.trainer.distributed import spawn_local

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=["7b", "0.5b"], default="7b")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS)
    parser.add_argument("--fused-optimizer", action="store_true")
    args = parser.parse_args()
    world = torch.cuda.device_count() if torch.cuda.is_available() else (2 if SMOKE else 0)
    if world < 1:
        raise SystemExit("no CUDA device (set ARL_BENCH_SMOKE=1 for a tiny CPU run)")
    world = min(world, 2)
    result = {
        "benchmark": "train_7b_fsdp",
        "shape": args.shape,
        "world_size": world,
        "rows": ROWS,
        "fused_optimizer": args.fused_optimizer,
        "row_tokens": ROW_TOKENS,
        "torch": torch.__version__,
        "runs": {},
    }
    for max_tokens, ckpt, compiled in parse_configs(args.configs):
        name = f"fsdp2_{max_tokens}_{ckpt}" + ("_compiled" if compiled else "")
        with tempfile.TemporaryDirectory() as tmp:
            try:
                spawn_local(
                    rank_main,
                    world,
                    args.shape,
                    max_tokens,
                    ckpt,
                    compiled,
                    tmp,
                    args.fused_optimizer,
                    timeout_s=300,
                )
            except Exception as exc:  # a rank failed (OOM or other): its own report says which
                print(f"{name}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            ranks = [torch.load(p, weights_only=False) for p in sorted(Path(tmp).glob("rank*.pt"))]
        if not ranks:
            result["runs"][name] = {"error": "no rank reported"}
            continue
        errors = [r["error"] for r in ranks if "error" in r]
        if errors:
            result["runs"][name] = {"error": errors[0]}
        else:
            r0 = ranks[0]
            result["runs"][name] = {k: v for k, v in r0.items() if k != "rank"} | {
                "peak_mem_gib_per_rank": [r["peak_mem_gib"] for r in ranks],
                "mfu_per_rank": [r["mfu"] for r in ranks],
            }
        print(name, result["runs"][name], flush=True)
    ok = [r for r in result["runs"].values() if "mfu" in r]
    if ok:
        best = max(ok, key=lambda r: r["mfu"])
        result["best_mfu"] = best["mfu"]
        result["best_tokens_per_s_per_gpu"] = best["tokens_per_s_per_gpu"]
    emit("train_7b_fsdp", result)


if __name__ == "__main__":
    main()
