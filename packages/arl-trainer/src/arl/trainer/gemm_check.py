"""Check that this device's GEMMs are right before training on them, and repair a capped MPS client's.

Measured on an H100 (torch 2.11 + CUDA 13): in a process that is an MPS client whose SMs are capped
(`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`) at 45, 55, 60, 65, 66, 70, 75, 76, 80 or 85, the first training
step's loss is NaN; at 25, 50, 90, 95 and 100 training stayed finite. The cause: bf16 GEMMs of a 0.5B
model's projection shapes return wrong values (a largest error of 3 to 260 reference standard
deviations where 0.02 is right, as at 100) without any error raised. Telling cuBLASLt to plan for fewer
SMs than the process sees (`CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET`, set through torch's SM carveout)
makes them right again: at 60% 66 of 78 SMs, at 70-80% 78 of 92-104, chosen by this check. Which
targets are right does not fall in order (at 75% a comparison found 72 wrong and this check 78 right),
and depends on what else runs on the GPU: beside a busy vLLM replica the check at 75% walked on to 70.
A target also moves the GEMMs without an epilogue to cuBLASLt, the only library torch passes it to.

So a trainer on CUDA checks a few GEMMs at startup: the shapes of the model's own linear layers and a
fixed set that showed the fault, forward with and without a bias and both backward products, against
a float64 reference on the CPU for one row in every band of 64 (every column of it). If they are
wrong it lowers the SM target step by step until they are right (confirmed on fresh data), and raises
`GemmCorrectnessError` if no target makes them right. As a capped MPS client it checks again every few
steps (`recheck_every`), under the load of the moment, and walks on down from its target if that has
gone wrong.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from arl.trainer.errors import GemmCorrectnessError

log = logging.getLogger(__name__)

# (rows, in_features, out_features) that returned wrong values on the H100 under a 70% or 75% cap.
FAULT_SHAPES: tuple[tuple[int, int, int], ...] = (
    (1000, 896, 128),
    (4096, 896, 128),
    (4096, 896, 4864),
    (16384, 896, 896),
)
MODEL_ROWS = (1000, 4096)  # rows the model's own layer shapes are checked with
MAX_MODEL_SHAPES = 6
MAX_WEIGHT_ELEMENTS = 1 << 26  # larger layers (the LM head) are left out: memory at startup
# One compared output row in every band of this many rows: a GEMM tile is at least this tall, so a
# wrong tile always has a compared row through it (every column of that row is compared).
ROW_BAND = 64
# Largest error allowed, relative to the reference's standard deviation. bf16 rounding of the output
# gives about 0.01; the wrong kernels gave 2 to 7.
TOLERANCE = 0.1
SM_TARGET_STEP = 2
MIN_SM_TARGET = 8


@dataclass(frozen=True)
class GemmCheck:
    """What a check found. `sm_target`: the SMs cuBLASLt plans for now; None is the device's own plan."""

    sm_count: int
    worst_error: float  # with the plan checked first (at startup the device's own), in reference std units
    sm_target: int | None = None

    @property
    def repaired(self) -> bool:
        return self.sm_target is not None


def linear_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    """Distinct (in_features, out_features) of the model's linear layers, smallest first, bounded."""
    shapes = {
        (m.in_features, m.out_features)
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) and m.in_features * m.out_features <= MAX_WEIGHT_ELEMENTS
    }
    return sorted(shapes, key=lambda s: (s[0] * s[1], s))[:MAX_MODEL_SHAPES]


def check_shapes(model: torch.nn.Module | None) -> list[tuple[int, int, int]]:
    """(rows, in_features, out_features) to check: the known fault shapes, then the model's own."""
    own = [
        (rows, k, n) for k, n in (linear_shapes(model) if model is not None else []) for rows in MODEL_ROWS
    ]
    return list(dict.fromkeys([*FAULT_SHAPES, *own]))  # distinct, in order


