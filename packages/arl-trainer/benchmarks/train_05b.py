"""Benchmark (a): the packed trainer step vs a padded plain-HF step, Qwen2.5-0.5B shape, one GPU.

    python packages/arl-trainer/benchmarks/train_05b.py

Same random-init model shape and the same long-tail batch for both; each does forward + backward +
AdamW (fp32 master weights, bf16 autocast). Plain HF: rows in their arrival order, micro-batches of
`PLAIN_ROWS` rows right-padded to their longest, full fp32 logits (`token_log_probs`), SDPA. arl:
`HFPolicy.train_step` (balanced packing into `max_tokens_per_microbatch`, varlen attention, the
chunked head). Reports real (unpadded) tokens/s and MFU against the bf16 matmul rate measured in
the same run (convention in the package README). Prints one JSON block; writes $OUT/train_05b.json.

A second batch of uniform 4,096-token rows (about the same token count) runs through both as well:
with no padding to waste, it compares the packed step with plain HF per token at equal shapes.
The 32k run is repeated with `compile_layers` (every decoder layer compiled; CUDA only).
`ARL_PROFILE=1` also profiles one step of the 32k-budget packed run (torch.profiler): the kernels by
GPU time, and the GPU's busy fraction of the step, into $OUT/train_05b_profile.txt.
"""

from __future__ import annotations

import gc
import os

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
import time

import _common  # noqa: F401  (sys.path for arl.*)
import torch
from _common import (
    SMOKE,
    bench_device,
    emit,
    empty_cache,
    is_oom,
    long_tail_lengths,
    matmul_tflops,
    peak_gib,
    percentile,
    qwen25_config,
    reset_peak,
    sync,
)

ROWS = 16 if SMOKE else 128
STEPS = 1 if SMOKE else 3
PLAIN_ROWS = [4, 2]  # tried in order until one fits


def make_batch(lengths: list[int], vocab: int):
    from arl.queue.types import Response, Sample
    from arl.trainer import assemble_batch

    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(0, len(lengths), 8):  # groups of 8 responses per prompt (GRPO)
        prompt_len = 128
        responses = []
        for s in lengths[i : i + 8]:
            n = max(1, s - prompt_len)
            responses.append(
                Response(
                    response_ids=torch.randint(0, vocab, (n,), generator=g).tolist(),
                    response_mask=[1] * n,
                    response_logprobs=[-1.0] * n,
                    weight_versions=[0] * n,
                    reward=float(torch.rand(1, generator=g)),
                )
            )
        samples.append(
            Sample(
                uid=str(i),
                prompt_ids=torch.randint(0, vocab, (prompt_len,), generator=g).tolist(),
                responses=responses,
                start_version=0,
                end_version=0,
            )
        )
    return assemble_batch(samples, pad_token_id=0)


def flops_of(model, lengths):
    from arl.trainer.flops import attention_width_and_layers, matmul_params, train_flops

    return train_flops(matmul_params(model), lengths, *attention_width_and_layers(model.config))


def bench_plain(cfg, batch, device, rows_per_mb):
    """The padded plain-HF step: the trainer as it was before packing."""
    from transformers import Qwen2ForCausalLM

    from arl.trainer.algorithms import grpo_advantages, token_log_probs

    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    adv = grpo_advantages(batch.rewards, batch.group_index)
    n = batch.input_ids.shape[0]
    total_tokens = batch.loss_mask.sum()

    def step():
        opt.zero_grad(set_to_none=True)
        for s in range(0, n, rows_per_mb):
            rows = slice(s, s + rows_per_mb)
            width = int(batch.attention_mask[rows].sum(-1).max())
            ids = batch.input_ids[rows, :width].to(device)
            am = batch.attention_mask[rows, :width].to(device)
            mask = batch.loss_mask[rows, :width].to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = model(input_ids=ids, attention_mask=am).logits
            logp = token_log_probs(logits, ids)
            loss = -(logp * adv[rows].to(device)[:, None] * mask).sum() / total_tokens
            loss.backward()
            del logits, logp, loss
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    try:
        return run_steps(step, device, model)
    finally:
        model = opt = None  # frees them (a `del` would leave step() naming unbound names)
        gc.collect()
        empty_cache(device)


def bench_arl(cfg, batch, device, max_tokens, checkpointing, profile=False, compile_layers=False):
    from transformers import Qwen2ForCausalLM

    from arl.trainer import HFPolicy, TrainerConfig
    from arl.trainer.algorithm_config import AlgorithmConfig
    from arl.trainer.config import OptimConfig

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    tcfg = TrainerConfig(
        optim=OptimConfig(lr=1e-6),
        max_tokens_per_microbatch=max_tokens,
        algorithm=AlgorithmConfig(proximal_mode="bypass"),
        mixed_precision="bf16",
        activation_checkpointing=checkpointing,
        compile_layers=compile_layers,
    )
    policy = HFPolicy(model, tcfg, device=str(device))
    last = {}

    def step():
        last.update(policy.train_step(batch, mini_batch_rows=batch.input_ids.shape[0]))

    try:
        out = run_steps(step, device, policy.model)
        out.update(microbatches=last.get("microbatches"), pack_fill=last.get("pack_fill"))
        if profile:
            out["gpu_busy_fraction"] = profile_step(step, device)
        return out
    finally:
        policy = model = None  # frees them (a `del` would leave step() naming unbound names)
        gc.collect()
        empty_cache(device)


