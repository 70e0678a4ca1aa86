"""`summarize`: one mode's figures over the measured window of its metrics rows (rows as apps/train
writes them: one per trainer step, the rollout's running totals under `rollout`)."""

from types import SimpleNamespace

import pytest

from arl_bench.cli import _write_and_print
from arl_bench.compare import drawn_from_stock, summarize
from arl_bench.report import COLUMNS, best_schedule_line, table


def step_row(step: int, **extra: float) -> dict:
    """Step `step` of a run that trains 100 samples of 1,000 tokens in 10 s a step, generating the whole time."""
    return {
        "step_s": 10.0,
        "samples_seen": 100 * step,
        "sampled_tokens_per_s": 1000.0,
        "train_s": 4.0,
        "wait_s": 6.0,
        "sync_s": 0.5,
        "staleness_mean": 0.5,
        "staleness_max": 2,
        "response_length_mean": 100.0,
        "rollout": {
            "manager_elapsed_s": 10.0 * step,
            "engine_busy_s": 9.0 * step,
            "engine_generated_tokens": 12000.0 * step,
            "engine_replicas": 1.0,
            "resumed_requests": 3 * step,
        },
        **extra,
    }


def test_the_window_leaves_the_warm_up_out_and_takes_the_trainers_peak_memory():
    rows = [
        step_row(1, peak_mem_update_gib=70.0),  # warm-up: left out
        step_row(2, peak_mem_update_gib=50.5, peak_mem_proximal_gib=11.4),
        step_row(3, peak_mem_update_gib=49.0, peak_mem_ref_gib=52.25),
    ]
    summary = SimpleNamespace(weights_equal_after_sync=True, wall_s=30.0, output_dir="/runs/x")
    r = summarize("time_sliced", "d", [], rows, summary, warmup_steps=1)
    assert r.steps_measured == 2
    assert r.samples_per_s == pytest.approx(200 / 20)
    assert r.trainer_idle_fraction == pytest.approx(0.6) and r.trainer_work_fraction == pytest.approx(0.4)
    assert r.rollout_rate == pytest.approx(24000 / 18) and r.resumed_requests == 6
    assert r.trainer_peak_mem_gib == 52.25  # the reference pass of step 3, not the warm-up's 70
    assert r.gpu_memory_gib == 0.0  # a summary without the trainer's placement (a CPU run's has 0)
    # CPU
    assert summarize("colocated", "a", [], [step_row(1), step_row(2)], summary, 1).trainer_peak_mem_gib == 0.0
    on_gpu = SimpleNamespace(
        weights_equal_after_sync=True,
        wall_s=30.0,
        output_dir="/runs/x",
        trainer={"device": "cuda", "gpu_memory_gib": 79.2},
    )
    assert summarize("time_sliced", "d", [], rows, on_gpu, 1).gpu_memory_gib == 79.2  # the card, for sizing


def test_the_table_leaves_a_cell_blank_where_the_compare_had_no_colocated_run():
    row = {"samples_per_s": 1.146, "tokens_per_s": 6772.3, "speedup_over_colocated": float("nan")}
    line = table({"time_sliced": row}).splitlines()[2]
    assert "1.146" in line and "6772" in line
    assert "nan" not in line and line.count("—") == len(COLUMNS) - 2  # the speedup and the columns not given


def test_a_window_that_trained_more_than_it_generated_is_flagged(tmp_path, capsys):
    """Figures of a 4-step long-prompt-kl compare on an H100: time_sliced trained 6,310 tokens/s while
    generating 4,997, colocated exactly what it generated."""
    colocated = {
        "samples_per_s": 0.719,
        "tokens_per_s": 4953.4,
        "generated_tokens_per_s": 4952.3,
        "trainer_idle_fraction": 0.56,
        "rollout_idle_fraction": 0.42,
        "speedup_over_colocated": 1.0,
        "weights_equal_after_sync": True,
    }
    time_sliced = {
        **colocated,
        "tokens_per_s": 6310.4,
        "generated_tokens_per_s": 4996.7,
        "speedup_over_colocated": 1.49,
    }
    assert drawn_from_stock(colocated) == pytest.approx(0.0002, abs=1e-4)
    assert drawn_from_stock(time_sliced) == pytest.approx(0.263, abs=1e-3)
    # a run that generated nothing
    assert drawn_from_stock({"tokens_per_s": 10.0, "generated_tokens_per_s": 0.0}) == 0.0
    result = {"modes": {"colocated": colocated, "time_sliced": time_sliced}, "failed_modes": {}}
    assert _write_and_print(result, tmp_path) == 0
    out = capsys.readouterr().out
    assert "time_sliced trained 26% more tokens than it generated" in out
    assert "colocated trained" not in out


