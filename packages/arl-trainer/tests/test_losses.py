"""Policy-loss pieces and compute_token_loss against explicit formulas and per-sequence loops."""

import math

import msgspec
import pytest
import torch

from arl.trainer.algorithm_config import AlgorithmConfig
from arl.trainer.algorithms import policy_loss
from arl.trainer.errors import AlgorithmError
from arl.trainer.losses import (
    clip_active,
    clipped_surrogate,
    gspo_ratio,
    ppo_ratio,
    sequence_log_is_weight,
    sequence_mask,
    sequence_truncated_weight,
    token_is_weight,
)
from arl.trainer.segments import flatten_masked
from arl.trainer.token_loss import compute_token_loss, merge_loss_metrics

torch.set_num_threads(1)


def seqs(lengths, shuffle_seed=None):
    """seq_index for sequences of the given lengths; optionally interleaved (tokens need not be contiguous)."""
    idx = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lengths)])
    if shuffle_seed is not None:
        g = torch.Generator().manual_seed(shuffle_seed)
        idx = idx[torch.randperm(idx.numel(), generator=g)]
    return idx


def seq_mean_token_mean(per_token, seq_index, num_seqs):
    sums = torch.zeros(num_seqs, dtype=per_token.dtype).index_add(0, seq_index, per_token)
    counts = torch.zeros(num_seqs).index_add(0, seq_index, torch.ones_like(per_token))
    return (sums / counts).mean()


def test_clipped_surrogate_matches_explicit_formula_with_and_without_dual_clip():
    ratios = [0.1, 0.5, 0.85, 1.0, 1.1, 1.5, 3.0, 10.0]
    advs = [-2.0, -0.5, 0.7, 1.5]
    low, high, c = 0.2, 0.28, 3.0
    r = torch.tensor([x for x in ratios for _ in advs])
    a = torch.tensor([y for _ in ratios for y in advs])
    plain, outside, dual0 = clipped_surrogate(r, a, clip_ratio_low=low, clip_ratio_high=high)
    dual, _, active = clipped_surrogate(r, a, clip_ratio_low=low, clip_ratio_high=high, dual_clip_c=c)
    for i, (x, y) in enumerate(zip(r.tolist(), a.tolist())):
        clip_x = min(max(x, 1 - low), 1 + high)
        ppo = max(-y * x, -y * clip_x)
        assert plain[i].item() == pytest.approx(ppo, rel=1e-6)
        assert outside[i].item() == (x < 1 - low or x > 1 + high)
        expected_dual = min(ppo, -y * c) if y < 0 else ppo
        assert dual[i].item() == pytest.approx(expected_dual, rel=1e-6)
        assert active[i].item() == (y < 0 and ppo > -y * c)
    assert not dual0.any()
    assert active.any()  # ratio 10 with a negative advantage hits the dual clip
    with pytest.raises(AlgorithmError, match="dual_clip_c"):
        clipped_surrogate(r, a, clip_ratio_low=low, clip_ratio_high=high, dual_clip_c=1.0)


def test_dual_clip_stops_the_gradient_of_huge_ratios_on_negative_advantages():
    logp = torch.log(torch.tensor([5.0, 5.0, 1.0])).requires_grad_()
    prox = torch.zeros(3)
    adv = torch.tensor([-1.0, 1.0, -1.0])
    ratio = ppo_ratio(logp, prox)
    loss, _, active = clipped_surrogate(ratio, adv, clip_ratio_low=0.2, clip_ratio_high=0.2, dual_clip_c=3.0)
    loss.sum().backward()
    assert active.tolist() == [True, False, False]
    assert loss[0].item() == pytest.approx(3.0)  # −A·c
    # Token 0: dual-clipped (constant); token 1: ratio 5 > 1.2 with A > 0, clipped (constant); token 2: on-policy.
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0, 1.0])


