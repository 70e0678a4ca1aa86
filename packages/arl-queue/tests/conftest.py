"""Shared helpers for arl-queue tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from arl.queue import Response, Sample


def make_sample(i: int, n_tokens: int = 4) -> Sample:
    """A small but fully populated sample whose uid encodes `i`."""
    return Sample(
        uid=f"s{i}",
        prompt_ids=[1, 2, 3],
        responses=[
            Response(
                response_ids=list(range(n_tokens)),
                response_mask=[1] * n_tokens,
                response_logprobs=[-0.5] * n_tokens,
                weight_versions=[i] * n_tokens,
                reward=float(i),
                rewards={"correct": 1.0},
            )
        ],
        start_version=i,
        end_version=i + 1,
        task_id=f"t{i}",
        metadata={"ground_truth": str(i), "nested": {"a": [1, 2]}},
        timings={"generate": 0.25},
    )


@pytest.fixture
def sample() -> Callable[..., Sample]:
    """The `make_sample` factory."""
    return make_sample
