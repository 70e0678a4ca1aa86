"""The trainer ranks' allocator setting: what `trainer_allocator_env` adds to the user's configuration,
and that an actor given it through Ray keeps the run's own environment beside it (Ray merges them)."""

import os

import pytest

from arl_train.allocator import trainer_allocator_env
from arl_train.config import load_config


def test_expandable_segments_added_when_nothing_is_set():
    assert trainer_allocator_env(True, {}) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_other_allocator_options_are_kept_under_the_name_they_were_set_by():
    assert trainer_allocator_env(True, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}) == {
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"
    }
    assert trainer_allocator_env(True, {"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.8,"}) == {
        "PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.8,expandable_segments:True"
    }


@pytest.mark.parametrize(
    "conf", ["expandable_segments:False", "max_split_size_mb:64,expandable_segments:True"]
)
def test_a_users_own_expandable_segments_choice_stands(conf):
    assert trainer_allocator_env(True, {"PYTORCH_CUDA_ALLOC_CONF": conf}) == {}
    assert trainer_allocator_env(True, {"PYTORCH_ALLOC_CONF": conf}) == {}


def test_off_adds_nothing():
    assert trainer_allocator_env(False, {}) == {}


def test_off_by_default_and_settable_from_the_config():
    assert load_config().actor.expandable_segments is False
    assert load_config(overrides=["actor.expandable_segments=true"]).actor.expandable_segments is True


class _Env:
    def get(self, names):
        return {n: os.environ.get(n, "") for n in names}


@pytest.mark.slow
def test_ray_actor_gets_the_setting_beside_the_runs_environment(app_ray_head):
    import ray

    ray.init(address=app_ray_head, log_to_driver=False, runtime_env={"env_vars": {"HF_HOME": "/tmp/x"}})
    try:
        env = trainer_allocator_env(True, {})
        actor = ray.remote(_Env).options(num_cpus=0, runtime_env={"env_vars": env}).remote()
        seen = ray.get(actor.get.remote(["HF_HOME", "PYTORCH_CUDA_ALLOC_CONF"]), timeout=120)
        assert seen == {"HF_HOME": "/tmp/x", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    finally:
        ray.shutdown()
