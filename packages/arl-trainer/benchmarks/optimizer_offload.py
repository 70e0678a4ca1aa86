"""Benchmark: the trainer step with AdamW's state resident, offloaded, and offloaded with the prefetch.

    python packages/arl-trainer/benchmarks/optimizer_offload.py [--shape 7b] [--layers 28] [--rows 4]
        [--row-tokens 4096] [--steps 2]

One GPU, `HFPolicy` (the single-device backend), the Qwen2.5 shape with `--layers` decoder layers,
randomly initialised on the GPU (seed 0), fp32 master weights under bf16 autocast, fused AdamW, full
activation checkpointing, `--rows` rows of `--row-tokens` tokens in one packed micro-batch. Side by
side in one process, each from the same weights and batch: (a) the state resident; (b)
`optimizer_offload` with the state copied back right before the update (`optimizer_prefetch=false`);
(c) `optimizer_offload` with the prefetch (the default: the copy back runs beside the forward and
backward). After a warm-up step (it allocates the pinned buffer), per run: step seconds, the state's
way back (`optimizer_load_s`) and what of it the update waited for (`optimizer_load_wait_s`), the way
out, the peak during the step, the memory held between steps, and the losses (the updates are
bit-identical by construction, but the bf16 backward is not deterministic from run to run, so they
agree to within that noise). The ratios: each offload's extra step time over the resident step, and
the share of the way back the prefetch hid; each run's largest loss difference to the first run's
(`--runs resident,resident,...` repeats a run to show the backward's own run-to-run noise). One JSON
block; $OUT/optimizer_offload.json.
"""

from __future__ import annotations

import argparse
import gc
import os
import time

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import _common  # noqa: F401,E402  (sys.path for arl.*)
import torch  # noqa: E402
from _common import SMOKE, bench_device, emit, fixed_length_batch, qwen25_config, sync  # noqa: E402

RUNS = {
    "resident": dict(optimizer_offload=False),
    "offload": dict(optimizer_offload=True, optimizer_prefetch=False),
    "offload_prefetch": dict(optimizer_offload=True, optimizer_prefetch=True),
}


def run(name: str, args: argparse.Namespace, device: torch.device) -> dict:
    from transformers import Qwen2ForCausalLM

    from arl.trainer import HFPolicy, TrainerConfig
    from arl.trainer.algorithm_config import AlgorithmConfig
    from arl.trainer.config import OptimConfig

    config = qwen25_config(args.shape)
    if not SMOKE:
        config.num_hidden_layers = args.layers
    torch.manual_seed(0)
    with device:
        model = Qwen2ForCausalLM(config)
    tokens = args.rows * args.row_tokens
    policy = HFPolicy(
        model,
        TrainerConfig(
            optim=OptimConfig(lr=1e-6, fused=True),
            max_tokens_per_microbatch=tokens,
            mixed_precision="bf16" if device.type == "cuda" else "none",
            activation_checkpointing="full",
            algorithm=AlgorithmConfig(proximal_mode="bypass"),
            **RUNS[name],
        ),
        device=device.type,
    )
    batch = fixed_length_batch(args.rows, args.row_tokens, 128, config.vocab_size)
    rows = batch.input_ids.shape[0]
    out: dict = {"parameters_b": sum(p.numel() for p in policy.model.parameters()) / 1e9}
    steps, seconds = [], []
    for i in range(args.steps + 1):  # step 0: the warm-up (first optimizer state, pinned buffer)
        sync(device)
        t = time.perf_counter()
        metrics = policy.train_step(batch, mini_batch_rows=rows)
        sync(device)
        if args.empty_cache_between_steps and device.type == "cuda":
            torch.cuda.empty_cache()  # what the colocated app does before its replica wakes (inside the step's time)
        if i:
            seconds.append(time.perf_counter() - t)
            steps.append(metrics)
    # after the last step
    held_gib = torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    mean = lambda key: sum(s.get(key, 0.0) for s in steps) / len(steps)  # noqa: E731
    out.update(
        step_s=sum(seconds) / len(seconds),
        step_s_each=seconds,
        update_s=mean("update_s"),
        optimizer_load_s=mean("optimizer_load_s"),
        optimizer_load_wait_s=mean("optimizer_load_wait_s"),
        optimizer_offload_s=mean("optimizer_offload_s"),
        optimizer_state_gib=mean("optimizer_state_gib"),
        peak_mem_update_gib=mean("peak_mem_update_gib"),
        held_between_steps_gib=held_gib,
        losses=[s["loss"] for s in steps],
    )
    del policy, model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="7b", choices=["0.5b", "7b"])
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--row-tokens", type=int, default=4096)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument(
        "--empty-cache-between-steps",
        action="store_true",
        help="hand the cached blocks back to the driver after each step, as the colocated app does",
    )
    p.add_argument(
        "--runs",
        default=",".join(RUNS),
        help="which runs, in order; a name may repeat (resident,resident: how far two identical runs differ)",
    )
    args = p.parse_args()
    runs = args.runs.split(",")
    if unknown := sorted(set(runs) - set(RUNS)):
        raise SystemExit(f"--runs: unknown {unknown}; choose from {list(RUNS)}")
    if SMOKE:
        args.rows, args.row_tokens, args.steps = 2, 256, 1
    device = bench_device()
    result: dict = {
        "shape": args.shape,
        "layers": args.layers,
        "tokens_per_step": args.rows * args.row_tokens,
    }
    keys = []
    for name in runs:
        key = name if name not in keys else f"{name}#{keys.count(name) + 1}"
        keys.append(key)
        result[key] = run(name, args, device)
    base = result["resident"]["step_s"] if "resident" in result else None
    for key in keys:
        r = result[key]
        if r["optimizer_state_gib"] and base is not None:
            r["extra_step_s_over_resident"] = r["step_s"] - base
        if r["optimizer_load_s"]:
            r["load_hidden_fraction"] = 1 - r["optimizer_load_wait_s"] / r["optimizer_load_s"]
    # Each run's losses against the first run's (bf16 backward kernels need not be deterministic, so
    # repeating a run says how large a difference means nothing).
    first = result[keys[0]]["losses"]
    result["max_loss_diff_to_first_run"] = {
        k: max(abs(a - b) for a, b in zip(result[k]["losses"], first, strict=True)) for k in keys[1:]
    }
    emit("optimizer_offload", result)


if __name__ == "__main__":
    main()
