"""Advantage estimators and KL-in-reward shaping against per-group loops."""

import pytest
import torch

from arl.trainer.advantages import compute_advantages, grpo_advantages, kl_penalized_rewards, rloo_advantages
from arl.trainer.algorithms import grpo_advantages as reexported
from arl.trainer.errors import AlgorithmError

torch.set_num_threads(1)


def test_rloo_matches_leave_one_out_loop_and_single_groups_get_zero():
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0, 0.3, 0.9, 4.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    out = rloo_advantages(rewards, groups)
    for i in range(7):
        others = [rewards[j].item() for j in range(7) if groups[j] == groups[i] and j != i]
        expected = rewards[i].item() - sum(others) / len(others) if others else 0.0
        assert out[i].item() == pytest.approx(expected, abs=1e-6)


def test_estimator_dispatch_and_reexport():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
    groups = torch.tensor([0, 0, 1, 1])
    assert reexported is grpo_advantages
    assert torch.equal(compute_advantages("grpo", rewards, groups), grpo_advantages(rewards, groups))
    assert compute_advantages("dr_grpo", rewards, groups).tolist() == [0.5, -0.5, 0.0, 0.0]
    assert torch.equal(compute_advantages("rloo", rewards, groups), rloo_advantages(rewards, groups))
    with pytest.raises(AlgorithmError, match="unknown advantage estimator"):
        compute_advantages("ppo", rewards, groups)
    with pytest.raises(AlgorithmError, match="rewards must have shape"):
        grpo_advantages(rewards[:3], groups)


def test_kl_penalized_rewards_subtract_coef_times_summed_token_kl():
    rewards = torch.tensor([1.0, 0.0, 0.5])
    seq_index = torch.tensor([0, 0, 2, 1, 2, 2])
    token_kl = torch.tensor([0.1, 0.2, 0.05, 0.3, 0.05, 0.1], requires_grad=True)
    out = kl_penalized_rewards(rewards, token_kl, seq_index, 0.5)
    assert out.tolist() == pytest.approx([1.0 - 0.5 * 0.3, 0.0 - 0.5 * 0.3, 0.5 - 0.5 * 0.2])
    assert not out.requires_grad
