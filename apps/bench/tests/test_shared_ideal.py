"""The shared-GPU figures of `compare` (pure functions): the ideal of each schedule over colocated from
the raw rates, and each side's share of wall time slowed by the other."""

import pytest

from arl_bench.compare import (
    ModeResult,
    add_slowdowns,
    alone_rates,
    at_once_bound,
    best_mix,
    ideal_speedups,
    mode_settings,
    turn_taking_ideals,
)


def test_ideals_from_the_rates():
    # Taking turns: colocated decodes at g_sync, time_sliced at g_cont; both then train at t.
    ideal = ideal_speedups(g_sync=1000.0, g_cont=2000.0, t=2000.0)
    assert ideal == {"time_sliced": pytest.approx((1 / 1000 + 1 / 2000) / (1 / 2000 + 1 / 2000))}
    # At full shares both run at once at min(g, t); at half shares it is no better than taking turns.
    assert best_mix(2000.0, 2000.0, 1.0, 1.0) == pytest.approx(2000.0)
    assert best_mix(2000.0, 2000.0, 0.5, 0.5) == pytest.approx(1000.0)
    # Engine slower when shared: at once for x of the time, the engine alone for the rest, balanced.
    g, t, gs, ts = 1000.0, 3000.0, 0.6, 0.6
    x = g / (g + t * ts - g * gs)
    assert best_mix(g, t, gs, ts) == pytest.approx(x * t * ts)
    assert x * g * gs + (1 - x) * g == pytest.approx(x * t * ts)  # both sides make the same tokens
    assert ideal_speedups(1000.0, 2000.0, 2000.0, 1.0, 1.0)["concurrent"] == pytest.approx(
        2000.0 / (1 / (1 / 1000 + 1 / 2000))
    )


def _mode(trainer_rate, rollout_rate, trainer_work=0.5, rollout_work=0.5):
    return ModeResult(
        mode="m",
        app_mode="d",
        overrides=[],
        steps_measured=1,
        samples_per_s=1.0,
        tokens_per_s=1.0,
        generated_tokens_per_s=1.0,
        trainer_idle_fraction=0.5,
        rollout_idle_fraction=0.5,
        sync_s_per_step=0.0,
        staleness_mean=0.0,
        train_s_per_step=1.0,
        step_s_mean=2.0,
        response_length_mean=1.0,
        weights_equal_after_sync=True,
        wall_s=1.0,
        output_dir="",
        trainer_rate=trainer_rate,
        rollout_rate=rollout_rate,
        trainer_work_fraction=trainer_work,
        rollout_work_fraction=rollout_work,
    )


def test_slowed_shares_use_the_rates_alone_of_the_same_compare():
    results = {
        "colocated": _mode(100.0, 50.0),
        "time_sliced": _mode(100.0, 80.0),
        "concurrent": _mode(50.0, 40.0, trainer_work=0.6, rollout_work=1.0),
    }
    alone = alone_rates(results)
    assert alone == {
        "trainer": 100.0,
        "rollout": 80.0,
    }  # colocated's draining batches are not the engine's best
    add_slowdowns(results, alone)
    assert results["concurrent"].trainer_slowed_fraction == pytest.approx(0.3)
    assert results["concurrent"].rollout_slowed_fraction == pytest.approx(0.5)
    assert (
        results["time_sliced"].trainer_slowed_fraction
        == 0.0
        == results["time_sliced"].rollout_slowed_fraction
    )


def test_shared_modes_run_as_mode_d_on_the_shared_gpus():
    assert mode_settings("time_sliced") == ("d", ["resources.shared_gpu=time_sliced"])
    assert mode_settings("concurrent") == ("d", ["resources.shared_gpu=concurrent"])


