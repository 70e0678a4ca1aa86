"""How to start one replica of arl's in-tree engine (`torch_engine.TorchEngine`).

Apart from the engine so that a run's configuration is read and checked without importing torch.
"""

from __future__ import annotations

import msgspec

from arl.rollout.errors import EngineConfigError

# The dtypes the in-tree engine runs (no "auto": it builds the model in the dtype it is given).
DTYPES = ("float32", "bfloat16", "float16")


class TorchEngineConfig(msgspec.Struct, kw_only=True):
    """How to start one in-tree replica."""

    # A Hugging Face model folder.
    model_path: str
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    # Weight version of the weights at `model_path` (non-zero when resuming from a checkpoint).
    initial_version: int = 0
    # Most requests decoded together in one forward pass.
    max_batch: int = 256
    # MoE models: report per sampled token the experts every layer chose (TokenOutput.routed_experts).
    return_routed_experts: bool = False

    def __post_init__(self) -> None:
        # Each message starts with the field's name, so a caller can tell which one (the app names its key).
        if self.dtype not in DTYPES:
            raise EngineConfigError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        if self.max_batch < 1:
            raise EngineConfigError(f"max_batch must be >= 1, got {self.max_batch!r}")