def test_gspo_equals_a_per_sequence_loop_in_value_and_gradient():
    torch.manual_seed(0)
    lengths = [3, 1, 5, 4, 2]
    seq_index = seqs(lengths, shuffle_seed=1)
    n, s = seq_index.numel(), len(lengths)
    base = torch.randn(n) * 0.1 - 1.0
    prox = base + torch.randn(n) * 0.02
    # Sequence 3 drifts far enough that its sequence ratio leaves the clip range.
    shift = torch.where(seq_index == 3, 0.5, 0.0)
    logp = (base + shift).requires_grad_()
    adv_seq = torch.tensor([1.0, -0.5, 2.0, 1.5, -1.0])
    adv = adv_seq[seq_index]
    low, high = 0.1, 0.1

    ratio = gspo_ratio(logp, prox, seq_index, s)
    per_token, _, _ = clipped_surrogate(ratio, adv, clip_ratio_low=low, clip_ratio_high=high)
    loss = seq_mean_token_mean(per_token, seq_index, s)
    (grad,) = torch.autograd.grad(loss, logp)

    ref_logp = logp.detach().clone().requires_grad_()
    per_seq = []
    for i in range(s):
        m = seq_index == i
        s_i = torch.exp((ref_logp[m] - prox[m]).mean())
        clipped = s_i.clamp(1 - low, 1 + high)
        per_seq.append(torch.maximum(-adv_seq[i] * s_i, -adv_seq[i] * clipped))
    ref = torch.stack(per_seq).mean()
    (ref_grad,) = torch.autograd.grad(ref, ref_logp)

    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-7)
    # Every token of one sequence carries the same ratio value: the sequence's geometric mean.
    for i in range(s):
        m = seq_index == i
        assert torch.allclose(ratio[m], torch.exp((logp[m] - prox[m]).mean()).expand(int(m.sum())))
    # The clipped sequence gets no gradient, the others do.
    assert grad[seq_index == 3].abs().max() == 0
    assert grad[seq_index == 0].abs().min() > 0


def test_token_is_weight_truncates_and_counts():
    prox = torch.tensor([0.0, 0.0, 0.0, -3.0])
    behav = torch.tensor([0.0, -0.5, -2.0, 0.0])
    w, truncated = token_is_weight(prox, behav, 2.0)
    expected = [min(math.exp(p - b), 2.0) for p, b in zip(prox.tolist(), behav.tolist())]
    assert w.tolist() == pytest.approx(expected)
    assert truncated.tolist() == [False, False, True, False]
    w_raw, none = token_is_weight(prox, behav, None)
    assert w_raw[2].item() == pytest.approx(math.exp(2.0)) and not none.any()


def test_sequence_is_weights_geo_mean_product_truncate_and_mask_match_loops():
    torch.manual_seed(1)
    lengths = [4, 2, 6]
    seq_index = seqs(lengths, shuffle_seed=3)
    prox = torch.randn(seq_index.numel()) * 0.3
    behav = torch.randn(seq_index.numel()) * 0.3
    geo = sequence_log_is_weight(prox, behav, seq_index, 3, "geo_mean")
    prod = sequence_log_is_weight(prox, behav, seq_index, 3, "product")
    for i in range(3):
        d = (prox - behav)[seq_index == i]
        assert geo[i].item() == pytest.approx(d.mean().item(), abs=1e-6)
        assert prod[i].item() == pytest.approx(d.sum().item(), abs=1e-6)
    log_w = torch.log(torch.tensor([0.3, 1.0, 5.0]))
    w, truncated = sequence_truncated_weight(log_w, 2.0)
    assert w.tolist() == pytest.approx([0.3, 1.0, 2.0]) and truncated.tolist() == [False, False, True]
    assert sequence_mask(log_w, 0.5, 2.0).tolist() == [False, True, False]
    assert sequence_mask(log_w, 0.0, 10.0).tolist() == [True, True, True]
    # A product weight far beyond float range truncates without inf/nan.
    w_big, _ = sequence_truncated_weight(torch.tensor([1e4]), 2.0)
    assert w_big.item() == pytest.approx(2.0)