def test_turn_taking_bound_from_the_rates_alone_of_the_same_compare():
    results = {
        "colocated": _mode(100.0, 50.0),
        "time_sliced": _mode(100.0, 80.0),
        "concurrent": _mode(50.0, 40.0),
    }
    bounds = turn_taking_ideals(results, alone_rates(results))
    # 1/(1/100 + 1/80) for both shared schedules; colocated at its own draining rate 1/(1/100 + 1/50).
    assert bounds == pytest.approx({"time_sliced": 400 / 9, "concurrent": 400 / 9, "colocated": 100 / 3})
    assert turn_taking_ideals({"colocated": _mode(100.0, 50.0)}, {"trainer": 100.0}) == {}


def test_concurrents_bound_is_the_best_mix_of_the_shares_it_kept():
    results = {"time_sliced": _mode(100.0, 100.0), "concurrent": _mode(60.0, 60.0)}
    # At once each side kept 60%: always at once gives 60 tokens/s, more than taking turns (50).
    assert at_once_bound(results, alone_rates(results)) == pytest.approx(60.0)
    # The trainer kept 40%, the replica 80%: at once for x of the time, the trainer alone for the rest,
    # x·80 = x·40 + (1 − x)·100, so x = 100/140 and the bound is 80·x.
    results["concurrent"] = _mode(40.0, 80.0)
    assert at_once_bound(results, alone_rates(results)) == pytest.approx(80 * 100 / 140)
    assert at_once_bound({"time_sliced": _mode(100.0, 100.0)}, {"trainer": 100.0, "rollout": 100.0}) is None


def _window(trained, generated, samples):
    return {"tokens_per_s": trained, "generated_tokens_per_s": generated, "samples_per_s": samples}


def test_the_headline_comes_from_a_steady_window_or_else_from_the_bounds():
    from arl_bench.compare import headline
    from arl_bench.report import headline_line

    bounds = {"colocated": 5617.0, "time_sliced": 7302.0}
    # Both trained within ±5% of what they generated: the window's own ratios, tokens first.
    steady = {"colocated": _window(5000.0, 5000.0, 10.0), "time_sliced": _window(6300.0, 6100.0, 14.0)}
    h = headline(steady, bounds, None)["time_sliced"]
    assert h["source"] == "steady window" and h["trained_tokens_speedup"] == pytest.approx(1.26)
    assert h["samples_speedup"] == pytest.approx(1.4)
    # time_sliced trained 26% more than it generated (the warm-up's stock): the bounds' 1.30x, the window's
    # 1.32x only as a footnote; no samples/s headline.
    stock = {
        "colocated": _window(4953.0, 4952.0, 10.0),
        "time_sliced": _window(6538.0, 5189.0, 15.4),
        "concurrent": _window(7281.0, 5763.0, 12.1),
    }
    h = headline(stock, bounds, 7730.0)
    assert h["time_sliced"]["source"] == "bounds" and h["time_sliced"]["samples_speedup"] is None
    assert h["time_sliced"]["trained_tokens_speedup"] == pytest.approx(7302 / 5617)
    assert h["time_sliced"]["window_trained_tokens_speedup"] == pytest.approx(6538 / 4953)
    assert h["concurrent"]["trained_tokens_speedup"] == pytest.approx(7730 / 5617)
    line = headline_line(h)
    assert "time_sliced 1.30× trained tokens/s from the bounds" in line and "footnote" in line
    assert headline({"time_sliced": _window(1.0, 1.0, 1.0)}, bounds, None) == {}  # no colocated: no headline
    # Not steady, and the window's ratio below the bound's (the schedule short of its bound): the lower,
    # the window's, is stated; the bound's is kept. Long-prompt-kl on an H100: 1.38x window, 1.44x bound.
    short = {"colocated": _window(6237.0, 6234.0, 0.903), "concurrent": _window(8586.0, 8117.0, 1.202)}
    h = headline(short, {"colocated": 6368.0}, 9160.0)["concurrent"]
    assert h["source"] == "window below its bound" and h["samples_speedup"] is None
    assert h["trained_tokens_speedup"] == pytest.approx(8586 / 6237)
    assert h["bound_trained_tokens_speedup"] == pytest.approx(9160 / 6368)
    assert "concurrent 1.38× trained tokens/s from the window, below its bound's 1.44×" in headline_line(
        {"concurrent": h}
    )
