"""The loss over a segmented trajectory, read through the queue, equals the loss over the same tokens laid
out by hand.

A group of two trajectories for one prompt: A was rewritten twice (3 segments: each later segment's
prompt drops a "think" token of the turn before), B never (1 segment). The queue path encodes and decodes
the sample, lays it out with `arl.queue.iter_segment_rows` (one padded row per segment), computes GRPO
advantages per trajectory (segments of one trajectory count once in the group statistics) and takes the
token mean over mask-1 tokens (each sampled token counts once). The hand path runs every segment through
the model on its own, with the advantages and the normaliser written out.
"""

from __future__ import annotations

import math

import pytest
import torch

from arl.queue import Sample, SegmentRow, decode_sample, encode_sample, iter_segment_rows, response_from_segments
from arl.trainer.advantages import grpo_advantages
from arl.trainer.algorithm_config import AlgorithmConfig, compute_token_loss
from arl.trainer.algorithms import token_log_probs

torch.set_num_threads(1)

PROMPT = [1, 2, 3, 4]
# (prompt ids, response ids, mask) of each segment, written out by hand. Trajectory A, turn by turn:
# turn 1 samples [10, 11, 12] after a think token 60; turn 2's prompt drops 60 and adds a tool result
# [30, 31] and generation prompt [5]; turn 3 likewise (drops 61).
A = [
    (PROMPT + [60], [10, 11, 12, 9], [1, 1, 1, 0]),
    (PROMPT + [10, 11, 12, 9, 30, 31, 5, 61], [13, 14, 9], [1, 1, 0]),
    (PROMPT + [10, 11, 12, 9, 30, 31, 5, 13, 14, 9, 32, 5], [15, 16, 17, 9], [1, 1, 1, 0]),
]
B = [(PROMPT + [60], [20, 21, 9, 33, 34, 5, 22, 9], [1, 1, 0, 0, 0, 0, 1, 0])]
REWARDS = {"A": 1.0, "B": 0.0}


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def _logp_of(model, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids])
    return token_log_probs(model(input_ids=x).logits, x)[0]


def behaviour_logprobs(model, segment) -> list[float]:
    """'Sampled' log probs: the model's own, shifted a little per token so the TIS weight is not 1."""
    prompt, resp, mask = segment
    with torch.no_grad():
        logp = _logp_of(model, prompt + resp)[len(prompt):]
    return [(lp + 0.05 * (k % 3)) if m else 0.0 for k, (lp, m) in enumerate(zip(logp.tolist(), mask))]


def make_sample(model) -> Sample:
    def rows(traj):
        return [SegmentRow(prompt_ids=p, response_ids=r, response_mask=m, response_logprobs=behaviour_logprobs(model, (p, r, m)),
                           weight_versions=[0 if x else -1 for x in m]) for p, r, m in traj]

    responses = [response_from_segments(rows(A), group_prompt=A[0][0], reward=REWARDS["A"]),
                 response_from_segments(rows(B), group_prompt=A[0][0], reward=REWARDS["B"])]
    return Sample(uid="g", prompt_ids=A[0][0], responses=responses, start_version=0, end_version=0)


def queue_loss(model, sample: Sample, cfg: AlgorithmConfig, *, segments_as_trajectories: bool = False) -> torch.Tensor:
    rows = list(iter_segment_rows([decode_sample(encode_sample(sample))]))
    unit = [i for i in range(len(rows))] if segments_as_trajectories else [r.trajectory for r in rows]
    n_units = max(unit) + 1
    rewards = torch.zeros(n_units)
    groups = torch.zeros(n_units, dtype=torch.long)
    for u, r in zip(unit, rows):
        rewards[u], groups[u] = r.reward, r.group
    advantages = grpo_advantages(rewards, groups)
    width = max(len(r.row.prompt_ids) + len(r.row.response_ids) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros(len(rows), width)
    behaviour = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        p, resp = r.row.prompt_ids, r.row.response_ids
        ids[i, : len(p) + len(resp)] = torch.tensor(p + resp)
        attn[i, : len(p) + len(resp)] = 1
        mask[i, len(p): len(p) + len(resp)] = torch.tensor(r.row.response_mask, dtype=torch.float32)
        behaviour[i, len(p): len(p) + len(resp)] = torch.tensor(r.row.response_logprobs)
    logp = token_log_probs(model(input_ids=ids, attention_mask=attn).logits, ids)
    sel = mask.bool()
    seq_index = torch.tensor(unit)[:, None].expand_as(ids)[sel]
    flat = logp[sel]
    per_token, _ = compute_token_loss(cfg, flat, flat.detach(), behaviour[sel], advantages[seq_index], seq_index,
                                      num_seqs=n_units)
    return per_token.sum() / sel.sum()  # token mean: every sampled token once


def hand_loss(model, cfg: AlgorithmConfig) -> torch.Tensor:
    # GRPO over the two trajectories: mean 0.5, unbiased std sqrt(0.5); A gets +1/sqrt(2), B -1/sqrt(2).
    adv = {"A": 0.5 / math.sqrt(0.5), "B": -0.5 / math.sqrt(0.5)}
    terms = []
    for name, traj in (("A", A), ("B", B)):
        for segment in traj:
            prompt, resp, mask = segment
            behaviour = behaviour_logprobs(model, segment)
            logp = _logp_of(model, prompt + resp)
            for k, m in enumerate(mask):
                if not m:
                    continue
                lp = logp[len(prompt) + k]
                ratio = torch.exp(lp - lp.detach())  # proximal = current weights: ratio 1, gradient flows
                weight = min(math.exp(lp.item() - behaviour[k]), cfg.tis_cap)
                terms.append(-adv[name] * ratio * weight)
    sampled = sum(sum(m) for traj in (A, B) for _, _, m in traj)
    assert len(terms) == sampled == 11
    return torch.stack(terms).sum() / sampled


def _grads(model, loss: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_segmented_loss_equals_hand_layout(model):
    cfg = AlgorithmConfig()
    sample = make_sample(model)
    assert [r.num_segments for r in sample.responses] == [3, 1]
    got = queue_loss(model, sample, cfg)
    want = hand_loss(model, cfg)
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)
    g_got, g_want = _grads(model, queue_loss(model, sample, cfg)), _grads(model, hand_loss(model, cfg))
    assert torch.allclose(g_got, g_want, atol=1e-6, rtol=1e-4)
    # Counting each segment as a trajectory in the group statistics would give another loss.
    wrong = queue_loss(model, sample, cfg, segments_as_trajectories=True)
    assert not torch.allclose(wrong, want, atol=1e-4)
