"""The chunked log-prob/entropy head equals log_softmax, gradients included."""

import os
import subprocess
import sys

import pytest
import torch

from arl.trainer.head import chunked_log_probs


def reference(hidden, weight, targets, temperature):
    logp_all = torch.log_softmax((hidden @ weight.t()).float() / temperature, -1)
    return logp_all.gather(1, targets[:, None])[:, 0], -(logp_all.exp() * logp_all).sum(-1)


@pytest.mark.parametrize("chunk_rows", [1, 7, 1000])
@pytest.mark.parametrize("v", [97, 96])  # one segment per row; 16 segments per row (see head._segments)
def test_chunked_head_equals_log_softmax_with_gradients(chunk_rows, v):
    torch.manual_seed(0)
    n, d = 29, 16
    hidden = torch.randn(n, d, requires_grad=True)
    weight = torch.randn(v, d, requires_grad=True)
    targets = torch.randint(0, v, (n,))
    logp, ent = chunked_log_probs(hidden, weight, targets, temperature=0.7, chunk_elements=chunk_rows * v)
    ref_logp, ref_ent = reference(hidden, weight, targets, 0.7)
    assert torch.allclose(logp, ref_logp, atol=1e-5) and torch.allclose(ent, ref_ent, atol=1e-5)
    g1, g2 = torch.randn(n), torch.randn(n)
    got = torch.autograd.grad((logp * g1).sum() + (ent * g2).sum(), [hidden, weight])
    want = torch.autograd.grad((ref_logp * g1).sum() + (ref_ent * g2).sum(), [hidden, weight])
    for a, b in zip(got, want):  # fp32 rounding only: ~1e-6 relative
        assert (a - b).norm() <= 1e-5 * b.norm()


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


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.detach().float() - want.detach()).norm() / want.detach().norm())


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_bf16_head_gradients_match_fp32_reference(temperature):
    # bf16 matmuls, fp32 softmax: the logits' gradient is formed in fp32 and stored once in bf16.
    torch.manual_seed(2)
    n, d, v = 64, 32, 301
    h32, w32 = torch.randn(n, d) * 0.5, torch.randn(v, d) * 0.3
    targets = torch.randint(0, v, (n,))
    h = h32.to(torch.bfloat16).requires_grad_()
    w = w32.to(torch.bfloat16).requires_grad_()
    logp, ent = chunked_log_probs(h, w, targets, temperature=temperature, chunk_elements=9 * v)
    assert logp.dtype == torch.float32 and ent.dtype == torch.float32
    hr, wr = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ref_logp, ref_ent = reference(hr, wr, targets, temperature)
    assert _relative_error(logp, ref_logp) < 1e-2 and _relative_error(ent, ref_ent) < 1e-2
    g1, g2 = torch.randn(n), torch.randn(n)
    got = torch.autograd.grad((logp * g1).sum() + (ent * g2).sum(), [h, w])
    want = torch.autograd.grad((ref_logp * g1).sum() + (ref_ent * g2).sum(), [hr, wr])
    assert got[0].dtype == torch.bfloat16 and got[1].dtype == torch.bfloat16
    for a, b in zip(got, want):
        assert _relative_error(a, b) < 2e-2


def test_confident_target_gradient_keeps_its_small_value_in_bf16():
    # p(target) ≈ 1: the target's logit gradient g·(1 − p) is tiny next to g; formed in bf16 as
    # bf16(−p·g) + g it would be lost. It must keep its fp32 value (up to bf16 storage).
    v, d = 50, 8
    w = torch.zeros(v, d)
    w[3, 0] = 1.0
    h = torch.zeros(4, d)
    h[:, 0] = torch.tensor([8.0, 9.0, 10.0, 11.0])  # p(3) = 1 − ~49·e^(−x)
    targets = torch.full((4,), 3)
    hb, wb = h.to(torch.bfloat16).requires_grad_(), w.to(torch.bfloat16).requires_grad_()
    logp, _ = chunked_log_probs(hb, wb, targets)
    (gw,) = torch.autograd.grad(logp.sum(), [wb])
    hr, wr = h.clone().requires_grad_(), w.clone().requires_grad_()
    (want,) = torch.autograd.grad(reference(hr, wr, targets, 1.0)[0].sum(), [wr])
    assert want[3, 0] > 0
    assert torch.allclose(gw[3, 0].float(), want[3, 0], rtol=1e-2)


