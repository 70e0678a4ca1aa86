"""The loss conventions of docs/design/loss-conventions.md (issue #29), each pinned by a hand computation.

Every expected number is worked out in the comments from the formulas, not taken from another
implementation: clamped vs raw k3, clip_frac vs clip_band_frac, mask-removes vs mask-keeps
denominators, constant vs batch-max norm_len, and advantage 0 for a group of one.
"""

import math

import pytest
import torch

from arl.queue import Response, Sample
from arl.trainer import HFPolicy, TrainerConfig, assemble_batch
from arl.trainer.advantages import compute_advantages
from arl.trainer.algorithm_config import AlgorithmConfig
from arl.trainer.config import OptimConfig
from arl.trainer.dynamic_sampling import filter_zero_variance_groups, groups_of_one
from arl.trainer.errors import AlgorithmError
from arl.trainer.kl import kl_estimate
from arl.trainer.loss_agg import Denominators, aggregate
from arl.trainer.token_loss import compute_token_loss, sequence_keep_rows

E = math.e


# --- 1. KL k3: raw vs clamped ------------------------------------------------------------------


def test_k3_raw_and_clamped_by_hand():
    # log r = ref − logp per token: 0.5, 3.0, −3.0 (logp = 0).
    # k3 = e^{log r} − 1 − log r;  d k3 / d logp = 1 − e^{log r}.
    #   0.5: e^0.5 − 1.5 = 1.6487213 − 1.5 = 0.1487213;   grad 1 − 1.6487213 = −0.6487213
    #   3.0: e^3 − 4     = 20.0855369 − 4 = 16.0855369;   grad 1 − 20.0855369 = −19.0855369
    #  −3.0: e^−3 + 2    = 0.0497871 + 2  = 2.0497871;    grad 1 − 0.0497871 = 0.9502129
    # Clamped (log r to ±20, value to ±10): only 3.0 changes: value 10, gradient 0 (the value clamp binds).
    ref = torch.tensor([0.5, 3.0, -3.0], dtype=torch.float64)
    raw_logp = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    raw = kl_estimate("k3", raw_logp, ref)
    raw.sum().backward()
    assert raw.tolist() == pytest.approx([0.1487213, 16.0855369, 2.0497871], abs=1e-6)
    assert raw_logp.grad.tolist() == pytest.approx([-0.6487213, -19.0855369, 0.9502129], abs=1e-6)

    clamped_logp = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    clamped = kl_estimate("low_var_kl", clamped_logp, ref)
    clamped.sum().backward()
    assert clamped.tolist() == pytest.approx([0.1487213, 10.0, 2.0497871], abs=1e-6)
    assert clamped_logp.grad.tolist() == pytest.approx([-0.6487213, 0.0, 0.9502129], abs=1e-6)

    # Configurable clamps: log r to ±2, value to ±100. Now 3.0 → 2: e^2 − 3 = 7.3890561 − 3 = 4.3890561,
    # and −3.0 → −2: e^−2 + 1 = 1.1353353; both clamped on the log ratio, so both gradients are 0.
    narrow_logp = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    narrow = kl_estimate("low_var_kl", narrow_logp, ref, log_ratio_clamp=2.0, value_clamp=100.0)
    narrow.sum().backward()
    assert narrow.tolist() == pytest.approx([0.1487213, 4.3890561, 1.1353353], abs=1e-6)
    assert narrow_logp.grad.tolist() == pytest.approx([-0.6487213, 0.0, 0.0], abs=1e-6)


def test_kl_clamps_are_config_fields_and_reach_the_loss():
    # The measured default (docs/design/loss-conventions.md) is the clamped k3, with clamps ±20 / ±10.
    assert (
        AlgorithmConfig().kl_estimator,
        AlgorithmConfig().kl_log_ratio_clamp,
        AlgorithmConfig().kl_value_clamp,
    ) == ("low_var_kl", 20.0, 10.0)
    cfg = AlgorithmConfig(kl_coef=0.1, kl_estimator="low_var_kl")
    logp = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([0.5, 3.0, -3.0], dtype=torch.float64)
    zeros = torch.zeros(3, dtype=torch.float64)
    seq = torch.tensor([0, 0, 0])
    # Advantage 0, ratio 1, weight 1: the loss is kl_coef·KL_t only; metric kl = mean KL_t =
    # (0.1487213 + 10 + 2.0497871) / 3 = 4.0661695; with the value clamp at 20 the middle token is 16.0855369
    # and the mean (0.1487213 + 16.0855369 + 2.0497871) / 3 = 6.0946818.
    loss, m = compute_token_loss(cfg, logp, zeros, zeros, zeros, seq, ref_logp=ref)
    assert m["kl"] == pytest.approx(4.0661695, abs=1e-6)
    assert loss.tolist() == pytest.approx([0.01487213, 1.0, 0.20497871], abs=1e-7)
    _, m20 = compute_token_loss(
        AlgorithmConfig(kl_coef=0.1, kl_estimator="low_var_kl", kl_value_clamp=20.0),
        logp,
        zeros,
        zeros,
        zeros,
        seq,
        ref_logp=ref,
    )
    assert m20["kl"] == pytest.approx(6.0946818, abs=1e-6)
    _, m_raw = compute_token_loss(
        AlgorithmConfig(kl_coef=0.1, kl_estimator="k3"), logp, zeros, zeros, zeros, seq, ref_logp=ref
    )
    assert m_raw["kl"] == pytest.approx(6.0946818, abs=1e-6)
    with pytest.raises(AlgorithmError, match="kl_log_ratio_clamp"):
        AlgorithmConfig(kl_log_ratio_clamp=0.0)


