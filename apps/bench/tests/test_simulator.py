"""The simulator on its own: consistent with the issue's ideal-speedup formula where that formula
is exact, deterministic, and showing the long-tail gain of mode d. Fast (virtual clock)."""

import pytest

from arl.rollout.testing import DecodeCost
from arl_bench.simulate import Calibration, SimWorkload, SyncCost, TrainCost, load_calibration, simulate


def calibration(decode_rate_at, train_tokens_per_s, sync_s=0.0):
    xs = sorted(decode_rate_at)
    return Calibration(
        decode=DecodeCost(batch_sizes=xs, tokens_per_s=[decode_rate_at[x] for x in xs]),
        train=TrainCost(tokens_per_s_per_gpu=train_tokens_per_s),
        sync=SyncCost(split_s=sync_s, colocated_s=sync_s),
    )


def test_without_a_tail_or_batch_effect_the_split_matches_the_formula():
    # Equal lengths, a replica decodes 1000 tokens/s whatever its batch, the trainer as fast per GPU:
    # ideal = (1/g + 1/t) / (2·max(1/g, 1/t)) = 1 on 2 GPUs. Staleness 1: with equal lengths a whole
    # batch finishes at once, so the rollout must be allowed a full batch ahead to overlap the trainer
    # (at 0.5 the budget is spent before training starts and the split runs serially: 0.5×).
    calib = calibration({1: 1000.0}, train_tokens_per_s=1000.0)
    w = SimWorkload(
        source="builtin:longtail?median=100&sigma=0.000001&max=100",
        prompt_len=1,
        n=4,
        prompts_per_step=8,
        steps=8,
        warmup_steps=2,
    )
    coloc, split = simulate("colocated", 2, calib, w), simulate("d", 2, calib, w, staleness=1.0)
    assert split.samples_per_s / coloc.samples_per_s == pytest.approx(1.0, rel=0.1)
    assert simulate("d", 2, calib, w).samples_per_s / coloc.samples_per_s == pytest.approx(0.5, rel=0.1)
    # A trainer 3× slower per GPU: colocated pays 1/g + 1/t per token over 2 GPUs, the split max(1/g, 1/t)
    # on one each: (1/1000 + 3/1000) / (2 · 3/1000) = 0.67.
    slow = calibration({1: 1000.0}, train_tokens_per_s=1000.0 / 3)
    ratio = (
        simulate("d", 2, slow, w, staleness=1.0).samples_per_s
        / simulate("colocated", 2, slow, w).samples_per_s
    )
    assert ratio == pytest.approx(2 / 3, rel=0.1)


def test_long_tail_favours_mode_d_and_staleness_stays_bounded():
    calib = load_calibration("h200")
    w = SimWorkload(prompts_per_step_per_gpu=8, steps=6, warmup_steps=2, token_unit=16)
    balanced = calib.decode.rate(128) * 0.6  # training about as costly as decoding
    calib.train.tokens_per_s_per_gpu = balanced
    results = {m: simulate(m, 4, calib, w) for m in ("colocated", "a", "d")}
    assert results["d"].samples_per_s > 1.1 * results["colocated"].samples_per_s
    assert results["d"].samples_per_s > results["a"].samples_per_s
    assert results["colocated"].staleness_mean == 0.0 and results["a"].staleness_mean == 0.0
    assert 0.0 < results["d"].staleness_mean <= 1.0
    assert results["d"].engine_idle_fraction < results["a"].engine_idle_fraction
    for r in results.values():
        assert 0.0 <= r.engine_idle_fraction <= 1.0 and 0.0 <= r.trainer_idle_fraction <= 1.0
    again = simulate("d", 4, calib, w)
    assert (again.samples_per_s, again.staleness_mean) == (
        results["d"].samples_per_s,
        results["d"].staleness_mean,
    )


def test_bad_calibration_and_layout_are_named(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[decode]\nbatch_sizes = [1]\n")
    with pytest.raises(ValueError, match="tokens_per_s"):
        load_calibration(bad)
    calib = calibration({1: 1000.0}, 1000.0)
    with pytest.raises(ValueError, match="no trainer GPU"):
        simulate("d", 1, calib, SimWorkload(steps=3, warmup_steps=1))
    with pytest.raises(ValueError, match="unknown mode"):
        simulate("e", 2, calib, SimWorkload(steps=3, warmup_steps=1))


def test_shared_schedules_match_their_formulas_without_a_tail():
    """One GPU, equal lengths, a decode rate that ignores the batch: time_sliced has no tail to skip, so
    it takes turns as colocated does (1×); concurrent at full shares does both at once (min(g, t) against
    1/(1/g + 1/t): 2× when t = g), at half shares no more than taking turns (1×)."""
    from arl_bench.simulate import ShareCost

    calib = calibration({1: 1000.0}, train_tokens_per_s=1000.0)
    w = SimWorkload(
        source="builtin:longtail?median=100&sigma=0.000001&max=100",
        prompt_len=1,
        n=4,
        prompts_per_step=8,
        steps=10,
        warmup_steps=2,
    )
    coloc = simulate("colocated", 1, calib, w).samples_per_s
    assert simulate("time_sliced", 1, calib, w, staleness=1.0).samples_per_s / coloc == pytest.approx(
        1.0, rel=0.1
    )
    calib.share = ShareCost(engine=1.0, trainer=1.0)
    assert simulate("concurrent", 1, calib, w, staleness=1.0).samples_per_s / coloc == pytest.approx(
        2.0, rel=0.1
    )
    calib.share = ShareCost(engine=0.5, trainer=0.5)
    assert simulate("concurrent", 1, calib, w, staleness=1.0).samples_per_s / coloc == pytest.approx(
        1.0, rel=0.1
    )


def test_on_the_long_tail_time_sliced_beats_colocated_on_the_same_gpus():
    calib = load_calibration("h200_shared")
    w = SimWorkload(prompts_per_step=16, steps=8, warmup_steps=2, token_unit=32)
    coloc, sliced = simulate("colocated", 1, calib, w), simulate("time_sliced", 1, calib, w, staleness=1.0)
    assert sliced.samples_per_s > 1.2 * coloc.samples_per_s
    assert sliced.replicas == sliced.trainer_gpus == 1 and 0.0 < sliced.staleness_mean <= 1.5