def flat_case(seed=0, lengths=(3, 5, 2, 4)):
    torch.manual_seed(seed)
    seq_index = seqs(lengths)
    n = seq_index.numel()
    behav = torch.randn(n) * 0.3 - 1.0
    prox = behav + torch.randn(n) * 0.3
    logp = (prox + torch.randn(n) * 0.3).requires_grad_()
    adv = torch.randn(len(lengths))[seq_index]
    return logp, prox, behav, adv, seq_index


def test_default_config_equals_the_padded_policy_loss():
    logp, prox, behav, adv, seq_index = flat_case()
    cfg = AlgorithmConfig()
    per_token, metrics = compute_token_loss(cfg, logp, prox, behav, adv, seq_index)
    loss = per_token.mean()
    (grad,) = torch.autograd.grad(loss, logp)

    # The same tokens padded into (B, T) with a mask, through the existing policy_loss.
    lengths = [int((seq_index == i).sum()) for i in range(4)]
    t = max(lengths) + 1
    padded = [torch.zeros(4, t) for _ in range(4)]
    mask = torch.zeros(4, t)
    offset = 0
    for b, n in enumerate(lengths):
        for dst, src in zip(padded, (logp.detach(), prox, behav, adv)):
            dst[b, 1 : 1 + n] = src[offset : offset + n]
        mask[b, 1 : 1 + n] = 1
        offset += n
    p_logp = padded[0].clone().requires_grad_()
    ref, info = policy_loss(p_logp, padded[1], padded[2], padded[3], mask)
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert torch.allclose(grad, p_logp.grad[mask.bool()], atol=1e-7)
    assert metrics["clip_frac"] == pytest.approx(info["clip_frac"])
    assert metrics["tis_clip_frac"] == pytest.approx(info["tis_clip_frac"])
    assert metrics["num_tokens"] == 14 and metrics["num_seqs"] == 4
    assert metrics["pg_loss"] == pytest.approx(loss.item(), rel=1e-6)
    # flatten_masked does the same flattening for padded callers.
    flat_index, f_logp, f_prox, f_behav, f_adv = flatten_masked(mask, padded[0], *padded[1:])
    assert torch.equal(flat_index, seq_index) and torch.equal(f_logp, logp.detach())
    again, _ = compute_token_loss(cfg, f_logp, f_prox, f_behav, f_adv, flat_index, num_seqs=4)
    assert torch.equal(again, per_token.detach())
    with pytest.raises(AlgorithmError, match="shape"):
        flatten_masked(mask, padded[0][:, :-1])


def test_policy_loss_is_unchanged_by_its_reimplementation():
    """policy_loss now composes the new pieces; it must equal the original inline formula exactly."""
    torch.manual_seed(4)
    logp, prox, behav = (torch.randn(3, 6) * 0.5 for _ in range(3))
    adv = torch.randn(3, 1).expand(3, 6)
    mask = (torch.rand(3, 6) > 0.3).float()
    ratio = torch.exp(logp - prox)
    clipped = ratio.clamp(1 - 0.2, 1 + 0.28)
    pg = torch.maximum(-adv * ratio, -adv * clipped)
    w = torch.exp(prox - behav).clamp(max=2.0)
    expected = (pg * w * mask).sum() / mask.sum()
    loss, info = policy_loss(logp, prox, behav, adv, mask)
    assert torch.equal(loss, expected)
    assert info["tis_clip_frac"] == pytest.approx(
        ((torch.exp(prox - behav) > 2.0).float() * mask).sum().item() / mask.sum().item()
    )


