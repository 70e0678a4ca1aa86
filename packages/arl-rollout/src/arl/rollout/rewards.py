"""Verifiable reward functions, registered by name so that a dataset row's `reward_fn` picks one.

Each takes the decoded response text and the task's ground truth and returns a score in [0, 1].
"""

from __future__ import annotations

import hashlib
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
        raise UnknownRewardError(
            f"unknown reward function {name!r}; registered: {sorted(_REGISTRY)}"
        ) from None


def exact_match(response: str, ground_truth: Any) -> float:
    """1.0 when the stripped response equals the ground truth's string form."""
    return float(response.strip() == str(ground_truth).strip())


def digits(response: str, ground_truth: Any = None) -> float:
    """The share of the answer's characters that are digits (1.0 for a digits-only answer).

    The built-in task a freshly initialised tiny model can learn in minutes: a random policy emits a
    digit about 1% of the time, so the reward starts near 0.01 and GRPO drives it towards 1.
    """
    answer = response.strip()
    if not answer:
        return 0.0
    return sum(ch.isdigit() for ch in answer) / len(answer)


def last_number(response: str, ground_truth: Any) -> float:
    """1.0 when the last number in the response equals the ground truth (math-style answers)."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", response)
    return float(bool(numbers) and float(numbers[-1]) == float(ground_truth))


def synthetic_hash(response: str, ground_truth: Any = None) -> float:
    """SYNTHETIC: a deterministic score in [0, 1] from a hash of the response text.

    For throughput workloads (builtin:longtail): it gives GRPO groups reward variance, so the trainer
    does real work, but it measures nothing about the response.
    """
    return int.from_bytes(hashlib.sha256(response.encode()).digest()[:4], "big") / 0xFFFFFFFF


register_reward("exact", exact_match)
register_reward("synthetic_hash", synthetic_hash)
register_reward("digits", digits)
register_reward("last_number", last_number)
