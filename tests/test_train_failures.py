"""A failure on the rollout side ends the run with an error that names it (no hang, Ray shut down: the
driver's connection to the suite's Ray head, root conftest.py)."""

import json

import pytest

from arl.rollout.errors import UnknownRewardError
from arl_train.config import load_config
from arl_train.run import run

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # a full app run (tiers: conftest.py)


def test_a_broken_task_fails_the_run_with_its_reason(tmp_path, app_ray_head):
    data = tmp_path / "tasks.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "reward_fn": "no_such_reward"}) + "\n")
    config = load_config(
        overrides=[
            f"data.source={data}",
            "rollout.engine=torch",
            "trainer.total_steps=3",
            "actor.ppo_mini_batch_size=2",
            "rollout.n=2",
            f"output.dir={tmp_path / 'out'}",
            f"ray.address={app_ray_head}",
        ]
    )
    with pytest.raises(Exception, match="no_such_reward") as info:
        run(config, log=lambda _: None)
    assert isinstance(info.value, UnknownRewardError) or "UnknownRewardError" in str(info.value)
    import ray

    assert not ray.is_initialized()