def test_seq_is_truncate_replaces_token_weights_and_counts_truncated_sequences():
    logp, prox, behav, adv, seq_index = flat_case(seed=2)
    behav = prox.clone()
    behav[seq_index == 1] -= 2.0  # sequence 1: geometric-mean weight e² > 2
    cfg = AlgorithmConfig(seq_is="truncate", seq_is_high=2.0, tis_cap=None)
    per_token, metrics = compute_token_loss(cfg, logp, prox, behav, adv, seq_index)
    pg, _, _ = clipped_surrogate(ppo_ratio(logp, prox), adv, clip_ratio_low=0.2, clip_ratio_high=0.28)
    expected_w = torch.where(seq_index == 1, 2.0, 1.0)
    assert torch.allclose(per_token, pg * expected_w)
    assert metrics["seq_is_truncated_count"] == 1 and metrics["seq_is_masked_count"] == 0
    assert metrics["tis_clip_frac"] == 0


def test_seq_is_mask_drops_whole_sequences_from_every_term_and_counts_them():
    logp, prox, behav, adv, seq_index = flat_case(seed=3)
    behav = prox.clone()
    behav[seq_index == 0] += 1.0  # weight e⁻¹ < 0.5: masked
    behav[seq_index == 2] -= 1.0  # weight e > 2: masked
    entropy = torch.rand(seq_index.numel())
    ref = logp.detach() - 0.1
    cfg = AlgorithmConfig(seq_is="mask", seq_is_low=0.5, seq_is_high=2.0, entropy_coef=0.01, kl_coef=0.1)
    per_token, metrics = compute_token_loss(
        cfg, logp, prox, behav, adv, seq_index, entropy=entropy, ref_logp=ref
    )
    dropped = (seq_index == 0) | (seq_index == 2)
    assert per_token[dropped].abs().max() == 0
    assert per_token[~dropped].abs().min() > 0
    (grad,) = torch.autograd.grad(per_token.sum(), logp)
    assert grad[dropped].abs().max() == 0
    assert metrics["seq_is_masked_count"] == 2 and metrics["num_seqs"] == 4


def test_entropy_bonus_and_metric():
    logp, prox, behav, adv, seq_index = flat_case(seed=5)
    entropy = torch.rand(seq_index.numel()) * 3
    base, m0 = compute_token_loss(AlgorithmConfig(), logp, prox, behav, adv, seq_index, entropy=entropy)
    bonus, m1 = compute_token_loss(
        AlgorithmConfig(entropy_coef=0.05), logp, prox, behav, adv, seq_index, entropy=entropy
    )
    assert torch.allclose(bonus - base, -0.05 * entropy)
    assert m0["entropy"] == pytest.approx(entropy.mean().item(), rel=1e-6) == m1["entropy"]
    with pytest.raises(AlgorithmError, match="entropy"):
        compute_token_loss(AlgorithmConfig(entropy_coef=0.05), logp, prox, behav, adv, seq_index)


def test_kl_as_loss_term_adds_coef_times_k3_with_its_gradient():
    logp, prox, behav, adv, seq_index = flat_case(seed=6)
    ref = logp.detach() + torch.randn(seq_index.numel()) * 0.2
    base, _ = compute_token_loss(AlgorithmConfig(), logp, prox, behav, adv, seq_index)
    with_kl, metrics = compute_token_loss(
        AlgorithmConfig(kl_coef=0.1), logp, prox, behav, adv, seq_index, ref_logp=ref
    )
    k3 = torch.exp(ref - logp) - (ref - logp) - 1
    assert torch.allclose(with_kl - base, 0.1 * k3, atol=1e-7)
    assert metrics["kl"] == pytest.approx(k3.mean().item(), rel=1e-5)
    (g_base,) = torch.autograd.grad(base.sum(), logp)
    (g_kl,) = torch.autograd.grad(with_kl.sum(), logp)
    # d k3 / d logp = 1 − exp(ref − logp)
    assert torch.allclose(g_kl - g_base, 0.1 * (1 - torch.exp(ref - logp.detach())), atol=1e-6)
    # In-reward KL leaves the loss alone but still reports the KL.
    in_reward, m2 = compute_token_loss(
        AlgorithmConfig(kl_coef=0.1, kl_in="reward"), logp, prox, behav, adv, seq_index, ref_logp=ref
    )
    assert torch.equal(in_reward, base) and m2["kl"] == pytest.approx(metrics["kl"])
    with pytest.raises(AlgorithmError, match="ref_logp"):
        compute_token_loss(AlgorithmConfig(kl_coef=0.1), logp, prox, behav, adv, seq_index)


