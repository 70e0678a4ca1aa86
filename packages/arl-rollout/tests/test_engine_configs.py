"""The engines' configs refuse out-of-range fields themselves, naming the field (no engine starts)."""

import pytest

from arl.rollout.engines.torch_engine import TorchEngineConfig
from arl.rollout.engines.vllm_engine import VllmEngineConfig
from arl.rollout.errors import EngineConfigError

VLLM_CASES = [
    ("dtype", "int8"),
    ("max_model_len", 0),
    ("gpu_memory_utilization", 0.0),
    ("gpu_memory_utilization", 1.5),
    ("tensor_parallel_size", 0),
    ("max_num_seqs", 0),
    ("max_num_batched_tokens", 0),
    ("start_timeout_s", 0.0),
]


@pytest.mark.parametrize(("field", "value"), VLLM_CASES, ids=[f"{f}={v}" for f, v in VLLM_CASES])
def test_vllm_engine_config_refuses_a_bad_field_by_name(field, value):
    with pytest.raises(EngineConfigError, match=rf"^{field}\b"):
        VllmEngineConfig(model_path="/m", **{field: value})


def test_vllm_engine_config_accepts_its_defaults_and_auto():
    assert VllmEngineConfig(model_path="/m", dtype="auto", gpu_memory_utilization=1.0).dtype == "auto"


@pytest.mark.parametrize(("field", "value"), [("dtype", "auto"), ("max_batch", 0)])
def test_torch_engine_config_refuses_a_bad_field_by_name(field, value):
    with pytest.raises(EngineConfigError, match=rf"^{field}\b"):
        TorchEngineConfig(model_path="/m", **{field: value})
