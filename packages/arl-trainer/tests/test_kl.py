"""KL estimators against their definitions and the exact KL of small categorical distributions."""

import pytest
import torch

from arl.trainer.errors import AlgorithmError
from arl.trainer.kl import kl_estimate, kl_k1, kl_k2, kl_k3, kl_low_var

torch.set_num_threads(1)


def test_estimators_match_definitions_and_k2_k3_are_nonnegative():
    torch.manual_seed(0)
    logp = torch.randn(1000) * 2
    ref = torch.randn(1000) * 2
    log_r = ref - logp
    assert torch.allclose(kl_k1(logp, ref), -log_r)
    assert torch.allclose(kl_k2(logp, ref), 0.5 * log_r**2)
    assert torch.allclose(kl_k3(logp, ref), torch.exp(log_r) - 1 - log_r, rtol=1e-5, atol=1e-6)
    assert (kl_k3(logp, ref) >= 0).all() and (kl_k2(logp, ref) >= 0).all()
    # k3 stays >= 0 on tiny differences where exp(x) − 1 − x cancels.
    tiny = torch.tensor([1e-8, -1e-8, 1e-4, -1e-4, 0.0])
    assert (kl_k3(torch.zeros(5), tiny) >= 0).all()
    assert kl_estimate("k3", logp, ref).equal(kl_k3(logp, ref))


def test_low_var_kl_is_k3_within_range_and_clamped_beyond():
    logp = torch.tensor([0.0, 0.0, 0.0])
    ref = torch.tensor([0.5, 2.0, 50.0])
    out = kl_low_var(logp, ref)
    assert out[0].item() == pytest.approx(kl_k3(logp, ref)[0].item())
    assert out[1].item() == pytest.approx(kl_k3(logp, ref)[1].item())
    assert out[2].item() == 10.0


def test_k1_and_k3_are_unbiased_for_the_exact_kl():
    torch.manual_seed(1)
    p = torch.softmax(torch.randn(7, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(7, dtype=torch.float64), -1)
    exact = (p * (p.log() - q.log())).sum()
    # Expectation over x ~ p, computed exactly over the 7 outcomes.
    for fn in (kl_k1, kl_k3):
        assert (p * fn(p.log(), q.log())).sum().item() == pytest.approx(exact.item(), rel=1e-10)


def test_gradient_flows_to_logp_only_and_bad_names_raise():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    ref = torch.tensor([-1.5, -1.0], requires_grad=True)
    kl_k3(logp, ref).sum().backward()
    assert ref.grad is None
    assert torch.allclose(logp.grad, 1 - torch.exp(ref.detach() - logp.detach()))
    with pytest.raises(AlgorithmError, match="unknown kl estimator"):
        kl_estimate("k4", logp, ref)
    with pytest.raises(AlgorithmError, match="shape"):
        kl_estimate("k1", logp, ref[:1])
