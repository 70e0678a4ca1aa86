"""The trainer's loss over a segmented trajectory equals the loss over the same tokens laid out by hand.

A group of two trajectories for one prompt: A was rewritten twice (3 segments: each later segment's
prompt drops a "think" token of the turn before), B never (1 segment). The trainer path encodes and
decodes the sample, assembles it (one row per segment), and runs one `HFPolicy.train_step` (packed
micro-batches, GRPO per trajectory, token-mean loss). The hand path runs every segment through the model
on its own, with the advantages (segments of one trajectory count once in the group statistics) and the
normaliser (each sampled token once) written out. Loss and gradient must agree.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from arl.queue import Sample, SegmentRow, decode_sample, encode_sample, response_from_segments
from arl.trainer import HFPolicy, TrainerConfig, assemble_batch
from arl.trainer.algorithm_config import AlgorithmConfig
from arl.trainer.algorithms import token_log_probs
from arl.trainer.batch import TrainBatch
from arl.trainer.config import OptimConfig

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
        logp = _logp_of(model, prompt + resp)[len(prompt) :]
    return [(lp + 0.05 * (k % 3)) if m else 0.0 for k, (lp, m) in enumerate(zip(logp.tolist(), mask))]


def make_sample(model) -> Sample:
    def rows(traj):
        return [
            SegmentRow(
                prompt_ids=p,
                response_ids=r,
                response_mask=m,
                response_logprobs=behaviour_logprobs(model, (p, r, m)),
                weight_versions=[0 if x else -1 for x in m],
            )
            for p, r, m in traj
        ]

    responses = [
        response_from_segments(rows(A), group_prompt=A[0][0], reward=REWARDS["A"]),
        response_from_segments(rows(B), group_prompt=A[0][0], reward=REWARDS["B"]),
    ]
    return Sample(uid="g", prompt_ids=A[0][0], responses=responses, start_version=0, end_version=0)


def trainer_step(model_dir, batch: TrainBatch, cfg: TrainerConfig) -> tuple[float, torch.Tensor]:
    """The trainer's loss and gradient for `batch` in one update (one mini-batch)."""
    policy = HFPolicy(model_dir, cfg)
    metrics = policy.train_step(batch, mini_batch_rows=batch.input_ids.shape[0])
    return metrics["loss"], torch.cat([p.grad.flatten() for p in policy.model.parameters()])


def hand_loss(model, cfg: TrainerConfig) -> torch.Tensor:
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
                weight = min(math.exp(lp.item() - behaviour[k]), cfg.algorithm.tis_cap)
                terms.append(-adv[name] * ratio * weight)
    sampled = sum(sum(m) for traj in (A, B) for _, _, m in traj)
    assert len(terms) == sampled == 11
    return torch.stack(terms).sum() / sampled


def _grads(model, loss: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def test_segmented_loss_equals_hand_layout(model, tiny_model_dir):
    cfg = TrainerConfig(
        optim=OptimConfig(lr=1e-3, grad_clip=1e9),
        mixed_precision="none",
        algorithm=AlgorithmConfig(proximal_mode="recompute"),
    )
    sample = decode_sample(encode_sample(make_sample(model)))  # through the queue's codec
    assert [r.num_segments for r in sample.responses] == [3, 1]
    batch = assemble_batch([sample], pad_token_id=0)
    assert batch.trajectory_index.tolist() == [0, 0, 0, 1] and batch.group_index.tolist() == [0, 0, 0, 0]
    assert batch.rewards.tolist() == [1.0, 1.0, 1.0, 0.0]
    assert int(batch.loss_mask.sum()) == 11  # every sampled token once
    want = hand_loss(model, cfg)
    want_grad = _grads(model, hand_loss(model, cfg))
    got, got_grad = trainer_step(tiny_model_dir, batch, cfg)
    assert got == pytest.approx(want.item(), rel=1e-5, abs=1e-6)
    assert torch.allclose(got_grad, want_grad, atol=1e-6, rtol=1e-4), (got_grad - want_grad).abs().max()
    # Counting each segment as a trajectory in the group statistics would give another loss.
    wrong_batch = dataclasses.replace(batch, trajectory_index=torch.arange(4))
    wrong, _ = trainer_step(tiny_model_dir, wrong_batch, cfg)
    assert abs(wrong - want.item()) > 1e-3
