"""`trainer.profile_step` is validated (the profiled run itself: tests/test_train_colocated.py)."""

import pytest

from arl_train.config import ConfigError, load_config


def test_profile_step_is_validated():
    assert load_config(overrides=["trainer.profile_step=2"]).trainer.profile_step == 2
    with pytest.raises(ConfigError, match="trainer.profile_step"):
        load_config(overrides=["trainer.profile_step=-1"])
