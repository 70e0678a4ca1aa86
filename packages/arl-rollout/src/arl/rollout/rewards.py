"""Verifiable reward functions, registered by name so that a dataset row's `reward_fn` picks one.

Each takes the decoded response text and the task's ground truth and returns a score in [0, 1].
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from arl.rollout.errors import UnknownRewardError

RewardFn = Callable[[str, Any], float]
_REGISTRY: dict[str, RewardFn] = {}


def register_reward(name: str, fn: RewardFn) -> None:
    _REGISTRY[name] = fn


def get_reward(name: str) -> RewardFn:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownRewardError(f"unknown reward function {name!r}; registered: {sorted(_REGISTRY)}") from None


def exact_match(response: str, ground_truth: Any) -> float:
    """1.0 when the stripped response equals the ground truth's string form."""
    return float(response.strip() == str(ground_truth).strip())


def digits(response: str, ground_truth: Any) -> float:
    """Partial credit for answering with exactly `ground_truth` digits and nothing else.

    score = (number of digit characters, capped at the target) / max(target, length of the answer):
    1.0 only for exactly `target` digits; every non-digit character or extra digit costs.
    """
    target = int(ground_truth)
    answer = response.strip()
    if not answer:
        return 0.0
    n_digits = sum(ch.isdigit() for ch in answer)
    return min(n_digits, target) / max(target, len(answer))


def last_number(response: str, ground_truth: Any) -> float:
    """1.0 when the last number in the response equals the ground truth (math-style answers)."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", response)
    return float(bool(numbers) and float(numbers[-1]) == float(ground_truth))


register_reward("exact", exact_match)
register_reward("digits", digits)
register_reward("last_number", last_number)
