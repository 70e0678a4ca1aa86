"""One workload, several layouts, side by side: colocated-synchronous, the async modes a–d (split) and
the shared-GPU schedules (time_sliced, concurrent: async on the colocated GPUs).

Each mode is a full apps/train run (`arl_train.run.run`) of the same config with the mode's
overrides; the first `warmup_steps` steps of each are left out of the figures (engine start-up,
first compile). Per mode it reports, over the measured window:

- trainer samples/s and sampled tokens/s (what the trainer consumed per second of wall time);
- trainer idle fraction: time spent waiting for samples / step time (`wait_s / step_s`);
- rollout idle fraction: per replica, the share of wall time with no generation call running
  (starved by the staleness budget, paused for a sync, or asleep while the trainer has the GPU);
- generation tokens/s (what the engines produced, kept or not), sync seconds per step, staleness;
- the speedup over colocated (samples/s ratio);
- per side, the share of wall time it was working (trainer: training; rollout: a generation call
  running) and the share it was slowed by the other side sharing its GPU: working share ×
  (1 − its rate in this mode / its rate alone). A side's rate alone comes from the modes of the same
  compare in which it had its GPU to itself (trainer: any mode but concurrent; rollout: time_sliced
  or a split mode, whose batches stay refilled as concurrent's do, not colocated's draining ones), or
  from `raw_vllm_rates.py --share` figures (`rates`). With those figures the compare also reports each
  schedule's ideal speedup over colocated (`ideal_speedups`) and how close it came.

`run_modes` runs the modes and reports; `report_from_runs` makes the same report from the run folders
of a compare that did not get to (`apps/bench report`).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import msgspec

BENCH_MODES = ("colocated", "a", "b", "c", "d", "time_sliced", "concurrent")
SHARED_MODES = ("time_sliced", "concurrent")
# The trainer's per-pass peaks of allocated GPU memory in a step's metrics (arl.trainer.engine).
TRAINER_PEAK_KEYS = ("peak_mem_update_gib", "peak_mem_proximal_gib", "peak_mem_ref_gib")


class ModeResult(msgspec.Struct, kw_only=True):
    mode: str
    # How the mode was run: the app's mode preset and the extra overrides.
    app_mode: str
    overrides: list[str]
    steps_measured: int
    samples_per_s: float
    tokens_per_s: float
    generated_tokens_per_s: float
    trainer_idle_fraction: float
    rollout_idle_fraction: float
    sync_s_per_step: float
    staleness_mean: float
    train_s_per_step: float
    step_s_mean: float
    response_length_mean: float
    weights_equal_after_sync: bool
    wall_s: float
    output_dir: str
    speedup_over_colocated: float = float("nan")
    # Per side: the share of wall time it worked, its rate while working (trainer: sampled tokens per
    # second of training; rollout: generated tokens per busy second), the share it was slowed by the other.
    trainer_work_fraction: float = 0.0
    rollout_work_fraction: float = 0.0
    trainer_rate: float = 0.0
    rollout_rate: float = 0.0
    trainer_slowed_fraction: float = float("nan")
    rollout_slowed_fraction: float = float("nan")
    # Partial generations resumed after an abort (a sync, or a time-sliced yield) over the measured steps.
    resumed_requests: int = 0
    staleness_max: int = 0
    # The replicas' schedulers over the measured steps (vLLM; 0 for an engine that reports none): requests
    # preempted (recomputed from the prompt: the KV cache ran out), the most waiting at once, the highest
    # KV-cache use.
    preempted_requests: int = 0
    waiting_max: int = 0
    kv_cache_usage_max: float = 0.0
    # The trainer's most GPU memory allocated in one pass of a measured step (its update, proximal or
    # reference pass; GiB, rank 0; 0 on the CPU): what concurrent's memory split must leave it.
    trainer_peak_mem_gib: float = 0.0
    # The trainer's card's memory (GiB; 0 on the CPU).
    gpu_memory_gib: float = 0.0
    # Steps of the whole run (warm-up included: one non-finite update poisons every later step) whose loss
    # or gradient norm was NaN or inf, or that skipped an update for it. Such a run's rates are not those
    # of a run that trains, so its mode gets no headline (`headline`).
    nonfinite_steps: int = 0
    # Whether the trainer's weights were finite at the end of the run (apps/train's end-of-run check).
    weights_finite: bool = True
    # The SMs the trainer's GEMMs were planned for after its startup check found them wrong (an MPS SM
    # cap; arl.trainer.gemm_check); 0 = the device's own plan was right.
    gemm_sm_target: int = 0


def app_supports_colocate() -> bool:
    """Whether apps/train has the `resources.colocate` key (rollout and training take turns on
    the same GPUs, engines asleep while the trainer runs)."""
    from arl_train.config import AppConfig

    fields = {f.name: f for f in msgspec.structs.fields(AppConfig)}
    if "resources" not in fields:
        return False
    return "colocate" in {f.name for f in msgspec.structs.fields(fields["resources"].type)}


def mode_settings(mode: str) -> tuple[str, list[str]]:
    """The app mode preset and the extra overrides for a bench mode."""
    if mode not in BENCH_MODES:
        raise ValueError(f"unknown bench mode {mode!r}; choose from {list(BENCH_MODES)}")
    if mode in SHARED_MODES:  # async mode d on the colocated GPUs
        return "d", [f"resources.shared_gpu={mode}"]
    if mode == "colocated":
        # Synchronous (mode a: generate a batch, train on it, sync); colocated when the app can place
        # both sides on the same GPUs. Without that key it is mode a on whatever devices the config names.
        return "a", (["resources.colocate=true"] if app_supports_colocate() else [])
    return mode, (["resources.colocate=false"] if app_supports_colocate() else [])


def summarize(
    mode: str,
    app_mode: str,
    overrides: list[str],
    rows: list[dict[str, Any]],
    summary: Any,
    warmup_steps: int,
) -> ModeResult:
    """Figures over rows[warmup_steps:] (each row: one trainer step's metrics + rollout stats)."""
    if len(rows) <= warmup_steps:
        raise ValueError(f"mode {mode}: {len(rows)} steps, need more than warmup_steps={warmup_steps}")
    before, window = rows[warmup_steps - 1] if warmup_steps else None, rows[warmup_steps:]
    step_s = sum(r["step_s"] for r in window)
    samples = window[-1]["samples_seen"] - (before["samples_seen"] if before else 0)
    tokens = sum(r["sampled_tokens_per_s"] * r["step_s"] for r in window)
    r0 = (
        before["rollout"]
        if before
        else {"engine_busy_s": 0.0, "manager_elapsed_s": 0.0, "engine_generated_tokens": 0.0}
    )
    r1 = window[-1]["rollout"]
    elapsed = r1["manager_elapsed_s"] - r0["manager_elapsed_s"]
    busy = r1["engine_busy_s"] - r0["engine_busy_s"]
    replicas = r1.get("engine_replicas", 1.0)
    train_s = sum(r["train_s"] for r in window)
    generated = r1["engine_generated_tokens"] - r0["engine_generated_tokens"]
    return ModeResult(
        mode=mode,
        app_mode=app_mode,
        overrides=overrides,
        steps_measured=len(window),
        samples_per_s=samples / step_s,
        tokens_per_s=tokens / step_s,
        generated_tokens_per_s=(r1["engine_generated_tokens"] - r0["engine_generated_tokens"])
        / max(1e-9, elapsed),
        trainer_idle_fraction=sum(r["wait_s"] for r in window) / step_s,
        rollout_idle_fraction=1.0 - busy / max(1e-9, elapsed * replicas),
        sync_s_per_step=sum(r["sync_s"] for r in window) / len(window),
        staleness_mean=sum(r["staleness_mean"] for r in window) / len(window),
        train_s_per_step=sum(r["train_s"] for r in window) / len(window),
        step_s_mean=step_s / len(window),
        response_length_mean=sum(r["response_length_mean"] for r in window) / len(window),
        weights_equal_after_sync=bool(summary.weights_equal_after_sync),
        wall_s=float(summary.wall_s),
        output_dir=str(summary.output_dir),
        trainer_work_fraction=train_s / step_s,
        rollout_work_fraction=busy / max(1e-9, elapsed * replicas),
        trainer_rate=tokens / max(1e-9, train_s),
        rollout_rate=generated / max(1e-9, busy),
        resumed_requests=int(
            r1.get("resumed_requests", 0) - (before["rollout"].get("resumed_requests", 0) if before else 0)
        ),
        staleness_max=max(int(r.get("staleness_max", 0)) for r in window),
        preempted_requests=int(sum(_scheduler(r, "preempted") for r in window)),
        waiting_max=int(max(_scheduler(r, "waiting_max") for r in window)),
        kv_cache_usage_max=max(_scheduler(r, "kv_cache_usage_max") for r in window),
        trainer_peak_mem_gib=max(r.get(key, 0.0) for r in window for key in TRAINER_PEAK_KEYS),
        gpu_memory_gib=float(getattr(summary, "trainer", {}).get("gpu_memory_gib", 0.0)),
        nonfinite_steps=sum(1 for r in rows if trained_nonfinite(r)),
        weights_finite=bool(getattr(summary, "weights_finite", True)),
        gemm_sm_target=int(max(r.get("gemm_sm_target", 0) for r in rows)),
    )


def trained_nonfinite(row: dict[str, Any]) -> bool:
    """Whether a step's update was NaN/inf (its loss or gradient norm) or was skipped for it."""
    values = [row.get("loss", 0.0), row.get("grad_norm", 0.0)]
    return row.get("nonfinite_skipped", 0.0) > 0 or not all(math.isfinite(float(v)) for v in values)


def trained_finite(mode: dict[str, Any]) -> bool:
    """Whether a mode's run trained finite throughout: no NaN/inf step and finite weights at the end."""
    return not mode.get("nonfinite_steps", 0) and mode.get("weights_finite", True)


def _scheduler(row: dict[str, Any], key: str) -> float:
    """One step's scheduler counter (the window since the previous step's row; 0 where none was kept)."""
    return float(row["rollout"].get("scheduler", {}).get(key, 0.0))


def alone_rates(results: dict[str, ModeResult], rates: dict[str, float] | None = None) -> dict[str, float]:
    """Each side's rate with its GPU to itself: from `rates` (raw_vllm_rates' share measurement:
    `trainer`, `rollout` in the bench's units) where given, else the best of this compare's modes in
    which that side ran alone (the trainer: all but concurrent; the rollout: time_sliced and the split
    modes, whose batches stay refilled like concurrent's)."""
    out = dict(rates or {})
    trainer = [r.trainer_rate for m, r in results.items() if m != "concurrent" and r.trainer_rate > 0]
    rollout = [
        r.rollout_rate
        for m, r in results.items()
        if m not in ("concurrent", "colocated") and r.rollout_rate > 0
    ]
    if "trainer" not in out and trainer:
        out["trainer"] = max(trainer)
    if "rollout" not in out and rollout:
        out["rollout"] = max(rollout)
    return out


def add_slowdowns(results: dict[str, ModeResult], alone: dict[str, float]) -> None:
    """Per mode and side: working share × (1 − rate / rate alone), at least 0 (NaN without a rate alone)."""
    for r in results.values():
        if alone.get("trainer"):
            r.trainer_slowed_fraction = r.trainer_work_fraction * max(
                0.0, 1 - r.trainer_rate / alone["trainer"]
            )
        if alone.get("rollout"):
            r.rollout_slowed_fraction = r.rollout_work_fraction * max(
                0.0, 1 - r.rollout_rate / alone["rollout"]
            )


def taking_turns(generate: float, train: float) -> float:
    """Tokens/s of one GPU that generates at `generate` and trains at `train` (tokens/s) in turn."""
    return 1 / (1 / generate + 1 / train)


def turn_taking_ideals(results: dict[str, ModeResult], alone: dict[str, float]) -> dict[str, float]:
    """Each mode's bound from this compare's own rates, in trained tokens/s: taking turns on one GPU at
    the sides' rates alone costs 1/trainer + 1/rollout per token (time_sliced's bound, and the most any
    schedule gets that never runs both at once); colocated's own bound uses its draining batches' rate.
    Empty without both rates alone."""
    if not (alone.get("trainer") and alone.get("rollout")):
        return {}
    out = {m: taking_turns(alone["rollout"], alone["trainer"]) for m in results if m in SHARED_MODES}
    colocated = results.get("colocated")
    if colocated is not None and colocated.rollout_rate > 0:
        out["colocated"] = taking_turns(colocated.rollout_rate, alone["trainer"])
    return out


def at_once_bound(results: dict[str, ModeResult], alone: dict[str, float]) -> float | None:
    """Concurrent's bound from its own run, in trained tokens/s: the best mix (`best_mix`) of the rates
    alone and the shares each side kept at once in that run. How well the schedule used the sharing it
    got; None without a concurrent run or both rates alone."""
    r = results.get("concurrent")
    if (
        r is None
        or not (alone.get("trainer") and alone.get("rollout"))
        or r.trainer_rate <= 0
        or r.rollout_rate <= 0
    ):
        return None
    return best_mix(
        alone["rollout"],
        alone["trainer"],
        r.rollout_rate / alone["rollout"],
        r.trainer_rate / alone["trainer"],
    )


def best_mix(g: float, t: float, g_share: float, t_share: float) -> float:
    """Most tokens per second one GPU can generate *and* train when the engine alone decodes `g`, the
    trainer alone trains `t` (both per response token), and running at once they keep `g_share` and
    `t_share` of those rates: the best split of time between both at once, the engine alone and the
    trainer alone (a two-variable linear program, solved at its vertices)."""
    gs, ts = g * g_share, t * t_share
    candidates = [taking_turns(g, t)]  # never at once
    if gs > 0 and ts > 0:
        candidates.append(min(gs, ts))  # always at once
        if gs < ts:  # at once for a share x of the time, the engine alone for the rest
            # x·gs + (1−x)·g = x·ts  →  x = g / (g + ts − gs)
            x = g / (g + ts - gs)
            if 0 <= x <= 1:
                candidates.append(x * ts)
        elif ts < gs:  # at once for x, trainer alone for the rest: x·gs = x·ts + (1−x)·t
            x = t / (t + gs - ts)
            if 0 <= x <= 1:
                candidates.append(x * gs)
    return max(candidates)


def ideal_speedups(
    g_sync: float, g_cont: float, t: float, g_share: float = 0.0, t_share: float = 0.0
) -> dict[str, float]:
    """One GPU's ideal over synchronous colocated (which decodes at `g_sync`, then trains at `t`):
    time_sliced decodes refilled batches (`g_cont`) and trains in turn; concurrent mixes both at once
    (`best_mix`) with the measured shares. Rates in response tokens/s."""
    colocated = taking_turns(g_sync, t)
    out = {"time_sliced": taking_turns(g_cont, t) / colocated}
    if g_share and t_share:
        out["concurrent"] = best_mix(g_cont, t, g_share, t_share) / colocated
    return out


# Above this excess the report warns that a mode's window trained from the warm-up's stock.
STOCK_WARNING_SHARE = 0.10


def drawn_from_stock(mode: dict[str, Any]) -> float:
    """How much more the trainer trained than the rollout generated in a mode's measured window, as a
    share of what was generated (0 when it trained no more). An async mode's warm-up step generates
    ahead of what it trains (the staleness budget's batches: 203k tokens generated against 39k trained
    in a long-prompt-kl run on an H100), so a window of a few steps trains from that stock
    and its rates overstate a long run's; colocated, which trains exactly what it generated, stays at 0."""
    generated = mode.get("generated_tokens_per_s", 0.0)
    return max(0.0, mode["tokens_per_s"] / generated - 1) if generated > 0 else 0.0


# A window is steady state when each mode trained within this share of what it generated.
STEADY_STATE_SHARE = 0.05


def window_imbalance(mode: dict[str, Any]) -> float | None:
    """|trained / generated − 1| of a mode's measured window (None when it generated nothing)."""
    generated = mode.get("generated_tokens_per_s", 0.0)
    return abs(mode["tokens_per_s"] / generated - 1) if generated > 0 else None


def is_steady(mode: dict[str, Any]) -> bool:
    imbalance = window_imbalance(mode)
    return imbalance is not None and imbalance <= STEADY_STATE_SHARE


def headline(
    modes: dict[str, dict[str, Any]], bounds: dict[str, float], at_once: float | None
) -> dict[str, dict[str, Any]]:
    """Each mode's speedup over colocated as a headline may state it, trained tokens/s first.

    From the window when both it and colocated trained within ±STEADY_STATE_SHARE of what they generated
    (steady state); otherwise from the bounds of this compare's own rates (colocated's own, time_sliced's
    turn-taking, concurrent's at-once), the most a long run can sustain, or from the window where its ratio
    is the lower (source "window below its bound"): a schedule reaches its bound only in part (a
    long-prompt-kl concurrent run measured 1.44x from its bound over 10 steps, not steady, and 1.35x over
    15 steady ones), and a window that drew from the warm-up's stock overstates too, so the lower of the
    two is the one a headline may state. The window's figure is kept as a footnote (`window_*`) and the
    bound's as `bound_trained_tokens_speedup`. Samples/s only from a steady window (None otherwise).
    No headline (source "non-finite training") for a mode whose run, or colocated's, trained on NaN or
    inf or ended with non-finite weights (`trained_finite`): its rates are those of a broken run."""
    if "colocated" not in modes:
        return {}
    base = modes["colocated"]
    sustained = {**bounds, **({"concurrent": at_once} if at_once else {})}
    out: dict[str, dict[str, Any]] = {}
    for name, mode in modes.items():
        if name == "colocated":
            continue
        window_tokens = mode["tokens_per_s"] / base["tokens_per_s"]
        window_samples = mode["samples_per_s"] / base["samples_per_s"]
        steady = is_steady(mode) and is_steady(base)
        entry: dict[str, Any] = {
            "source": "steady window" if steady else "bounds",
            "window_trained_tokens_speedup": window_tokens,
            "window_samples_speedup": window_samples,
            "window_imbalance": window_imbalance(mode),
        }
        if not (trained_finite(mode) and trained_finite(base)):
            entry.update(source="non-finite training", trained_tokens_speedup=None, samples_speedup=None)
        elif steady:
            entry.update(trained_tokens_speedup=window_tokens, samples_speedup=window_samples)
        elif name in sustained and "colocated" in sustained:
            bound = sustained[name] / sustained["colocated"]
            entry.update(
                source="bounds" if bound <= window_tokens else "window below its bound",
                bound_trained_tokens_speedup=bound,
                trained_tokens_speedup=min(bound, window_tokens),
                samples_speedup=None,
            )
        else:
            entry.update(source="none", trained_tokens_speedup=None, samples_speedup=None)
        out[name] = entry
    return out


# What the card holds besides the trainer's allocated peak and the replica's share: two CUDA contexts,
# the trainer allocator's cached blocks, NCCL/IPC buffers.
SIZING_MARGIN_GIB = 4.0
MIN_REPLICA_SHARE = 0.1


def replica_share_beside(
    trainer_peak_gib: float, card_gib: float, margin_gib: float = SIZING_MARGIN_GIB
) -> float:
    """The replica's `rollout.gpu_memory_utilization` beside a trainer that peaks at `trainer_peak_gib` on a
    card of `card_gib`: what is left after the peak and `margin_gib`, rounded down to 0.05, at most 0.8
    (apps/train's limit). Raises ValueError when less than MIN_REPLICA_SHARE is left."""
    share = min(0.8, int((card_gib - trainer_peak_gib - margin_gib) / card_gib * 20) / 20)
    if share < MIN_REPLICA_SHARE:
        raise ValueError(
            f"the trainer peaks at {trainer_peak_gib:.1f} GiB of the card's {card_gib:.1f}: "
            f"less than {MIN_REPLICA_SHARE} of it is left for a resident replica"
        )
    return share


def concurrent_share_from(results: dict[str, ModeResult]) -> float | None:
    """Concurrent's replica share sized from the trainer's peak in this compare's runs on a GPU (the
    largest over them), or None when none of them measured one (CPU runs, or no mode ran yet)."""
    measured = [r for r in results.values() if r.trainer_peak_mem_gib > 0 and r.gpu_memory_gib > 0]
    if not measured:
        return None
    peak = max(r.trainer_peak_mem_gib for r in measured)
    return replica_share_beside(peak, max(r.gpu_memory_gib for r in measured))


def run_modes(
    config_path: Path | None,
    overrides: list[str],
    modes: list[str],
    out_dir: Path,
    *,
    warmup_steps: int,
    colocated_overrides: list[str] = (),
    colocated_scale: float = 1.0,
    concurrent_overrides: list[str] = (),
    shared_overrides: list[str] = (),
    rates: dict[str, Any] | None = None,
    size_concurrent: bool = False,
    log: Any = print,
) -> dict[str, Any]:
    """Run every mode on the same config (one shared model folder) and compare them.

    `colocated_overrides` apply to the colocated run only and `colocated_scale` multiplies its
    throughput: when the app cannot train data-parallel over all the GPUs, the colocated baseline runs
    on one GPU with 1/k of the batch and counts k× (k independent copies = ideal data parallelism,
    an upper bound for colocated, so the speedup is a lower bound). The JSON records both.
    `shared_overrides` apply to both shared-GPU runs (e.g. their staleness budget), then
    `concurrent_overrides` to the concurrent run only (its memory split, e.g.
    rollout.gpu_memory_utilization=0.35). `rates`: one workload's row of raw_vllm_rates' JSON (g_sync,
    g_cont, t_response, and with --share the shares): the ideals the shared schedules are measured against.
    `size_concurrent`: concurrent's replica gets the share of the card that the trainer's peak in the
    modes run before it leaves (`concurrent_share_from`; list concurrent last), overriding
    `concurrent_overrides`' where one was measured.
    """
    from arl_train.config import load_config
    from arl_train.metrics import read_metrics
    from arl_train.plan import prepare_model
    from arl_train.run import run

    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    # Build the model once (a built-in shape is deterministic): every mode starts from the same weights.
    first = load_config(config_path, overrides)
    model = prepare_model(first, out_dir)
    results: dict[str, ModeResult] = {}
    failed: dict[str, str] = {}
    sized_share: float | None = None  # concurrent's replica share, when size_concurrent sized it
    for mode in modes:
        app_mode, extra = mode_settings(mode)
        if mode == "colocated":
            extra = [*extra, *colocated_overrides]
        if mode in SHARED_MODES:
            extra = [*extra, *shared_overrides]
        if mode == "concurrent":
            extra = [*extra, *concurrent_overrides]
            try:
                sized_share = concurrent_share_from(results) if size_concurrent else None
            except ValueError as exc:  # no room for a replica beside the trainer's peak
                failed[mode] = failure_line(exc)
                log(f"bench: mode {mode} not run: {failed[mode]}")
                continue
            if sized_share is not None:  # last, so it wins over concurrent_overrides'
                extra = [*extra, f"rollout.gpu_memory_utilization={sized_share}"]
        # No final checkpoint unless asked for: it measures nothing and costs minutes at 7B.
        mode_overrides = [
            "trainer.save_final=false",
            *overrides,
            *extra,
            f"model.path={model}",
            f"output.dir={out_dir / mode}",
        ]
        log(f"bench: mode {mode} (app mode {app_mode} {' '.join(extra)}) …")
        started = time.perf_counter()
        # A mode that is refused or fails (e.g. out of GPU memory) is recorded and the others still run:
        # the modes that finished keep their figures and the report is written.
        try:
            config = load_config(config_path, mode_overrides, app_mode)
            summary = run(config, log=lambda line: None)
            rows = read_metrics(out_dir / mode / "metrics.jsonl")
            results[mode] = summarize(mode, app_mode, extra, rows, summary, warmup_steps)
        except Exception as exc:
            failed[mode] = failure_line(exc)
            log(f"bench: mode {mode} failed after {time.perf_counter() - started:.0f} s: {failed[mode]}")
            continue
        if mode == "colocated":
            scale_throughput(results[mode], colocated_scale)
        r = results[mode]
        log(
            f"bench: mode {mode}: {r.samples_per_s:.3f} samples/s, trainer idle {r.trainer_idle_fraction:.0%}, "
            f"rollout idle {r.rollout_idle_fraction:.0%}, sync {r.sync_s_per_step:.3f} s/step "
            f"[{time.perf_counter() - started:.0f} s]"
        )
    return report(
        results,
        failed,
        rates,
        warmup_steps,
        config=str(config_path) if config_path else "apps/train default",
        overrides=overrides,
        colocated_native=app_supports_colocate(),
        colocated_overrides=list(colocated_overrides),
        colocated_scale=colocated_scale,
        concurrent_sized=sized_share,
        model=str(model),
    )


def scale_throughput(result: ModeResult, k: float) -> None:
    """`--colocated-scale k`: count a run k times (k copies of a 1/k-batch run on 1/k of the GPUs)."""
    result.samples_per_s *= k
    result.tokens_per_s *= k
    result.generated_tokens_per_s *= k


def report(
    results: dict[str, ModeResult],
    failed: dict[str, str],
    rates: dict[str, Any] | None,
    warmup_steps: int,
    **recorded: Any,
) -> dict[str, Any]:
    """The compare's result from its modes' figures: each mode's speedup over colocated and slowed
    shares, the turn-taking bounds from this compare's own rates, the ideals from `rates`; `recorded`
    (what was run) goes into it as it is."""
    if "colocated" in results:
        base = results["colocated"].samples_per_s
        for r in results.values():
            r.speedup_over_colocated = r.samples_per_s / base
    alone = alone_rates(results)
    add_slowdowns(results, alone)
    ideals: dict[str, float] = {}
    if rates:
        ideals = ideal_speedups(
            rates["g_sync"],
            rates["g_cont"],
            rates["t_response"],
            rates.get("share_engine", 0.0),
            rates.get("share_trainer", 0.0),
        )
    bounds = turn_taking_ideals(results, alone)
    at_once = at_once_bound(results, alone)
    return {
        "rates_alone": alone,
        "turn_taking_bound_tokens_per_s": bounds,
        "share_of_turn_taking_bound": {m: results[m].tokens_per_s / v for m, v in bounds.items()},
        "at_once_bound_tokens_per_s": at_once,
        "share_of_at_once_bound": results["concurrent"].tokens_per_s / at_once if at_once else None,
        "headline": headline({m: msgspec.to_builtins(r) for m, r in results.items()}, bounds, at_once),
        "ideal_speedups": ideals,
        "share_of_ideal": {
            m: results[m].speedup_over_colocated / v for m, v in ideals.items() if m in results
        },
        "warmup_steps": warmup_steps,
        **recorded,
        "modes": {m: msgspec.to_builtins(r) for m, r in results.items()},
        "failed_modes": failed,
    }


def report_from_runs(
    out_dir: Path, warmup_steps: int, rates: dict[str, Any] | None = None, colocated_scale: float = 1.0
) -> dict[str, Any]:
    """The report of a compare from its run folders (`out_dir/<mode>/`, as `run_modes` writes them), for
    a compare that did not get to write its own: stopped, or its machine taken back. A mode's folder
    without summary.json (its run did not finish) is a failed mode."""
    from types import SimpleNamespace

    from arl_train.metrics import read_metrics

    results: dict[str, ModeResult] = {}
    failed: dict[str, str] = {}
    for mode in BENCH_MODES:
        folder = out_dir / mode
        if not (folder / "metrics.jsonl").exists():
            continue
        if not (folder / "summary.json").exists():
            failed[mode] = f"the run did not finish: {folder / 'summary.json'} is missing"
            continue
        app_mode, extra = mode_settings(mode)
        summary = SimpleNamespace(**json.loads((folder / "summary.json").read_text()))
        try:
            results[mode] = summarize(
                mode, app_mode, extra, read_metrics(folder / "metrics.jsonl"), summary, warmup_steps
            )
        except ValueError as exc:  # too few steps for the warm-up
            failed[mode] = failure_line(exc)
            continue
        if mode == "colocated":
            scale_throughput(results[mode], colocated_scale)
    return report(
        results, failed, rates, warmup_steps, from_runs=str(out_dir), colocated_scale=colocated_scale
    )


def failure_line(exc: BaseException) -> str:
    """A failed mode's error in one line: its type and the last line of its message (a Ray task error
    carries the remote traceback; its last line is the cause, e.g. torch's out-of-memory message)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:2000]
