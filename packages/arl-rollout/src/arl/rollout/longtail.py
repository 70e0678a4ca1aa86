"""A built-in long-tail workload for measuring throughput honestly, with no download.

`builtin:longtail?median=659&p99_ratio=8&max=8192` makes tasks whose response lengths follow a
lognormal distribution (median `median`, 99th percentile `median × p99_ratio`, clipped to
[`min`, `max`]), like the response lengths of SWE and reasoning rollouts. Each task carries its own
target length as a sampling override (`metadata["sampling"] = {"max_tokens": L, "ignore_eos": true}`),
so even a randomly initialised model produces exactly L tokens per response. Prompts are a few random
words. The reward, `reward=`:
- `hash` (default): `synthetic_hash`, deterministic and meaningless. Such tasks exist to load the
  system, not to teach the model anything, and their samples say so (`metadata["synthetic"]`).
- `digits`: the share of the response's characters that are digits (`digits`), which a randomly
  initialised model can learn. It makes the long tail a training workload whose reward curve means
  something (the loss-convention runs of docs/design/loss-conventions.md); its samples are not
  labelled synthetic.
"""

from __future__ import annotations

import math
import random
from typing import Literal
from urllib.parse import parse_qsl

import msgspec

from arl.rollout.errors import DatasetError
from arl.rollout.types import Task

# z of the 99th percentile of the standard normal: p99/median = exp(Z99 · sigma).
Z99 = 2.3263478740408408

_WORDS = (
    "alpha beta gamma delta river stone cloud tree light paper table window green quiet swift "
    "north south east west number letter story music ocean field garden bridge signal engine"
).split()


class LongTailSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Parameters of `builtin:longtail` (query string of the source)."""

    # Median response length in tokens.
    median: int = 659
    # p99 / median of the response length; sets sigma = ln(p99_ratio) / z99. Ignored if sigma > 0.
    p99_ratio: float = 8.0
    # Lognormal sigma, when given directly (> 0).
    sigma: float = 0.0
    # Clip of the response length, in tokens.
    min: int = 1
    max: int = 8192
    # Random words per prompt.
    prompt_words: int = 16
    # The reward: "hash" (synthetic, nothing to learn) or "digits" (learnable; see the module docstring).
    reward: Literal["hash", "digits"] = "hash"

    @property
    def log_sigma(self) -> float:
        return self.sigma if self.sigma > 0 else math.log(self.p99_ratio) / Z99

    def validate(self) -> LongTailSpec:
        if self.median < 1 or self.min < 1 or self.max < self.min:
            raise DatasetError(f"builtin:longtail needs 1 <= min <= max and median >= 1, got {self}")
        if self.sigma <= 0 and self.p99_ratio <= 1:
            raise DatasetError(
                f"builtin:longtail p99_ratio must be > 1 (or give sigma), got {self.p99_ratio}"
            )
        if self.prompt_words < 1:
            raise DatasetError("builtin:longtail prompt_words must be >= 1")
        return self


def parse_spec(query: str) -> LongTailSpec:
    """`median=659&p99_ratio=8` → LongTailSpec; unknown or malformed keys are named."""
    raw: dict[str, float | int | str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if key == "reward":
            raw[key] = value
            continue
        try:
            raw[key] = int(value) if value.lstrip("-").isdigit() else float(value)
        except ValueError:
            raise DatasetError(f"builtin:longtail parameter {key}={value!r} is not a number") from None
    try:
        return msgspec.convert(raw, LongTailSpec, strict=False).validate()
    except msgspec.ValidationError as exc:
        raise DatasetError(
            f"builtin:longtail: {exc} (parameters: {[f.name for f in msgspec.structs.fields(LongTailSpec)]})"
        ) from None


def sample_lengths(spec: LongTailSpec, count: int, *, seed: int) -> list[int]:
    """`count` response lengths drawn from the spec's clipped lognormal (deterministic in seed)."""
    rng = random.Random(seed)
    mu, sigma = math.log(spec.median), spec.log_sigma
    return [min(spec.max, max(spec.min, round(math.exp(rng.gauss(mu, sigma))))) for _ in range(count)]


# The reward function each `reward=` names, and whether its samples are labelled synthetic.
_REWARDS = {"hash": ("synthetic_hash", True), "digits": ("digits", False)}


def longtail_tasks(query: str, *, seed: int, size: int) -> list[Task]:
    spec = parse_spec(query)
    reward_fn, synthetic = _REWARDS[spec.reward]
    lengths = sample_lengths(spec, size, seed=seed)
    rng = random.Random(seed + 1)
    tasks = []
    for i, length in enumerate(lengths):
        words = " ".join(rng.choice(_WORDS) for _ in range(spec.prompt_words))
        tasks.append(
            Task(
                id=f"longtail-{i}",
                messages=[{"role": "user", "content": f"Continue: {words}"}],
                reward_fn=reward_fn,
                metadata={
                    "sampling": {"max_tokens": length, "ignore_eos": True},
                    "target_tokens": length,
                    "workload": "longtail",
                }
                | ({"synthetic": True} if synthetic else {}),
            )
        )
    return tasks
