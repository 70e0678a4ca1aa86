"""Shared fixtures of arl-harbor's tests: offline settings, a tiny task, a loop factory."""

from __future__ import annotations

import os
import shutil

import msgspec
import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from arl.harbor import FailurePolicy, HarborConfig
from arl.harbor.testing import write_hello_task

needs_sandbox = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("nsenter") is None,
    reason="the local sandbox needs root, unshare and nsenter",
)


@pytest.fixture
def hello_task(tmp_path):
    return write_hello_task(tmp_path / "tasks")


@pytest.fixture
def harbor_config(tmp_path):
    """A config for fast tests: no retry backoff, trials under tmp_path."""

    def make(**fields) -> HarborConfig:
        policy = {"retry_backoff_sec": 0.0, **fields.pop("policy", {})}
        return HarborConfig(
            trials_dir=str(tmp_path / "trials"),
            trial_timeout_sec=fields.pop("trial_timeout_sec", 120.0),
            policy=msgspec.convert(policy, FailurePolicy),
            **fields,
        )

    return make