def test_gspo_through_compute_token_loss_and_dual_clip_metric():
    logp, prox, behav, adv, seq_index = flat_case(seed=7)
    cfg = AlgorithmConfig(policy_loss="gspo", clip_ratio_low=3e-4, clip_ratio_high=4e-4, tis_cap=None)
    per_token, metrics = compute_token_loss(cfg, logp, prox, behav, adv, seq_index, num_seqs=4)
    w = torch.exp(prox - behav)
    ratio = gspo_ratio(logp, prox, seq_index, 4)
    pg, outside, _ = clipped_surrogate(ratio, adv, clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    assert torch.allclose(per_token, pg * w)
    # clip_band_frac: ratio outside the band whatever A's sign; clip_frac: the clipped branch is taken
    # (issue #29: the usual definition; the two differ where the clip does not bind).
    assert metrics["clip_band_frac"] == pytest.approx(outside.float().mean().item())
    active = clip_active(ratio, adv, clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    assert metrics["clip_frac"] == pytest.approx(active.float().mean().item())
    assert metrics["clip_frac"] < metrics["clip_band_frac"]
    neg = adv.clone().abs().neg()
    big = (prox + 2.0).requires_grad_()
    _, m = compute_token_loss(AlgorithmConfig(dual_clip_c=3.0), big, prox, behav, neg, seq_index)
    assert m["dual_clip_frac"] == 1.0


def test_bad_inputs_and_config_raise_clear_errors():
    logp, prox, behav, adv, seq_index = flat_case()
    with pytest.raises(AlgorithmError, match="advantages must have shape"):
        compute_token_loss(AlgorithmConfig(), logp, prox, behav, adv[:-1], seq_index)
    with pytest.raises(AlgorithmError, match="seq_index must be 1-D"):
        compute_token_loss(AlgorithmConfig(), logp, prox, behav, adv, seq_index[None])
    with pytest.raises(AlgorithmError, match="dual_clip_c"):
        AlgorithmConfig(dual_clip_c=0.5)
    with pytest.raises(AlgorithmError, match="lr_decay_steps"):
        AlgorithmConfig(lr_schedule="cosine")
    with pytest.raises(msgspec.ValidationError, match="dual_clip_c"):
        msgspec.convert({"dual_clip_c": 0.9}, AlgorithmConfig)
    with pytest.raises(msgspec.ValidationError, match="unknown"):
        msgspec.convert({"polcy_loss": "gspo"}, AlgorithmConfig)
    cfg = msgspec.toml.decode(
        b'policy_loss = "gspo"\nseq_is = "mask"\nkl_coef = 0.01\n', type=AlgorithmConfig
    )
    assert cfg.policy_loss == "gspo" and cfg.seq_is == "mask" and cfg.needs_ref_logp


def test_empty_micro_batch_gives_finite_metrics():
    empty = torch.zeros(0)
    loss, metrics = compute_token_loss(
        AlgorithmConfig(seq_is="mask"),
        empty.requires_grad_(),
        empty,
        empty,
        empty,
        torch.zeros(0, dtype=torch.long),
    )
    assert loss.shape == (0,) and all(math.isfinite(v) for v in metrics.values())
    assert metrics["num_tokens"] == 0 and metrics["num_seqs"] == 0


def naive_token_loss(cfg, logp, prox, behav, adv, seq_index, entropy, ref):
    """compute_token_loss written out token by token in Python floats, from the formulas alone."""
    n, s = len(logp), max(seq_index) + 1
    members = [[t for t in range(n) if seq_index[t] == i] for i in range(s)]
    delta = [sum(prox[t] - behav[t] for t in m) for m in members]
    if cfg.seq_is_agg == "geo_mean":
        delta = [d / len(m) for d, m in zip(delta, members)]
    seq_w = [math.exp(d) for d in delta]
    gspo = [math.exp(sum(logp[t] - prox[t] for t in m) / len(m)) for m in members]
    out = []
    for t in range(n):
        i, a = seq_index[t], adv[t]
        r = gspo[i] if cfg.policy_loss == "gspo" else math.exp(logp[t] - prox[t])
        pg = max(-a * r, -a * min(max(r, 1 - cfg.clip_ratio_low), 1 + cfg.clip_ratio_high))
        if cfg.dual_clip_c is not None and a < 0:
            pg = min(pg, -a * cfg.dual_clip_c)
        keep = 1.0
        if cfg.seq_is == "truncate":
            w = min(seq_w[i], cfg.seq_is_high)
        else:
            w = math.exp(prox[t] - behav[t])
            w = w if cfg.tis_cap is None else min(w, cfg.tis_cap)
            if cfg.seq_is == "mask":
                keep = float(cfg.seq_is_low <= seq_w[i] <= cfg.seq_is_high)
        kl = math.exp(ref[t] - logp[t]) - (ref[t] - logp[t]) - 1
        out.append(keep * (w * pg - cfg.entropy_coef * entropy[t] + cfg.kl_coef * kl) if keep else 0.0)
    return out


@pytest.mark.parametrize(
    "cfg",
    [
        AlgorithmConfig(
            dual_clip_c=1.5,
            tis_cap=1.5,
            seq_is="mask",
            seq_is_low=0.6,
            seq_is_high=1.8,
            entropy_coef=0.01,
            kl_coef=0.05,
        ),
        AlgorithmConfig(
            policy_loss="gspo",
            clip_ratio_low=0.05,
            clip_ratio_high=0.05,
            seq_is="truncate",
            seq_is_agg="product",
            seq_is_high=1.5,
            kl_coef=0.02,
        ),
        AlgorithmConfig(clip_ratio_high=0.1, tis_cap=None, entropy_coef=0.1),
    ],
    ids=["ppo-dualclip-mask-entropy-kl", "gspo-truncate-product-kl", "ppo-untruncated-entropy"],
)
def test_compute_token_loss_equals_a_token_by_token_reference(cfg):
    g = torch.Generator().manual_seed(11)
    lengths = [3, 4, 2, 5, 1, 3]
    seq_index = seqs(lengths, shuffle_seed=5)
    n = seq_index.numel()
    behav = torch.randn(n, generator=g, dtype=torch.float64) * 0.3 - 1.0
    # Per-sequence drifts behaviour→proximal, so some sequences pass the IS bounds and some do not.
    drift = torch.tensor([0.0, 0.9, -0.1, -0.8, 0.3, 0.05], dtype=torch.float64)[seq_index]
    prox = behav + drift + torch.randn(n, generator=g, dtype=torch.float64) * 0.05
    logp = (prox + torch.randn(n, generator=g, dtype=torch.float64) * 0.4).requires_grad_()
    adv = torch.tensor([1.0, -1.5, 0.4, -0.3, 2.0, -2.0], dtype=torch.float64)[seq_index]
    entropy = torch.rand(n, generator=g, dtype=torch.float64) * 2
    ref = prox + torch.randn(n, generator=g, dtype=torch.float64) * 0.2

    per_token, metrics = compute_token_loss(
        cfg, logp, prox, behav, adv, seq_index, entropy=entropy, ref_logp=ref
    )
    expected = naive_token_loss(
        cfg,
        logp.tolist(),
        prox.tolist(),
        behav.tolist(),
        adv.tolist(),
        seq_index.tolist(),
        entropy.tolist(),
        ref.tolist(),
    )
    assert per_token.tolist() == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # Gradient against central finite differences of the same reference (per token: the loss of a
    # token depends on other tokens' logp only through GSPO's sequence mean).
    (grad,) = torch.autograd.grad(per_token.sum(), logp)
    eps = 1e-6
    base = logp.detach().tolist()
    for t in range(n):
        hi, lo = list(base), list(base)
        hi[t] += eps
        lo[t] -= eps
        args = (
            prox.tolist(),
            behav.tolist(),
            adv.tolist(),
            seq_index.tolist(),
            entropy.tolist(),
            ref.tolist(),
        )
        fd = (sum(naive_token_loss(cfg, hi, *args)) - sum(naive_token_loss(cfg, lo, *args))) / (2 * eps)
        assert grad[t].item() == pytest.approx(fd, rel=1e-4, abs=1e-7), f"token {t}"
    assert metrics["num_seqs"] == len(lengths) and metrics["num_tokens"] == n
    # The data exercise what each config switches on.
    if cfg.dual_clip_c is not None:
        assert metrics["dual_clip_frac"] > 0
    if cfg.seq_is == "mask":
        assert 0 < metrics["seq_is_masked_count"] < len(lengths)
    if cfg.seq_is == "truncate":
        assert 0 < metrics["seq_is_truncated_count"] < len(lengths)
    if cfg.tis_cap is not None and cfg.seq_is != "truncate":
        assert metrics["tis_clip_frac"] > 0


def test_bf16_inputs_are_computed_in_fp32():
    logp, prox, behav, adv, seq_index = flat_case(seed=8)
    ref, _ = compute_token_loss(AlgorithmConfig(), logp, prox, behav, adv, seq_index)
    lp16 = logp.detach().bfloat16().requires_grad_()
    out, _ = compute_token_loss(
        AlgorithmConfig(), lp16, prox.bfloat16(), behav.bfloat16(), adv.bfloat16(), seq_index
    )
    assert out.dtype == torch.float32
    exact, _ = compute_token_loss(
        AlgorithmConfig(),
        lp16.detach().float(),
        prox.bfloat16().float(),
        behav.bfloat16().float(),
        adv.bfloat16().float(),
        seq_index,
    )
    assert torch.equal(out.detach(), exact)  # rounding only at the inputs
    out.sum().backward()
    assert lp16.grad.dtype == torch.bfloat16
    assert torch.allclose(out.detach(), ref.detach(), atol=0.05)


def test_merged_metrics_of_micro_batches_equal_the_metrics_of_the_whole_batch():
    logp, prox, behav, adv, seq_index = flat_case(seed=9, lengths=(3, 5, 2, 4, 6))
    entropy = torch.rand(seq_index.numel())
    cfg = AlgorithmConfig(seq_is="mask", seq_is_low=0.9, seq_is_high=1.1)
    _, whole = compute_token_loss(cfg, logp, prox, behav, adv, seq_index, entropy=entropy)
    parts = []
    for group in ([0, 1], [2, 3, 4]):  # whole sequences per micro-batch, re-indexed locally
        sel = torch.isin(seq_index, torch.tensor(group))
        local = torch.searchsorted(torch.tensor(group), seq_index[sel])
        parts.append(
            compute_token_loss(cfg, logp[sel], prox[sel], behav[sel], adv[sel], local, entropy=entropy[sel])[
                1
            ]
        )
    merged = merge_loss_metrics(parts)
    assert merged.keys() == whole.keys()
    for key in whole:
        assert merged[key] == pytest.approx(whole[key], rel=1e-6, abs=1e-9), key
    assert whole["seq_is_masked_count"] > 0
