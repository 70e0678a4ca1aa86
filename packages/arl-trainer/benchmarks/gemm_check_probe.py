"""What the trainer's startup GEMM check finds in this process's GPU setting, and what it costs.

    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=75 python packages/arl-trainer/benchmarks/gemm_check_probe.py

Under an MPS client's SM cap, cuBLASLt's bf16 GEMMs can return wrong values (arl.trainer.gemm_check).
This runs the check the trainer runs at startup, on the Qwen2.5-0.5B shape's linear layers, and records
the SMs the process sees, the largest error with the device's own plan, the SM target the check chose
(None: kept the device's plan), a fresh measurement at that target, and the seconds the check took.
The `gemmcaps` phase of tools/h200_shared_phases.sh runs it at each cap of SM_PCTS.
One JSON block; $OUT/gemm_check_probe_<case>.json.
"""

from __future__ import annotations

import os
import time

import _common  # noqa: F401  (sys.path for arl.*)
import torch
from _common import emit, qwen25_config


def main() -> None:
    from transformers import Qwen2ForCausalLM

    from arl.trainer.gemm_check import check_shapes, ensure_right_gemms, gemm_errors

    if not torch.cuda.is_available():
        raise SystemExit("gemm_check_probe needs a CUDA device: the check it measures is CUDA's")
    device = torch.device("cuda")
    with torch.device("meta"):  # only the layer shapes are needed
        model = Qwen2ForCausalLM(qwen25_config("0.5b"))
    start = time.perf_counter()
    check = ensure_right_gemms(device, model)
    seconds = time.perf_counter() - start
    after = gemm_errors(device, check_shapes(model), torch.bfloat16, seed=3)
    case = os.environ.get("PROBE_CASE", "default")
    emit(
        f"gemm_check_probe_{case}",
        {
            "benchmark": "gemm_check_probe",
            "case": case,
            "device": torch.cuda.get_device_name(device),
            "mps_cap": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", ""),
            "sm_count": check.sm_count,
            "worst_error_device_plan": check.worst_error,
            "sm_target": check.sm_target,
            "worst_error_after": max(after.values()),
            "check_s": round(seconds, 3),
        },
    )


if __name__ == "__main__":
    main()
