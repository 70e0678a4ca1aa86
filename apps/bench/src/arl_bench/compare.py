"""One workload, several layouts, side by side: colocated-synchronous and the async modes a–d.

Each mode is a full apps/train run (`arl_train.run.run`) of the same config with the mode's
overrides; the first `warmup_steps` steps of each are left out of the figures (engine start-up,
first compile). Per mode it reports, over the measured window:

- trainer samples/s and sampled tokens/s (what the trainer consumed per second of wall time);
- trainer idle fraction: time spent waiting for samples / step time (`wait_s / step_s`);
- rollout idle fraction: per replica, the share of wall time with no generation call running
  (starved by the staleness budget, paused for a sync, or asleep while the trainer has the GPU);
- generation tokens/s (what the engines produced, kept or not), sync seconds per step, staleness;
- the speedup over colocated (samples/s ratio).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec

BENCH_MODES = ("colocated", "a", "b", "c", "d")


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
    if mode == "colocated":
        # Synchronous (mode a: generate a batch, train on it, sync); colocated when the app can place
        # both sides on the same GPUs. Without that key it is mode a on whatever devices the config names.
        return "a", (["resources.colocate=true"] if app_supports_colocate() else [])
    return mode, (["resources.colocate=false"] if app_supports_colocate() else [])


def summarize(mode: str, app_mode: str, overrides: list[str], rows: list[dict[str, Any]], summary: Any, warmup_steps: int) -> ModeResult:
    """Figures over rows[warmup_steps:] (each row: one trainer step's metrics + rollout stats)."""
    if len(rows) <= warmup_steps:
        raise ValueError(f"mode {mode}: {len(rows)} steps, need more than warmup_steps={warmup_steps}")
    before, window = rows[warmup_steps - 1] if warmup_steps else None, rows[warmup_steps:]
    step_s = sum(r["step_s"] for r in window)
    samples = window[-1]["samples_seen"] - (before["samples_seen"] if before else 0)
    tokens = sum(r["sampled_tokens_per_s"] * r["step_s"] for r in window)
    r0 = before["rollout"] if before else {"engine_busy_s": 0.0, "manager_elapsed_s": 0.0, "engine_generated_tokens": 0.0}
    r1 = window[-1]["rollout"]
    elapsed = r1["manager_elapsed_s"] - r0["manager_elapsed_s"]
    busy = r1["engine_busy_s"] - r0["engine_busy_s"]
    replicas = r1.get("engine_replicas", 1.0)
    return ModeResult(
        mode=mode,
        app_mode=app_mode,
        overrides=overrides,
        steps_measured=len(window),
        samples_per_s=samples / step_s,
        tokens_per_s=tokens / step_s,
        generated_tokens_per_s=(r1["engine_generated_tokens"] - r0["engine_generated_tokens"]) / max(1e-9, elapsed),
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
    )


def run_modes(
    config_path: Path | None,
    overrides: list[str],
    modes: list[str],
    out_dir: Path,
    *,
    warmup_steps: int,
    colocated_overrides: list[str] = (),
    colocated_scale: float = 1.0,
    log: Any = print,
) -> dict[str, Any]:
    """Run every mode on the same config (one shared model folder) and compare them.

    `colocated_overrides` apply to the colocated run only and `colocated_scale` multiplies its
    throughput: when the app cannot train data-parallel over all the GPUs, the colocated baseline runs
    on one GPU with 1/k of the batch and counts k× (k independent copies = ideal data parallelism,
    an upper bound for colocated, so the speedup is a lower bound). The JSON records both.
    """
    import json

    from arl_train.config import load_config
    from arl_train.run import prepare_model, run

    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    # Build the model once (a built-in shape is deterministic): every mode starts from the same weights.
    first = load_config(config_path, overrides)
    model = prepare_model(first, out_dir)
    results: dict[str, ModeResult] = {}
    for mode in modes:
        app_mode, extra = mode_settings(mode)
        if mode == "colocated":
            extra = [*extra, *colocated_overrides]
        # No final checkpoint unless asked for: it measures nothing and costs minutes at 7B.
        mode_overrides = ["trainer.save_final=false", *overrides, *extra, f"model.path={model}", f"output.dir={out_dir / mode}"]
        config = load_config(config_path, mode_overrides, app_mode)
        log(f"bench: mode {mode} (app mode {app_mode} {' '.join(extra)}) …")
        started = time.perf_counter()
        summary = run(config, log=lambda line: None)
        rows = [json.loads(line) for line in (out_dir / mode / "metrics.jsonl").read_text().splitlines() if line]
        results[mode] = summarize(mode, app_mode, extra, rows, summary, warmup_steps)
        if mode == "colocated" and colocated_scale != 1.0:
            r = results[mode]
            r.samples_per_s *= colocated_scale
            r.tokens_per_s *= colocated_scale
            r.generated_tokens_per_s *= colocated_scale
        r = results[mode]
        log(f"bench: mode {mode}: {r.samples_per_s:.3f} samples/s, trainer idle {r.trainer_idle_fraction:.0%}, "
            f"rollout idle {r.rollout_idle_fraction:.0%}, sync {r.sync_s_per_step:.3f} s/step "
            f"[{time.perf_counter() - started:.0f} s]")
    if "colocated" in results:
        base = results["colocated"].samples_per_s
        for r in results.values():
            r.speedup_over_colocated = r.samples_per_s / base
    return {
        "config": str(config_path) if config_path else "apps/train default",
        "overrides": overrides,
        "warmup_steps": warmup_steps,
        "colocated_native": app_supports_colocate(),
        "colocated_overrides": list(colocated_overrides),
        "colocated_scale": colocated_scale,
        "model": str(model),
        "modes": {m: msgspec.to_builtins(r) for m, r in results.items()},
    }
