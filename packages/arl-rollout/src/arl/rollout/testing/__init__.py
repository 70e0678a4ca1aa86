"""Test doubles and simulation parts that ship with arl-rollout (no vLLM, no GPU, no model download).

Every name is importable from `arl.rollout.testing`; the modules say what each part is for:

- `engines`: `SimEngine`, a scripted engine (deterministic tokens, real arl-sync weight receiving) for
  tests of pause/abort/resume and partial rollout.
- `agent_loops`: `TokenAgentLoop`, `SegmentedAgentLoop`, `MixedGroupAgentLoop`: agent loops without a
  tokenizer, with deterministic rewards.
- `models`: `save_random_qwen3`, `save_random_qwen3_moe` (small random HF folders) and `hf_logprobs`
  (reference log probs), for checking engines exactly.
- `virtual_clock`: `VirtualClockLoop`, `virtual_time`, `SimulationDeadlock`: asyncio on virtual time.
- `cost_model`: `DecodeCost`, `CostModelEngine`: a replica's calibrated cost, for apps/bench's simulator.
"""

from .agent_loops import MixedGroupAgentLoop, SegmentedAgentLoop, TokenAgentLoop
from .cost_model import CostModelEngine, DecodeCost
from .engines import SimEngine
from .models import hf_logprobs, save_random_qwen3, save_random_qwen3_moe
from .virtual_clock import SimulationDeadlock, VirtualClockLoop, virtual_time

__all__ = [
    "CostModelEngine",
    "DecodeCost",
    "MixedGroupAgentLoop",
    "SegmentedAgentLoop",
    "SimEngine",
    "SimulationDeadlock",
    "TokenAgentLoop",
    "VirtualClockLoop",
    "hf_logprobs",
    "save_random_qwen3",
    "save_random_qwen3_moe",
    "virtual_time",
]
