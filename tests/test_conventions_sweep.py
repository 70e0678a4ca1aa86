"""The loss-convention sweep's runs (packages/arl-trainer/benchmarks/conventions_sweep.py) load and
validate as apps/train would load them, for every workload and arm: a run that fails on its config only
once it reaches a GPU machine costs a whole GPU run."""

import importlib.util
import sys
from pathlib import Path

import pytest

from arl_train.cli import build_parser
from arl_train.config import load_config

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "conventions_sweep", ROOT / "packages/arl-trainer/benchmarks/conventions_sweep.py"
)
sweep = importlib.util.module_from_spec(_spec)
sys.modules["conventions_sweep"] = sweep
_spec.loader.exec_module(sweep)


def _load(args: list[str]):
    """The config apps/train builds from this command line (its own parser, run from the repo root)."""
    parsed = build_parser().parse_args(args)
    return load_config(ROOT / parsed.config if parsed.config else None, parsed.overrides, parsed.mode)


@pytest.mark.parametrize("workload", list(sweep.WORKLOADS))
@pytest.mark.parametrize("arm", list(sweep.ARMS))
def test_every_run_of_the_sweep_loads(workload, arm, tmp_path):
    config = _load(sweep.app_args(arm, 0, 5, tmp_path / "run", workload))
    assert config.trainer.total_steps == 5 and config.async_training.partial_rollout
    if arm == "norm_constant":  # the constant is the workload's generation budget
        assert (
            config.actor.algorithm.norm_len == sweep.WORKLOADS[workload].budget == config.rollout.max_tokens
        )
    if arm.startswith("seqis"):  # the workload's band
        algorithm = config.actor.algorithm
        assert (algorithm.seq_is_low, algorithm.seq_is_high) == sweep.WORKLOADS[workload].seq_is_band


def test_the_gpu_workload_is_the_learnable_long_tail_time_sliced_on_one_gpu(tmp_path):
    config = _load(sweep.app_args("kl_clamped", 0, 5, tmp_path / "run", "h200_longtail"))
    assert "reward=digits" in config.data.source and config.resources.shared_gpu == "time_sliced"
    assert config.model.path == "builtin:qwen3-0.6b-random" and config.rollout.device == "cuda"
    # Two optimizer updates per step (16 prompts, mini-batches of 8): ppo_kl and clip_frac are not 0 by construction.
    assert config.async_training.require_batches == 2 and config.actor.ppo_mini_batch_size == 8


def test_updates_split_the_same_prompts_into_more_mini_batches(tmp_path):
    one = _load(sweep.app_args("norm_constant", 0, 5, tmp_path / "run", "longtail"))
    two = _load(sweep.app_args("norm_constant", 0, 5, tmp_path / "run", "longtail", updates=2))
    assert (one.actor.ppo_mini_batch_size, one.async_training.require_batches) == (8, 1)
    assert (two.actor.ppo_mini_batch_size, two.async_training.require_batches) == (4, 2)
    with pytest.raises(SystemExit, match="does not divide"):
        sweep.app_args("norm_constant", 0, 5, tmp_path / "run", "longtail", updates=3)
