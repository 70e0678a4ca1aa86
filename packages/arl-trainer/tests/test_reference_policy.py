"""KL to a frozen reference policy (algorithm.kl_coef > 0), on one device (CPU, fp32).

The reference's log probs are a separate frozen model's; the KL term's loss and gradient (in the
loss) and the penalised advantages (in the reward) equal hand computations; at step 1 the policy is
the reference (KL exactly 0); after updates the KL grows while the reference's weights stay put.
"""

import math

import pytest
import torch
from trainer_helpers import random_batch

from arl.trainer import HFPolicy, TrainerConfig
from arl.trainer.advantages import grpo_advantages
from arl.trainer.algorithm_config import AlgorithmConfig
from arl.trainer.algorithms import token_log_probs
from arl.trainer.batch import TrainBatch, trajectory_advantages
from arl.trainer.config import OptimConfig
from arl.trainer.errors import ReferencePolicyError

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory, tiny_model_dir):
    """Another random model of the tiny model's shape, with peaked (large-init) distributions: a
    reference far from the near-uniform policy."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("other")
    cfg = AutoConfig.from_pretrained(tiny_model_dir)
    cfg.initializer_range = 0.3
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return path


def kl_config(**algorithm):
    return TrainerConfig(
        optim=OptimConfig(lr=1e-2, grad_clip=1e9),
        mixed_precision="none",
        max_tokens_per_microbatch=40,
        algorithm=AlgorithmConfig(**algorithm),
    )


def padded_log_probs(model, batch):
    return token_log_probs(
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, batch.input_ids
    )


def load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


def test_reference_log_probs_equal_a_separate_frozen_model(tiny_model_dir, other_model_dir):
    batch = random_batch(seed=3)
    for ref_dir, reference_path in ((tiny_model_dir, None), (other_model_dir, other_model_dir)):
        policy = HFPolicy(tiny_model_dir, kl_config(kl_coef=0.1), reference_path=reference_path)
        assert policy.reference_path == ref_dir
        with torch.no_grad():
            want = padded_log_probs(load(ref_dir), batch) * batch.loss_mask
        got = policy.reference_log_probs(batch)
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        ref = policy.ref_packed.hf
        assert not ref.training and not any(p.requires_grad for p in ref.parameters())
        optimized = {id(p) for g in policy.optimizer.param_groups for p in g["params"]}
        assert not optimized & {id(p) for p in ref.parameters()}


def test_step_one_kl_is_zero_then_grows_and_the_reference_stays(tiny_model_dir):
    policy = HFPolicy(tiny_model_dir, kl_config(kl_coef=0.1))
    initial = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    ref_before = policy.reference_log_probs(random_batch(seed=9))
    kls = []
    for seed in range(1, 5):
        batch = random_batch(seed=seed)
        metrics = policy.train_step(batch, mini_batch_rows=batch.input_ids.shape[0])
        kls.append(metrics["kl_ref_mean"])
        assert metrics["ref_s"] >= 0.0 and metrics["kl"] == metrics["kl_ref_mean"]
    assert kls[0] == 0.0, "at step 1 the policy is the reference (one update per step)"
    assert all(k > 0 for k in kls[1:]), kls
    for name, p in policy.ref_packed.hf.named_parameters():
        assert torch.equal(p, initial[name]), f"reference weight {name} moved"
    assert any(not torch.equal(p, initial[n]) for n, p in policy.model.named_parameters())
    assert torch.equal(policy.reference_log_probs(random_batch(seed=9)), ref_before)


def hand_step_gradient(policy_dir, ref_dir, batch, *, kl_coef, kl_in, estimator):
    """One update by hand on padded rows: token-mean over the trained tokens of the PPO term
    (proximal = the policy before the update, TIS weight min(exp(prox − behav), 2)) plus, in the
    loss, kl_coef·KL_t; in the reward, GRPO advantages of reward − kl_coef·Σ_t KL_t(prox, ref)."""
    model = load(policy_dir)
    with torch.no_grad():
        ref = padded_log_probs(load(ref_dir), batch)
    logp = padded_log_probs(model, batch)
    prox = logp.detach()
    mask = batch.loss_mask
    log_r = ref - (logp if kl_in == "loss" else prox)
    kl = {"k1": -log_r, "k3": torch.exp(log_r) - log_r - 1}[estimator]
    rewards = batch.rewards
    if kl_in == "reward":
        rewards = rewards - kl_coef * (kl.detach() * mask).sum(-1)  # one row per trajectory here
    adv = grpo_advantages(rewards, batch.group_index)[:, None]
    weight = torch.clamp(torch.exp(prox - batch.behaviour_logp), max=2.0)
    per_token = -adv * torch.exp(logp - prox) * weight  # ratio 1: no clipping
    if kl_in == "loss":
        per_token = per_token + kl_coef * kl
    loss = (per_token * mask).sum() / mask.sum()
    loss.backward()
    return (
        loss.item(),
        {n: p.grad for n, p in model.named_parameters()},
        ((kl.detach() * mask).sum() / mask.sum()).item(),
    )


@pytest.mark.parametrize(("kl_in", "estimator"), [("loss", "k3"), ("reward", "k1")])
def test_kl_loss_and_gradient_equal_the_hand_computation(tiny_model_dir, other_model_dir, kl_in, estimator):
    """Against a reference different from the policy, so the KL and its gradient are not zero."""
    batch = random_batch(seed=4)
    policy = HFPolicy(
        tiny_model_dir,
        kl_config(kl_coef=0.5, kl_in=kl_in, kl_estimator=estimator),
        reference_path=other_model_dir,
    )
    metrics = policy.train_step(batch, mini_batch_rows=batch.input_ids.shape[0])
    loss, grads, kl_mean = hand_step_gradient(
        tiny_model_dir, other_model_dir, batch, kl_coef=0.5, kl_in=kl_in, estimator=estimator
    )
    assert kl_mean > 0.01  # the two random models disagree: a real KL term
    assert metrics["kl_ref_mean"] == pytest.approx(kl_mean, rel=1e-4)
    assert metrics["loss"] == pytest.approx(loss, rel=1e-4, abs=1e-6)
    for name, p in policy.model.named_parameters():
        assert torch.allclose(p.grad, grads[name], atol=1e-6, rtol=1e-4), name
    # Without the KL the update differs (the term is really in it).
    plain = HFPolicy(tiny_model_dir, kl_config())
    plain.train_step(batch, mini_batch_rows=batch.input_ids.shape[0])
    assert any(not torch.allclose(p.grad, grads[n], atol=1e-6) for n, p in plain.model.named_parameters())


def test_kl_in_reward_sums_every_segment_of_a_trajectory():
    """Trajectory 0 has two rows (segments); its penalty is the sum over both rows' trained tokens."""
    loss_mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1], [0, 1, 1, 1], [0, 1, 0, 0]], dtype=torch.float32)
    batch = TrainBatch(
        input_ids=torch.ones(4, 4, dtype=torch.long),
        attention_mask=torch.ones(4, 4, dtype=torch.long),
        loss_mask=loss_mask,
        behaviour_logp=torch.zeros(4, 4),
        token_versions=torch.zeros(4, 4, dtype=torch.long),
        rewards=torch.tensor([1.0, 1.0, 0.0, 0.5]),
        group_index=torch.zeros(4, dtype=torch.long),
        response_lengths=torch.full((4,), 3),
        trajectory_index=torch.tensor([0, 0, 1, 2]),
    )
    token_kl = torch.arange(16, dtype=torch.float32).reshape(4, 4) / 10 * loss_mask
    coef = 0.2
    sums = [0.1 * (1 + 2 + 6 + 7), 0.1 * (9 + 10 + 11), 0.1 * 13]
    rewards = [1.0 - coef * sums[0], 0.0 - coef * sums[1], 0.5 - coef * sums[2]]
    mean = sum(rewards) / 3
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 2)
    hand = [(r - mean) / (std + 1e-6) for r in rewards]
    got = trajectory_advantages(batch, token_kl=token_kl, kl_coef=coef)
    assert torch.allclose(got, torch.tensor([hand[0], hand[0], hand[1], hand[2]]), atol=1e-6)
    assert not torch.allclose(got, trajectory_advantages(batch), atol=1e-3)


def test_reference_misuse_is_named(tiny_model_dir, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    plain = HFPolicy(tiny_model_dir, kl_config())
    assert plain.ref_packed is None
    with pytest.raises(ReferencePolicyError, match="no reference"):
        plain.reference_log_probs(random_batch())
    with pytest.raises(ReferencePolicyError, match="no config.json"):
        HFPolicy(tiny_model_dir, kl_config(kl_coef=0.1), reference_path=tmp_path)
    cfg = AutoConfig.from_pretrained(tiny_model_dir)
    cfg.vocab_size = 80
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "wide")
    with pytest.raises(ReferencePolicyError, match="does not match the policy"):
        HFPolicy(tiny_model_dir, kl_config(kl_coef=0.1), reference_path=tmp_path / "wide")