def test_a_run_that_trained_on_nan_gets_no_headline(tmp_path, capsys):
    """A concurrent run on an H100 whose loss went NaN from its second step while its step times stayed
    those of a healthy run: its figures must not become a headline."""
    from arl_bench.compare import headline

    nan = float("nan")
    rows = [step_row(1, loss=-7e-4, grad_norm=0.4)] + [step_row(s, loss=nan, grad_norm=nan) for s in (2, 3)]
    summary = SimpleNamespace(weights_equal_after_sync=True, wall_s=30.0, output_dir="/runs/x")
    broken = summarize("concurrent", "d", [], rows, summary, warmup_steps=1)
    assert broken.nonfinite_steps == 2
    skipped = [step_row(1), step_row(2, nonfinite_skipped=1.0, loss=nan, grad_norm=nan), step_row(3)]
    assert summarize("concurrent", "d", [], skipped, summary, 1).nonfinite_steps == 1  # a skipped update
    healthy = summarize(
        "colocated", "a", [], [step_row(s, loss=0.1, grad_norm=0.5) for s in (1, 2, 3)], summary, 1
    )
    assert healthy.nonfinite_steps == 0

    import msgspec

    modes = {"colocated": msgspec.to_builtins(healthy), "concurrent": msgspec.to_builtins(broken)}
    h = headline(modes, {}, None)["concurrent"]
    assert h["source"] == "non-finite training" and h["trained_tokens_speedup"] is None
    assert h["window_trained_tokens_speedup"] == pytest.approx(1.0)  # kept, as a footnote
    result = {"modes": modes, "failed_modes": {}, "headline": headline(modes, {}, None)}
    assert _write_and_print(result, tmp_path) == 1
    captured = capsys.readouterr()
    assert "concurrent: no headline (its run or colocated's trained on NaN/inf" in captured.out
    assert "concurrent trained on NaN/inf in 2 of its steps" in captured.err
    # finite steps but NaN weights at the end (apps/train's check): no headline either
    nan_weights = SimpleNamespace(**{**vars(summary), "weights_finite": False})
    ended_nan = summarize("concurrent", "d", [], [step_row(s) for s in (1, 2, 3)], nan_weights, 1)
    assert ended_nan.nonfinite_steps == 0 and not ended_nan.weights_finite
    modes["concurrent"] = msgspec.to_builtins(ended_nan)
    assert headline(modes, {}, None)["concurrent"]["source"] == "non-finite training"


def test_a_trainer_whose_gemms_were_repaired_is_named(tmp_path, capsys):
    """The trainer's startup check planned its GEMMs for fewer SMs (a capped MPS client): its steps
    carry gemm_sm_target, and the report says so beside the figures."""
    import msgspec

    summary = SimpleNamespace(weights_equal_after_sync=True, wall_s=30.0, output_dir="/runs/x")
    repaired = summarize(
        "concurrent", "d", [], [step_row(s, gemm_sm_target=68.0) for s in (1, 2, 3)], summary, 1
    )
    plain = summarize("colocated", "a", [], [step_row(s) for s in (1, 2, 3)], summary, 1)
    assert (repaired.gemm_sm_target, plain.gemm_sm_target) == (68, 0)
    modes = {"colocated": msgspec.to_builtins(plain), "concurrent": msgspec.to_builtins(repaired)}
    assert _write_and_print({"modes": modes, "failed_modes": {}, "headline": {}}, tmp_path) == 0
    out = capsys.readouterr().out
    assert "concurrent's trainer found its GEMMs wrong at startup and planned them for 68 SMs" in out
    assert "colocated's trainer" not in out


def test_an_ideal_for_a_mode_the_compare_did_not_run_says_so(tmp_path, capsys):
    """Raw rates give ideals for both shared schedules; a compare that ran only one of them reports the
    other's ideal as not run rather than a share of nothing."""
    import msgspec

    summary = SimpleNamespace(weights_equal_after_sync=True, wall_s=30.0, output_dir="/runs/x")
    modes = {
        m: msgspec.to_builtins(summarize(m, a, [], [step_row(s) for s in (1, 2, 3)], summary, 1))
        for m, a in (("colocated", "a"), ("concurrent", "d"))
    }
    result = {
        "modes": modes,
        "failed_modes": {},
        "headline": {},
        "ideal_speedups": {"time_sliced": 1.11, "concurrent": 1.19},
        "share_of_ideal": {"concurrent": 1.16},
    }
    assert _write_and_print(result, tmp_path) == 0
    out = capsys.readouterr().out
    assert "time_sliced 1.11× (not run), concurrent 1.19× (measured 116% of it)" in out


def test_the_best_schedule_is_named_with_its_margin_over_the_next():
    """The headlines of the side-by-side long-prompt-kl compare on an H100 (2026-12-07): concurrent from a
    steady window, time_sliced from its bounds; a mode without a headline figure is left out."""
    headline = {
        "time_sliced": {"source": "bounds", "trained_tokens_speedup": 1.2177},
        "concurrent": {"source": "steady window", "trained_tokens_speedup": 1.3430},
        "b": {"source": "non-finite training", "trained_tokens_speedup": None},
    }
    assert best_schedule_line(headline) == (
        "best schedule by its headline: concurrent (1.34× colocated in trained tokens/s), 1.10× time_sliced's 1.22×"
    )
    assert best_schedule_line({"concurrent": headline["concurrent"], "b": headline["b"]}) is None
