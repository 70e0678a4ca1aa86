"""DAPO dynamic sampling: zero-variance groups dropped and counted by reason."""

import pytest
import torch

from arl.queue.types import Response, Sample
from arl.trainer.dynamic_sampling import filter_zero_variance_groups, informative_groups
from arl.trainer.errors import AlgorithmError


def group(uid, rewards):
    return Sample(
        uid=uid,
        prompt_ids=[1],
        start_version=0,
        end_version=0,
        responses=[
            Response(
                response_ids=[2], response_mask=[1], response_logprobs=[-0.1], weight_versions=[0], reward=r
            )
            for r in rewards
        ],
    )


def test_drops_uniform_and_single_response_groups_counting_each():
    samples = [
        group("a", [1, 1, 1]),
        group("b", [0, 1, 0]),
        group("c", [0.5]),
        group("d", [0, 0]),
        group("e", [0.2, 0.7]),
        group("f", []),
    ]
    result = filter_zero_variance_groups(samples)
    assert [s.uid for s in result.kept] == ["b", "e"]
    assert result.counts == {"kept": 2, "dropped_uniform_reward": 2, "dropped_single_response": 2}
    assert sum(result.counts.values()) == len(samples)  # nothing vanishes uncounted
    near = filter_zero_variance_groups([group("g", [1.0, 1.0 + 1e-9])], atol=1e-6)
    assert near.dropped_uniform_reward == 1 and not near.kept
    with pytest.raises(AlgorithmError, match="atol"):
        filter_zero_variance_groups(samples, atol=-1)


def test_tensor_form_marks_informative_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.2, 0.2])
    groups = torch.tensor([0, 0, 1, 1, 2, 3, 3])
    assert informative_groups(rewards, groups).tolist() == [False, True, False, False]
