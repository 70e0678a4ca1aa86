import math

import pytest
import torch

from arl.queue.types import Response, Sample
from arl.trainer import assemble_batch, grpo_advantages, policy_loss, token_log_probs
from arl.trainer.errors import BatchError


def test_grpo_advantages_are_group_relative():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0])
    groups = torch.tensor([0, 0, 1, 1, 2])
    centered = grpo_advantages(rewards, groups, norm_by_std=False)
    assert torch.allclose(centered, torch.tensor([0.5, -0.5, 0.0, 0.0, 0.0]))
    normed = grpo_advantages(rewards, groups)
    std = math.sqrt((0.25 + 0.25) / 1)
    assert normed[0].item() == pytest.approx(0.5 / std, rel=1e-4)
    assert normed[2].item() == 0.0 and normed[4].item() == 0.0


def test_token_log_probs_match_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    logp = token_log_probs(logits, ids, temperature=0.7)
    ref = torch.log_softmax(logits / 0.7, -1)
    assert logp[:, 0].abs().sum() == 0
    for b in range(2):
        for t in range(1, 5):
            assert logp[b, t].item() == pytest.approx(ref[b, t - 1, ids[b, t]].item(), abs=1e-5)


def test_policy_loss_on_policy_is_minus_advantage_and_clips():
    logp = torch.zeros(1, 4, requires_grad=True)
    zeros = torch.zeros(1, 4)
    adv = torch.full((1, 4), 2.0)
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    loss, info = policy_loss(logp, zeros, zeros, adv, mask)
    assert loss.item() == pytest.approx(-2.0)
    loss.backward()
    # d loss / d logp = -adv / n_tokens on masked tokens only
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -1.0, -1.0, 0.0]]))
    # A ratio far above 1 + eps with positive advantage is clipped: no gradient
    far = torch.full((1, 4), 1.0, requires_grad=True)
    loss, info = policy_loss(far, zeros, zeros, adv, mask)
    loss.backward()
    assert far.grad.abs().sum() == 0 and info["clip_frac"] == 1.0
    # The behaviour weight is truncated at tis_cap
    loss, info = policy_loss(zeros, zeros, torch.full((1, 4), -5.0), adv, mask, tis_cap=2.0)
    assert loss.item() == pytest.approx(-4.0) and info["tis_clip_frac"] == 1.0


def make_sample(uid, prompt, responses):
    return Sample(
        uid=uid,
        prompt_ids=prompt,
        start_version=0,
        end_version=0,
        responses=[
            Response(
                response_ids=ids,
                response_mask=mask,
                response_logprobs=[-0.5 * m for m in mask],
                weight_versions=[0 if m else -1 for m in mask],
                reward=r,
            )
            for ids, mask, r in responses
        ],
    )


def test_assemble_batch_masks_only_sampled_tokens():
    s1 = make_sample("a", [1, 2], [([3, 4, 5], [1, 0, 1], 1.0), ([6], [1], 0.0)])
    s2 = make_sample("b", [7], [([8, 9], [1, 1], 0.5)])
    batch = assemble_batch([s1, s2], pad_token_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5], [1, 2, 6, 0, 0], [7, 8, 9, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 0, 1], [0, 0, 1, 0, 0], [0, 1, 1, 0, 0]]
    assert batch.attention_mask.tolist() == [[1] * 5, [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]]
    assert batch.behaviour_logp[0].tolist() == [0, 0, -0.5, 0, -0.5]
    assert batch.group_index.tolist() == [0, 0, 1]
    bad = make_sample("c", [1], [([2, 3], [1], 0.0)])
    with pytest.raises(BatchError, match="sample c"):
        assemble_batch([bad], pad_token_id=0)