# --- 5. clip_frac (clipped branch taken) vs clip_band_frac (ratio outside the band) -------------------


def test_clip_frac_counts_the_active_clipped_branch_and_band_frac_the_ratios_outside():
    # Band [1 − 0.2, 1 + 0.28] = [0.8, 1.28]; loss_t = max(−A·r, −A·clip(r)).
    #   r=1.5, A=+1: max(−1.5, −1.28) = −1.28  clipped branch → clip_frac, outside
    #   r=1.5, A=−1: max(1.5, 1.28)   = 1.5    unclipped      → outside only
    #   r=0.5, A=+1: max(−0.5, −0.8)  = −0.5   unclipped      → outside only
    #   r=0.5, A=−1: max(0.5, 0.8)    = 0.8    clipped branch → clip_frac, outside
    #   r=1.0, A=+1: inside the band                          → neither
    #   r=1.5, A=0:  0 either way                             → outside only
    # clip_frac = 2/6, clip_band_frac = 5/6; the two clipped tokens get no gradient.
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.0, 1.5], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, 0.0], dtype=torch.float64)
    logp = ratio.log().requires_grad_()
    zeros = torch.zeros(6, dtype=torch.float64)
    loss, m = compute_token_loss(AlgorithmConfig(), logp, zeros, zeros, adv, torch.zeros(6, dtype=torch.long))
    assert m["clip_frac"] == pytest.approx(2 / 6)
    assert m["clip_band_frac"] == pytest.approx(5 / 6)
    assert loss.tolist() == pytest.approx([-1.28, 1.5, -0.5, 0.8, -1.0, 0.0])
    loss.sum().backward()
    # d(−A·r)/d logp = −A·r where unclipped: 1.5, −0.5, −1.0; clipped and A = 0 tokens: 0.
    assert logp.grad.tolist() == pytest.approx([0.0, 1.5, -0.5, 0.0, -1.0, 0.0])


# --- 2. seq_is = "mask": dropped sequences leave the denominators, or stay -----------------------


def masked_rows_case():
    # Three rows with 3, 2, 1 trained tokens; prox − behav per token: row 0: 0 (W = 1, kept);
    # row 1: +1 (geometric mean W = e ≈ 2.718 > 2, dropped); row 2: −1 (W = 1/e ≈ 0.368 < 0.5, dropped).
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 0, 0]])
    prox = torch.zeros(3, 3)
    behav = torch.tensor([[0.0, 0, 0], [-1, -1, 0], [1, 0, 0]])
    return mask, prox, behav


def test_sequence_keep_rows_and_the_denominators_by_hand():
    mask, prox, behav = masked_rows_case()
    cfg = AlgorithmConfig(seq_is="mask", seq_is_low=0.5, seq_is_high=2.0)
    keep = sequence_keep_rows(cfg, prox, behav, mask)
    assert keep.tolist() == [True, False, False]
    assert sequence_keep_rows(AlgorithmConfig(), prox, behav, mask) is None  # seq_is off: nothing masked
    keeps = Denominators.from_loss_mask(mask)  # "keep": dropped rows still counted
    removes = Denominators.from_loss_mask(mask * keep[:, None])  # "remove"
    assert (keeps.tokens, keeps.seqs) == (6, 3)
    assert (removes.tokens, removes.seqs) == (3, 1)
    # Row 0's token losses 1, 2, 3 (the dropped rows' are 0): token-mean keep 6/6 = 1, remove 6/3 = 2;
    # seq-mean-token-mean keep (6/3)/3 = 0.667, remove (6/3)/1 = 2.
    loss = torch.tensor([1.0, 2, 3, 0, 0, 0])
    seq = torch.tensor([0, 0, 0, 1, 1, 2])
    assert aggregate(loss, seq, "token-mean", keeps).item() == pytest.approx(1.0)
    assert aggregate(loss, seq, "token-mean", removes).item() == pytest.approx(2.0)
    assert aggregate(loss, seq, "seq-mean-token-mean", keeps).item() == pytest.approx(2 / 3)
    assert aggregate(loss, seq, "seq-mean-token-mean", removes).item() == pytest.approx(2.0)