def gemm_errors(
    device: torch.device, shapes: Iterable[tuple[int, int, int]], dtype: torch.dtype, seed: int = 0
) -> dict[tuple[int, int, int], float]:
    """Per shape, the largest error of `F.linear` and its two backward products, each relative to its
    reference's standard deviation; the reference is float64 on the CPU, on one output row per band of
    ROW_BAND rows (a wrong tile cannot hide between them)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    errors = {}
    for rows, k, n in shapes:
        x = torch.randn(rows, k, generator=gen).to(device, dtype).requires_grad_(True)
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(device, dtype).requires_grad_(True)
        b = torch.randn(n, generator=gen).to(device, dtype)
        g = torch.randn(rows, n, generator=gen).to(device, dtype)
        y = F.linear(x, w, b)  # with a bias: cuBLASLt with its bias epilogue
        y.backward(g)
        with torch.no_grad():
            y_no_bias = F.linear(x, w)  # without: the default BLAS library's plain GEMM
        x64, w64, b64, g64 = (t.detach().cpu().double() for t in (x, w, b, g))
        pick_rows = one_row_per_band(rows, gen)
        pick_out = one_row_per_band(n, gen)
        forward = x64[pick_rows] @ w64.T
        pairs = (
            (y.detach(), forward + b64, pick_rows),
            (y_no_bias, forward, pick_rows),
            (x.grad, g64[pick_rows] @ w64, pick_rows),  # grad of the input
            (w.grad, g64[:, pick_out].T @ x64, pick_out),  # grad of the weight
        )
        worst = 0.0
        for got, ref, picked in pairs:
            err = float(
                (got[picked.to(device)].cpu().double() - ref).abs().max() / ref.std().clamp_min(1e-12)
            )
            worst = max(worst, err if err == err else float("inf"))  # NaN counts as the worst
        errors[(rows, k, n)] = worst
    return errors


def one_row_per_band(rows: int, gen: torch.Generator) -> torch.Tensor:
    """A random row index in each band of ROW_BAND rows of `rows` (the last band may be shorter)."""
    starts = torch.arange(0, rows, ROW_BAND)
    heights = (rows - starts).clamp(max=ROW_BAND)
    return starts + (torch.rand(len(starts), generator=gen) * heights).long()


def set_sm_target(sm_target: int | None, sm_count: int) -> None:
    """Plan cuBLASLt's GEMMs for `sm_target` SMs (None: the device's own count). A target also routes
    the GEMMs without an epilogue to cuBLASLt: torch passes the target to cuBLASLt only."""
    torch._C._set_sm_carveout_experimental(None if sm_target is None else sm_count - sm_target)
    if sm_target is not None:
        torch.backends.cuda.preferred_blas_library("cublaslt")


def find_sm_target(
    sm_count: int, is_right: Callable[[int | None, int], bool], current: int | None = None
) -> int | None:
    """The largest SM target, from the `current` plan (None: the device's own count) down, at which
    `is_right(target, draw)` holds: the current plan if it is right on draw 0, else the first lower
    target right on draw 1 and then draw 2. Raises GemmCorrectnessError if no target is right."""
    if is_right(current, 0):
        return current
    top = sm_count if current is None else current
    for target in range(top - SM_TARGET_STEP, MIN_SM_TARGET - 1, -SM_TARGET_STEP):
        if is_right(target, 1) and is_right(target, 2):
            return target
    raise GemmCorrectnessError(
        f"GEMMs on this device return wrong values at every cuBLASLt SM target from {top} down to "
        f"{MIN_SM_TARGET}; the trainer would train on garbage. Under MPS, run the trainer uncapped or with "
        "another CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (resources.mps_trainer_sm_percent)"
    )


def ensure_right_gemms(
    device: torch.device,
    model: torch.nn.Module | None = None,
    dtype: torch.dtype = torch.bfloat16,
    current: int | None = None,
    seed: int = 0,
) -> GemmCheck:
    """Check this process's GEMMs on the CUDA `device` under the `current` SM target (None: the device's
    own plan, as at startup) and, if they are wrong, lower cuBLASLt's SM target until they are right
    (for the rest of the process). `seed` draws the data (a re-check takes fresh draws). Raises
    GemmCorrectnessError when nothing helps, with the device's own plan restored."""
    if device.type != "cuda":
        raise ValueError(f"the GEMM check is for CUDA devices, got {device}")
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count
    return check_and_repair(device, sm_count, check_shapes(model), dtype, current=current, seed=seed)


def check_and_repair(
    device: torch.device,
    sm_count: int,
    shapes: list[tuple[int, int, int]],
    dtype: torch.dtype,
    current: int | None = None,
    seed: int = 0,
) -> GemmCheck:
    """`ensure_right_gemms` for a device that has `sm_count` SMs, on `shapes`."""
    blas_library = torch.backends.cuda.preferred_blas_library()
    first: dict[tuple[int, int, int], float] = {}

    def is_right(target: int | None, step: int) -> bool:
        # The current plan (step 0) is checked on every shape; the search (step 1) only on the shapes
        # that were wrong; the confirmation (step 2) on all, each on a fresh draw.
        tried = [s for s in shapes if first.get(s, 0.0) > TOLERANCE] if step == 1 else shapes
        set_sm_target(target, sm_count)
        errors = gemm_errors(device, tried, dtype, seed + step)
        if step == 0:
            first.update(errors)
        return max(errors.values()) <= TOLERANCE

    try:
        sm_target = find_sm_target(sm_count, is_right, current)
    except GemmCorrectnessError:
        set_sm_target(None, sm_count)
        torch.backends.cuda.preferred_blas_library(blas_library)
        raise
    result = GemmCheck(sm_count=sm_count, worst_error=max(first.values()), sm_target=sm_target)
    if sm_target != current:
        log.warning(
            "GEMMs on %s were wrong (largest error %.3g of the reference's std) as planned for %s; "
            "through cuBLASLt planned for %d SMs they are right, and the trainer runs so",
            device,
            result.worst_error,
            f"all {sm_count} SMs this process sees"
            if current is None
            else f"{current} SMs (an earlier repair)",
            sm_target,
        )
    return result


def recheck_every(steps: int, environ: Mapping[str, str] = os.environ) -> int:
    """Steps between re-checks for this process: `steps` when it is an MPS client capped below 100% of
    the SMs (where which plans are right moved with the GPU's other load), else 0 (startup only)."""
    cap = environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "").strip()
    try:
        capped = 0 < float(cap) < 100
    except ValueError:
        capped = False
    return steps if capped else 0
