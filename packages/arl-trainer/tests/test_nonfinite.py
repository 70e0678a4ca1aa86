"""An update on a NaN gradient is skipped (weights and AdamW state untouched); too many in a row raise."""

import math

import pytest
import torch
from trainer_helpers import NaNSwitch, random_batch

from arl.trainer import HFPolicy, TrainerConfig
from arl.trainer.config import OptimConfig
from arl.trainer.errors import NonFiniteGradientError, TrainerConfigError
from arl.trainer.nonfinite import NonFiniteGuard


def snapshot(policy):
    weights = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    state = {
        id(p): {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
        for p, s in policy.optimizer.state.items()
    }
    return weights, state


def assert_same(a, b):
    weights_a, state_a = a
    weights_b, state_b = b
    for name, w in weights_a.items():
        assert torch.equal(w, weights_b[name]), name
    assert state_a.keys() == state_b.keys()
    for key, s in state_a.items():
        for k, v in s.items():
            assert torch.equal(v, state_b[key][k]) if torch.is_tensor(v) else v == state_b[key][k], k


def test_a_nan_update_is_skipped_and_training_goes_on(tiny_model_dir):
    batch = random_batch(seed=3)
    rows = batch.input_ids.shape[0]
    policy = HFPolicy(tiny_model_dir, TrainerConfig(optim=OptimConfig(lr=1e-2, max_nonfinite_skips=3)))
    switch = NaNSwitch(policy.model)
    first = policy.train_step(batch, mini_batch_rows=rows)  # a finite update: AdamW has state now
    assert first["nonfinite_skipped"] == 0.0 and math.isfinite(first["grad_norm"])
    before = snapshot(policy)

    switch.on = True
    skipped = policy.train_step(batch, mini_batch_rows=rows)
    assert skipped["nonfinite_skipped"] == 1.0
    assert math.isnan(skipped["grad_norm"]) and math.isnan(skipped["loss"])
    assert_same(snapshot(policy), before)  # not one weight or moment moved
    for p in policy.model.parameters():
        assert p.grad is None  # the NaN gradients are gone, not carried into the next update

    switch.on = False
    after = policy.train_step(batch, mini_batch_rows=rows)
    assert after["nonfinite_skipped"] == 0.0 and math.isfinite(after["loss"])
    weights, _ = snapshot(policy)
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert any(not torch.equal(w, before[0][n]) for n, w in weights.items())  # it trained again


def test_more_nan_updates_in_a_row_than_allowed_raise(tiny_model_dir):
    batch = random_batch(seed=4)
    rows = batch.input_ids.shape[0]
    half = rows // 2  # two updates per step
    policy = HFPolicy(tiny_model_dir, TrainerConfig(optim=OptimConfig(lr=1e-2, max_nonfinite_skips=2)))
    switch = NaNSwitch(policy.model)
    policy.train_step(batch, mini_batch_rows=half)
    before = snapshot(policy)
    switch.on = True
    assert policy.train_step(batch, mini_batch_rows=half)["nonfinite_skipped"] == 2.0  # two in a row: allowed
    with pytest.raises(NonFiniteGradientError, match="3 updates in a row.*max_nonfinite_skips = 2"):
        policy.train_step(batch, mini_batch_rows=half)  # the third in a row
    assert_same(snapshot(policy), before)


def test_guard_counts_runs_not_totals():
    guard = NonFiniteGuard(max_consecutive=1)
    assert guard.admit(1.0, 0.1)
    assert not guard.admit(float("nan"), float("nan"))
    assert guard.admit(2.0, 0.1)  # a finite update ends the run
    assert not guard.admit(float("inf"), 0.1)
    with pytest.raises(NonFiniteGradientError, match="2 updates in a row"):
        guard.admit(float("nan"), float("nan"), version=7)
    assert guard.skipped_total == 3
    with pytest.raises(TrainerConfigError, match="max_nonfinite_skips"):
        OptimConfig(max_nonfinite_skips=-1)
