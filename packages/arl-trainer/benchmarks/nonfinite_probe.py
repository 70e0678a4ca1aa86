"""Diagnostic: does the trainer's step stay finite in this process's GPU setting?

    python packages/arl-trainer/benchmarks/nonfinite_probe.py           # CUDA: Qwen2.5-0.5B shape
    ARL_BENCH_SMOKE=1 python packages/arl-trainer/benchmarks/nonfinite_probe.py   # a tiny shape, any device

Concurrent runs under MPS with the trainer's SMs capped and its allocator on expandable segments trained
on NaN from their first or second step, while colocated and time-sliced runs of the same model and data
stayed finite. This script takes the app, vLLM and the weight sync out: it trains the long-tail batch
of `proximal_auto.py` (groups of 8, KL to a reference in the loss) for a few steps and records each
step's loss, gradient norm and entropy, under whatever the environment sets: an MPS client
(`CUDA_MPS_PIPE_DIRECTORY`), its SM cap (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`), the allocator
(`PYTORCH_CUDA_ALLOC_CONF`; unset means the allocator's default, not the expandable segments the other
benchmarks here default to). The `nanprobe` phase of tools/h200_shared_phases.sh runs it in each
setting, with and without a neighbour busy on the same GPU. Skipped updates are recorded, never raised
(`max_nonfinite_skips` is set past the step count). The trainer's startup GEMM check
(`arl.trainer.gemm_check`) runs unless PROBE_CHECK_GEMMS=0, and what it found is recorded.
One JSON block; $OUT/nonfinite_probe_<case>.json.
"""

from __future__ import annotations

import dataclasses
import math
import os

# Before train_05b (which defaults the allocator to expandable segments) and before CUDA starts: the
# setting under test is the environment's, or the allocator's own default where it names none.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")

import _common  # noqa: E402, F401  (sys.path for arl.*)
import torch  # noqa: E402
from _common import SMOKE, emit, long_tail_lengths, qwen25_config  # noqa: E402

STEPS = 2 if SMOKE else 4
ROWS = 16 if SMOKE else 32
SETTINGS = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "PYTORCH_CUDA_ALLOC_CONF")


def main() -> None:
    from train_05b import make_batch
    from transformers import Qwen2ForCausalLM

    from arl.trainer import HFPolicy, TrainerConfig
    from arl.trainer.algorithm_config import AlgorithmConfig
    from arl.trainer.config import OptimConfig

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = qwen25_config("0.5b")
    lengths = long_tail_lengths(ROWS, median=256 if SMOKE else 1024, sigma=1.0, cap=8192, floor=140)
    batch = make_batch(lengths, cfg.vocab_size)
    torch.manual_seed(0)
    config = TrainerConfig(
        optim=OptimConfig(lr=1e-5, max_nonfinite_skips=STEPS),
        max_tokens_per_microbatch=16384,
        mixed_precision="bf16" if device.type == "cuda" else "no",
        algorithm=AlgorithmConfig(kl_coef=1e-3),
        check_gemms=os.environ.get("PROBE_CHECK_GEMMS", "1") == "1",
    )
    policy = HFPolicy(Qwen2ForCausalLM(cfg), config, device=str(device))
    steps = []
    for _ in range(STEPS):
        m = policy.train_step(batch, mini_batch_rows=ROWS)
        steps.append({k: m.get(k) for k in ("loss", "grad_norm", "entropy", "kl", "nonfinite_skipped")})
    finite = [all(math.isfinite(float(v)) for v in s.values() if v is not None) for s in steps]
    case = os.environ.get("PROBE_CASE", "default")
    emit(
        f"nonfinite_probe_{case}",
        {
            "benchmark": "nonfinite_probe",
            "case": case,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "sm_count": torch.cuda.get_device_properties(device).multi_processor_count
            if device.type == "cuda"
            else 0,
            "settings": {k: os.environ.get(k, "") for k in SETTINGS},
            # The trainer's startup GEMM check (None: turned off by PROBE_CHECK_GEMMS=0, or no CUDA).
            "gemm_check": dataclasses.asdict(policy.gemm_check) if policy.gemm_check else None,
            "tokens": int(batch.attention_mask.sum()),
            "finite_steps": sum(finite),
            "steps": steps,
        },
    )


if __name__ == "__main__":
    main()
