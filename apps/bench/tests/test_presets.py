"""Every shipped config loads and validates on this machine (no GPU needed to load one): a preset that
only fails once it reaches a GPU machine costs a whole GPU run."""

from pathlib import Path

import pytest

from arl_train.config import load_config

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = sorted(
    [
        *(ROOT / "apps" / "bench" / "configs").glob("*.toml"),
        *(ROOT / "apps" / "train" / "configs").glob("*.toml"),
    ]
)


@pytest.mark.parametrize("path", CONFIGS, ids=[f"{p.parent.parent.name}/{p.name}" for p in CONFIGS])
def test_shipped_config_loads(path):
    import tomllib

    # A recipe for the user's own model (e.g. swe.toml's /models/Qwen3-4B) names a folder this machine
    # lacks: the rest of it must still load and validate, with the built-in model in its place.
    model = tomllib.loads(path.read_text()).get("model", {}).get("path", "builtin:")
    overrides = [] if model.startswith("builtin:") or Path(model).is_dir() else ["model.path=builtin:tiny"]
    config = load_config(path, overrides)
    assert config.model.path


@pytest.mark.parametrize("shape", ["qwen3-1.7b-random", "qwen3-4b-random"])
def test_bench_preset_takes_the_larger_shapes(shape):
    config = load_config(ROOT / "apps" / "bench" / "configs" / "h200x2.toml", [f"model.path=builtin:{shape}"])
    assert config.model.path == f"builtin:{shape}"


LONG_PROMPT_KL = [
    "data.source=builtin:longtail?median=659&p99_ratio=6.27&max=7168&prompt_words=340",
    "rollout.max_tokens=7168",
    "actor.algorithm.kl_coef=0.001",
]


@pytest.mark.parametrize(
    "workload",
    [[], ["model.path=builtin:qwen3-1.7b-random"], LONG_PROMPT_KL],
    ids=["small", "qwen3-1.7b", "long-prompt-kl"],
)
def test_concurrent_under_the_runs_own_mps_loads_on_the_bench_preset(workload):
    # h200_shared_phases.sh's longklmpsconc and small17 phases: concurrent with resources.mps=start.
    overrides = [
        "resources.shared_gpu=concurrent",
        "rollout.gpu_memory_utilization=0.45",
        "resources.mps=start",
        "async_training.staleness_threshold=1.0",
        *workload,
    ]
    config = load_config(ROOT / "apps" / "bench" / "configs" / "h200x2.toml", overrides, "d")
    assert (config.resources.shared_gpu, config.resources.mps) == ("concurrent", "start")


def test_concurrent_with_the_trainers_sm_cap_loads_on_the_bench_preset():
    # h200_shared_phases.sh's longklsm phase.
    overrides = [
        "resources.shared_gpu=concurrent",
        "rollout.gpu_memory_utilization=0.45",
        "resources.mps=start",
        "resources.mps_trainer_sm_percent=60",
        "async_training.staleness_threshold=1.0",
        *LONG_PROMPT_KL,
    ]
    config = load_config(ROOT / "apps" / "bench" / "configs" / "h200x2.toml", overrides, "d")
    assert config.resources.mps_trainer_sm_percent == 60
