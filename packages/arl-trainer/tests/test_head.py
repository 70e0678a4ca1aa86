"""The chunked log-prob/entropy head equals log_softmax, gradients included."""

import pytest
import torch

from arl.trainer.head import chunked_log_probs


def reference(hidden, weight, targets, temperature):
    logp_all = torch.log_softmax((hidden @ weight.t()).float() / temperature, -1)
    return logp_all.gather(1, targets[:, None])[:, 0], -(logp_all.exp() * logp_all).sum(-1)


@pytest.mark.parametrize("chunk_rows", [1, 7, 1000])
def test_chunked_head_equals_log_softmax_with_gradients(chunk_rows):
    torch.manual_seed(0)
    n, d, v = 29, 16, 97
    hidden = torch.randn(n, d, requires_grad=True)
    weight = torch.randn(v, d, requires_grad=True)
    targets = torch.randint(0, v, (n,))
    logp, ent = chunked_log_probs(hidden, weight, targets, temperature=0.7, chunk_elements=chunk_rows * v)
    ref_logp, ref_ent = reference(hidden, weight, targets, 0.7)
    assert torch.allclose(logp, ref_logp, atol=1e-5) and torch.allclose(ent, ref_ent, atol=1e-5)
    g1, g2 = torch.randn(n), torch.randn(n)
    got = torch.autograd.grad((logp * g1).sum() + (ent * g2).sum(), [hidden, weight])
    want = torch.autograd.grad((ref_logp * g1).sum() + (ref_ent * g2).sum(), [hidden, weight])
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def test_chunked_head_only_logp_grad_and_gradcheck():
    torch.manual_seed(1)
    hidden = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 4, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (5,))
    assert torch.autograd.gradcheck(
        lambda h, w: chunked_log_probs(h, w, targets, temperature=1.3, chunk_elements=22), (hidden, weight)
    )
    logp, _ = chunked_log_probs(hidden, weight, targets, chunk_elements=22)
    logp.sum().backward()  # entropy unused: its gradient is None
    assert hidden.grad is not None and weight.grad is not None


def test_bad_shapes_and_empty_input():
    with pytest.raises(ValueError, match="do not match"):
        chunked_log_probs(torch.randn(3, 4), torch.randn(5, 3), torch.zeros(3, dtype=torch.long))
    w = torch.randn(5, 4, requires_grad=True)
    logp, ent = chunked_log_probs(torch.randn(0, 4), w, torch.zeros(0, dtype=torch.long))
    assert logp.shape == (0,) and ent.shape == (0,)
