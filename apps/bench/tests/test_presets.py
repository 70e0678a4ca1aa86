"""Every shipped config loads and validates on this machine (no GPU needed to load one): a preset that
only fails once it reaches the device costs a whole device call."""

from pathlib import Path

import pytest

from arl_train.config import load_config

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = sorted([*(ROOT / "apps" / "bench" / "configs").glob("*.toml"), *(ROOT / "apps" / "train" / "configs").glob("*.toml")])


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