def one_group(rewards, lengths):
    # One prompt, responses of the given lengths; behaviour log probs filled in by the test.
    responses = [
        Response(
            response_ids=[10 + i] * n,
            response_mask=[1] * n,
            response_logprobs=[0.0] * n,
            weight_versions=[0] * n,
            reward=r,
        )
        for i, (r, n) in enumerate(zip(rewards, lengths, strict=True))
    ]
    return Sample(uid="g", prompt_ids=[1, 2, 3], responses=responses, start_version=0, end_version=0)


def policy_for(model_dir, **kw):
    alg = {k: v for k, v in kw.items() if k not in ("loss_agg_mode", "loss_agg_norm_len")}
    cfg = TrainerConfig(
        optim=OptimConfig(lr=1e-3, grad_clip=1e9),
        mixed_precision="none",
        algorithm=AlgorithmConfig(**alg),
        loss_agg_mode=kw.get("loss_agg_mode", "token-mean"),
        loss_agg_norm_len=kw.get("loss_agg_norm_len"),
    )
    return HFPolicy(model_dir, cfg)


def batch_with_behaviour(model_dir, delta):
    """The one-group batch (rewards 1, 0, 0; 3, 2, 1 tokens) with behaviour = the model's own log
    probs − delta (B, T): delta = prox − behav, since recompute's proximal is the model's log probs."""
    batch = assemble_batch([one_group([1.0, 0.0, 0.0], [3, 2, 1])], pad_token_id=0)
    own = policy_for(model_dir).log_probs(batch)
    full = torch.zeros_like(batch.loss_mask)
    full[batch.loss_mask > 0] = torch.tensor(delta, dtype=torch.float32)  # row-major: row 0's tokens first
    batch.behaviour_logp = (own - full) * batch.loss_mask
    return batch


def test_engine_removes_or_keeps_masked_sequences_in_the_denominator(tiny_model_dir):
    # Rewards 1, 0, 0 → GRPO: mean 1/3, unbiased std sqrt(((2/3)² + 2·(1/3)²)/2) = sqrt(1/3) = 0.57735;
    # A_0 = (2/3)/0.57735 = 1.1547. First update: ratio 1, row 0's weight exp(0) = 1, rows 1, 2 masked
    # (W = e, 1/e as above): each of row 0's 3 tokens has loss −A_0 = −1.1547.
    # token-mean: remove −3·1.1547/3 = −1.1547; keep −3·1.1547/6 = −0.57735 (half the step).
    batch = batch_with_behaviour(tiny_model_dir, [0.0, 0.0, 0.0, 1.0, 1.0, -1.0])
    common = dict(seq_is="mask", seq_is_low=0.5, seq_is_high=2.0, tis_cap=None)
    removed = policy_for(tiny_model_dir, seq_is_mask_denominator="remove", **common).train_step(
        batch, mini_batch_rows=3
    )
    kept = policy_for(tiny_model_dir, seq_is_mask_denominator="keep", **common).train_step(
        batch, mini_batch_rows=3
    )
    assert removed["seq_is_masked_count"] == 2 and kept["seq_is_masked_count"] == 2
    assert removed["loss"] == pytest.approx(-2 / math.sqrt(3), rel=1e-4)
    assert kept["loss"] == pytest.approx(-1 / math.sqrt(3), rel=1e-4)
    assert kept["grad_norm"] == pytest.approx(removed["grad_norm"] / 2, rel=1e-4)
    # "remove" needs the proximal log probs before the update; reuse / loglinear make them during it.
    with pytest.raises(AlgorithmError, match="seq_is_mask_denominator"):
        AlgorithmConfig(seq_is="mask", proximal_mode="reuse")
    AlgorithmConfig(seq_is="mask", proximal_mode="reuse", seq_is_mask_denominator="keep")
    # The default, auto, recomputes wherever the proximal log probs are needed before the update.
    assert AlgorithmConfig(seq_is="mask").resolve_proximal_mode(updates=1) == "recompute"
    assert AlgorithmConfig(seq_is="mask", seq_is_mask_denominator="keep").resolve_proximal_mode(1) == "reuse"
    assert AlgorithmConfig(kl_coef=0.1, kl_in="reward").resolve_proximal_mode(1) == "recompute"
    assert AlgorithmConfig(kl_coef=0.1).resolve_proximal_mode(1) == "reuse"
    assert AlgorithmConfig().resolve_proximal_mode(updates=2) == "recompute"
    assert AlgorithmConfig(proximal_mode="bypass").resolve_proximal_mode(updates=2) == "bypass"