def profile_step(step, device) -> float:
    """Profile one step; write the kernel table; return the GPU's busy time over the step's wall time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        t = time.perf_counter()
        step()
        sync(device)
        wall = time.perf_counter() - t
    events = prof.key_averages()
    busy_us = sum(e.self_device_time_total for e in events if e.device_type.name in ("CUDA", "PrivateUse1"))
    table = events.table(
        sort_by="self_device_time_total" if device.type == "cuda" else "self_cpu_time_total", row_limit=40
    )
    text = (
        f"step wall {wall:.3f} s, GPU busy {busy_us / 1e6:.3f} s ({100 * busy_us / 1e6 / wall:.0f}%)\n{table}"
    )
    print(text, flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "train_05b_profile.txt"), "w") as f:
            f.write(text)
    return busy_us / 1e6 / wall


def run_steps(step, device, model):
    step()  # warm-up (allocator, kernels)
    sync(device)
    reset_peak(device)
    t = time.perf_counter()
    for _ in range(STEPS):
        step()
    sync(device)
    return {"step_s": (time.perf_counter() - t) / STEPS, "peak_mem_gib": peak_gib(device)}


def main() -> None:
    from arl.trainer.attention import fused_available

    device = bench_device()
    peak = matmul_tflops(device)
    cfg = qwen25_config("0.5b")
    lengths = long_tail_lengths(
        ROWS, median=128 if SMOKE else 1024, sigma=1.0, cap=512 if SMOKE else 8192, floor=140
    )
    batch = make_batch(lengths, cfg.vocab_size)
    real = batch.attention_mask.sum(-1).tolist()
    tokens = sum(real)
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        flops = flops_of(Qwen2ForCausalLM(cfg), real)
    result = {
        "benchmark": "train_05b",
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "fused_varlen_attention": fused_available(device, torch.bfloat16),
        "bf16_matmul_tflops": peak,
        "rows": ROWS,
        "tokens": tokens,
        "length_median": percentile(real, 0.5),
        "length_p99": percentile(real, 0.99),
        "length_max": max(real),
        "flops_per_step_tflop": flops / 1e12,
        "runs": {},
    }

    def record(name, fn, runs=result["runs"], tokens=tokens, flops=flops):
        try:
            r = fn()
        except Exception as exc:  # report OOM (or any failure) per configuration; keep going
            if not is_oom(exc):
                import traceback

                traceback.print_exc()
            gc.collect()
            empty_cache(device)
            runs[name] = {
                "error": ("OOM: " if is_oom(exc) else "") + f"{type(exc).__name__}: {str(exc)[:300]}"
            }
            return None
        r["tokens_per_s"] = tokens / r["step_s"]
        r["mfu"] = flops / r["step_s"] / 1e12 / peak
        runs[name] = r
        print(name, r, flush=True)
        return r

    plain = None
    for rows in PLAIN_ROWS:
        plain = record(f"plain_hf_padded_{rows}rows", lambda rows=rows: bench_plain(cfg, batch, device, rows))
        if plain is not None:
            break
    best = None
    profile = os.environ.get("ARL_PROFILE") == "1"
    budgets = (
        ((1024, "none"), (2048, "selective"))
        if SMOKE
        else ((16384, "none"), (32768, "none"), (65536, "selective"))
    )
    for max_tokens, ckpt in budgets:
        r = record(
            f"arl_packed_{max_tokens}_{ckpt}",
            lambda max_tokens=max_tokens, ckpt=ckpt: bench_arl(
                cfg, batch, device, max_tokens, ckpt, profile=profile and max_tokens == budgets[1][0]
            ),
        )
        if r is not None and (best is None or r["tokens_per_s"] > best["tokens_per_s"]):
            best = r
    # The same 32k-token packing with every decoder layer compiled (its warm-up step pays the compile).
    if torch.cuda.is_available():
        r = record(
            "arl_packed_32768_none_compiled",
            lambda: bench_arl(cfg, batch, device, budgets[1][0], "none", compile_layers=True),
        )
        if r is not None and (best is None or r["tokens_per_s"] > best["tokens_per_s"]):
            best = r
    if plain and best:
        result["speedup_tokens_per_s"] = best["tokens_per_s"] / plain["tokens_per_s"]
        result["best_arl_mfu"] = best["mfu"]
        result["plain_mfu"] = plain["mfu"]

    # Uniform rows: no padding in either, so any gap is per-token cost (head, attention, packing).
    width = 256 if SMOKE else 4096
    uniform = make_batch([width] * (16 if SMOKE else 48), cfg.vocab_size)
    u_tokens = int(uniform.attention_mask.sum())
    with torch.device("meta"):
        u_flops = flops_of(Qwen2ForCausalLM(cfg), [width] * uniform.input_ids.shape[0])
    uniform_runs: dict = {}
    record(
        f"plain_hf_uniform_{width}_4rows",
        lambda: bench_plain(cfg, uniform, device, 4),
        runs=uniform_runs,
        tokens=u_tokens,
        flops=u_flops,
    )
    record(
        f"arl_packed_uniform_{width}_32768",
        lambda: bench_arl(cfg, uniform, device, 8 * width, "none"),
        runs=uniform_runs,
        tokens=u_tokens,
        flops=u_flops,
    )
    result["uniform"] = {"rows": uniform.input_ids.shape[0], "tokens": u_tokens, "runs": uniform_runs}
    emit("train_05b", result)


if __name__ == "__main__":
    main()