_TRITON_CHECK = r"""
import torch
from arl.trainer.head_triton import logit_stats
torch.manual_seed(0)
worst = 0.0
# one segment per row (many rows), several segments (few rows), a ragged last block, bf16 and fp32
for n, vocab, dtype, t in [(300, 5000, torch.float32, 1.0), (2, 20000, torch.bfloat16, 0.7),
                           (7, 12345, torch.float32, 1.3)]:
    z = (torch.randn(n, vocab) * 6).to(dtype)
    lse, ent = logit_stats(z, 1.0 / t, torch.float32)
    ref = torch.log_softmax(z.double() / t, -1)
    lse_err = (lse.double() - torch.logsumexp(z.double() / t, -1)).abs() / lse.double().abs().clamp(min=1)
    ent_err = (ent.double() + (ref.exp() * ref).sum(-1)).abs() / ent.double().abs().clamp(min=1)
    worst = max(worst, lse_err.max().item(), ent_err.max().item())
print(worst)
"""


def test_triton_reduction_equals_logsumexp_and_entropy():
    """The CUDA head's Triton reduction, run by Triton's CPU interpreter: fp32-exact to 1e-5 relative."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")  # chosen when the kernel is defined, hence a fresh process
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _TRITON_CHECK],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert float(out.stdout.strip().splitlines()[-1]) < 1e-5


_TRITON_GRADS_CHECK = r"""
import torch
from arl.trainer.head import _logit_grads_with_target
from arl.trainer.head_triton import _BLOCK, logit_grads
torch.manual_seed(0)
worst_fp32, worst_bf16 = 0.0, 0.0
# vocab below, at and not a multiple of the block (ragged last block), one row, several rows; bf16 too
for n, vocab, dtype, t in [(3, 5000, torch.float32, 1.0), (1, 12345, torch.float32, 0.7),
                           (5, _BLOCK, torch.float32, 1.3), (17, 300, torch.float32, 1.0),
                           (4, 9000, torch.bfloat16, 0.8), (1, 4097, torch.bfloat16, 1.0)]:
    z = (torch.randn(n, vocab) * 4).to(dtype)
    inv_t = 1.0 / t
    lse = torch.logsumexp(z.float() * inv_t, -1)
    a, b, c = torch.randn(n), torch.randn(n), torch.randn(n)
    targets = torch.randint(0, vocab, (n,))
    got = logit_grads(z, lse, a, b, c, targets, inv_t)
    assert got.dtype == dtype and got.shape == z.shape
    want = _logit_grads_with_target(z, lse, a, b, c, targets, inv_t)
    err = float((got.float() - want.float()).norm() / want.float().norm())
    if dtype == torch.float32:
        worst_fp32 = max(worst_fp32, err)
    else:  # both round the same fp32 values to bf16: at most one bf16 step apart per entry
        rel = (got.float() - want.float()).abs() / want.float().abs().clamp(min=1e-30)
        worst_bf16 = max(worst_bf16, float(rel.max()))
# a confident target (1 − p_t ≈ 2e-3): its entry p_t·(a + b·log p_t) + c is a small difference of large terms
z = torch.full((1, 6000), -5.0)
z[0, 123] = 10.0
lse = torch.logsumexp(z, -1)
a, b, c = torch.tensor([-1.0]), torch.tensor([0.0]), torch.tensor([1.0])  # d log p_t / dz_t = 1 − p_t
targets = torch.tensor([123])
exact = float(1 - torch.softmax(z.double(), -1)[0, 123])
for dtype in (torch.float32, torch.bfloat16):
    got = float(logit_grads(z.to(dtype), lse, a, b, c, targets, 1.0)[0, 123])
    assert abs(got - exact) <= 1e-2 * exact, (dtype, got, exact)
print(worst_fp32, worst_bf16)
"""


def test_triton_gradient_kernel_equals_eager_formula():
    """The CUDA head's Triton gradient pass, run by Triton's CPU interpreter, against the eager pass
    (`head._logit_grads_with_target`): fp32 to 1e-5 relative, bf16 to one rounding step, and the
    target's entry keeps its small value when p_t ≈ 1."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _TRITON_GRADS_CHECK],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    worst_fp32, worst_bf16 = map(float, out.stdout.strip().splitlines()[-1].split())
    assert worst_fp32 < 1e-5 and worst_bf16 <= 2**-7


def test_fp64_heads_keep_the_eager_passes_on_cuda():
    """The Triton kernels reduce in fp32: an fp64 head (gradchecks, references) must not get them."""
    from arl.trainer.head import _kernels, _logit_grads_with_target, _logit_stats

    assert _kernels(torch.device("cuda"), torch.float64) == (_logit_stats, _logit_grads_with_target)