# --- 3. seq-mean-token-sum-norm: constant norm_len vs the batch's longest response ----------------


def test_norm_len_resolution():
    budget = 12  # TrainerConfig.loss_agg_norm_len: the generation budget when the app passes it
    assert AlgorithmConfig().norm_len_mode == "constant"  # the measured default
    assert AlgorithmConfig().resolve_norm_len(budget) == 12
    assert AlgorithmConfig(norm_len=7).resolve_norm_len(budget) == 7
    assert AlgorithmConfig().resolve_norm_len(None) is None  # no constant given: the batch's longest
    assert AlgorithmConfig(norm_len_mode="batch_max", norm_len=7).resolve_norm_len(budget) is None
    with pytest.raises(AlgorithmError, match="norm_len"):
        AlgorithmConfig(norm_len=0)


def test_engine_seq_sum_norm_constant_vs_batch_max(tiny_model_dir):
    # Rewards 1, 0, 0: A = 1.1547, −0.57735, −0.57735 (above); behaviour = proximal, ratio 1, weight 1,
    # so loss_t = −A of its row: Σ_t = −3·1.1547 + 2·0.57735 + 1·0.57735 = −1.73205 = −sqrt(3).
    # seqs = 3; batch_max L = 3 (the longest row): −sqrt(3)/9 = −0.19245; constant L = 12: −sqrt(3)/36.
    batch = batch_with_behaviour(tiny_model_dir, [0.0] * 6)
    sum_norm = dict(loss_agg_mode="seq-mean-token-sum-norm", tis_cap=None)
    batch_max = policy_for(tiny_model_dir, norm_len_mode="batch_max", loss_agg_norm_len=12, **sum_norm)
    constant = policy_for(tiny_model_dir, loss_agg_norm_len=12, **sum_norm)  # the budget, given by the app
    own = policy_for(tiny_model_dir, norm_len=12, **sum_norm)  # or set on the algorithm itself
    m_max = batch_max.train_step(batch, mini_batch_rows=3)
    m_const = constant.train_step(batch, mini_batch_rows=3)
    m_own = own.train_step(batch, mini_batch_rows=3)
    assert m_max["loss_agg_norm_len"] == 3 and m_const["loss_agg_norm_len"] == 12
    assert m_max["loss"] == pytest.approx(-math.sqrt(3) / 9, rel=1e-4)
    assert m_const["loss"] == pytest.approx(-math.sqrt(3) / 36, rel=1e-4)
    assert m_own["loss"] == pytest.approx(m_const["loss"], rel=1e-6)


# --- 4. a group of one gets advantage 0 ------------------------------------------------------------


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_a_group_of_one_gets_advantage_zero(estimator):
    # Groups: {0: rewards 1, 0}, {1: reward 0.7 alone}. The lone response has no baseline: advantage 0
    # (GRPO: 0.7 − 0.7 = 0 over (std 0 + eps) = 0; RLOO: no other response, 0 by rule).
    # Group 0: GRPO (1 − 0.5)/std, std = sqrt((0.25 + 0.25)/1) = 0.70711 → ±0.70711;
    # Dr. GRPO ±0.5; RLOO 1 − 0 = 1 and 0 − 1 = −1.
    rewards = torch.tensor([1.0, 0.0, 0.7], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1])
    adv = compute_advantages(estimator, rewards, groups)
    expected = {"grpo": 0.5 / math.sqrt(0.5), "dr_grpo": 0.5, "rloo": 1.0}[estimator]
    assert adv.tolist() == pytest.approx([expected, -expected, 0.0], abs=1e-5)
    assert adv[2].item() == 0.0


def test_groups_of_one_are_counted_by_cause():
    full, lone, empty_reward = (
        one_group([1.0, 0.0, 0.0, 1.0], [1] * 4),
        one_group([1.0], [1]),
        one_group([0.5] * 4, [1] * 4),
    )
    # Two groups of one among groups of four: they lost members (failed trajectories).
    assert groups_of_one([full, lone, full, lone]) == {"groups_of_one": 2, "groups_of_one_failed": 2}
    # rollout.n = 1: every group is a group of one by configuration, none "failed".
    assert groups_of_one([lone, lone]) == {"groups_of_one": 2, "groups_of_one_failed": 0}
    # Dynamic sampling drops groups of one (and uniform-reward groups) whole: counted by reason.
    result = filter_zero_variance_groups([full, lone, empty_reward])
    assert result.counts == {"kept": 1, "dropped_uniform_reward": 1, "dropped_single_response": 1}
