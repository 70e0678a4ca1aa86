"""Proximal-policy modes: AReaL's log-linear interpolation at its endpoints and in between; bypass."""

import pytest
import torch

from arl.trainer.errors import AlgorithmError
from arl.trainer.proximal import bypass_proximal, loglinear_alpha, loglinear_proximal, proximal_logp_for

torch.set_num_threads(1)


def test_loglinear_endpoints_are_behaviour_and_current():
    behav = torch.tensor([-1.0, -2.0, -0.5])
    current = torch.tensor([-1.4, -1.0, -0.7])
    versions = torch.tensor([3, 3, 3])
    # Proximal at the tokens' own version: the behaviour policy.
    assert torch.equal(loglinear_proximal(behav, current, versions, 3, current_version=7), behav)
    # Proximal at the current version: the current policy.
    assert torch.allclose(loglinear_proximal(behav, current, versions, 7, current_version=7), current)


def test_loglinear_interpolates_per_token_by_version():
    behav = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.0])
    current = torch.tensor([-2.0, -1.0, -0.5, -1.0, -2.0])
    versions = torch.tensor([0, 2, 4, -1, 5])  # mixed versions (partial rollout); −1: no version
    out = loglinear_proximal(behav, current, versions, 3, current_version=4)
    # α = (3 − v) / (4 − v): 3/4, 1/2, (v = 4 = current: 0), (no version: 0), (v = 5 > current: 0)
    alpha = [0.75, 0.5, 0.0, 0.0, 0.0]
    expected = [b + a * (c - b) for a, b, c in zip(alpha, behav.tolist(), current.tolist())]
    assert out.tolist() == pytest.approx(expected)
    assert loglinear_alpha(versions, 3, 4).tolist() == pytest.approx(alpha)
    # Tokens newer than the proximal version but older than current: α clamps to 0 (behaviour).
    assert loglinear_alpha(torch.tensor([3]), 2, 4).item() == 0.0


def test_proximal_is_detached_and_modes_dispatch():
    behav = torch.tensor([-1.0, -2.0])
    current = torch.tensor([-1.5, -1.0], requires_grad=True)
    versions = torch.tensor([0, 1])
    out = loglinear_proximal(behav, current, versions, 1, current_version=2)
    assert not out.requires_grad
    assert torch.equal(bypass_proximal(behav), behav)
    assert torch.equal(proximal_logp_for("bypass", behaviour_logp=behav), behav)
    assert torch.equal(
        proximal_logp_for("recompute", behaviour_logp=behav, computed_logp=current), current.detach()
    )
    assert torch.equal(
        proximal_logp_for("reuse", behaviour_logp=behav, computed_logp=current), current.detach()
    )
    assert torch.equal(
        proximal_logp_for(
            "loglinear",
            behaviour_logp=behav,
            computed_logp=current,
            token_versions=versions,
            proximal_version=1,
            current_version=2,
        ),
        out,
    )
    with pytest.raises(AlgorithmError, match="needs computed_logp"):
        proximal_logp_for("recompute", behaviour_logp=behav)
    with pytest.raises(AlgorithmError, match="loglinear"):
        proximal_logp_for("loglinear", behaviour_logp=behav, computed_logp=current)
    with pytest.raises(AlgorithmError, match="current_version"):
        loglinear_proximal(behav, current, versions, 3, current_version=2)
    with pytest.raises(AlgorithmError, match="share one shape"):
        loglinear_proximal(behav, current, versions[:1], 1, current_version=2)
    with pytest.raises(AlgorithmError, match="unknown proximal mode"):
        proximal_logp_for("guess", behaviour_logp=behav)


def test_fractional_versions_place_the_current_weights_between_publications():
    behav = torch.tensor([-1.0])
    current = torch.tensor([-2.0])
    # Sampled at version 2; proximal = version 3 (start of step); current = 1 of 2 updates later (3.5).
    out = loglinear_proximal(behav, current, torch.tensor([2]), 3, current_version=3.5)
    assert out.item() == pytest.approx(-1.0 + (1 / 1.5) * (-1.0))
