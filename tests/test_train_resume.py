"""Stop a run at a checkpoint and resume it: weights, optimizer, step, weight version, queued samples."""

import json

import pytest
import torch

from arl.queue.persistence import SNAPSHOT_FILENAME, read_snapshot
from arl_train.config import load_config
from arl_train.run import run

pytestmark = pytest.mark.slow

COMMON = ["rollout.engine=torch", "actor.ppo_mini_batch_size=2", "rollout.n=2", "rollout.max_tokens=8",
          "async_training.staleness_threshold=1.0"]


def test_resume_continues_where_the_checkpoint_stopped(tmp_path):
    first = run(load_config(overrides=[*COMMON, "trainer.total_steps=3", f"output.dir={tmp_path / 'a'}"]),
                log=lambda _: None)
    checkpoint = tmp_path / "a" / "checkpoint"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["step"] == 3 and state["version"] == 3 and state["samples_seen"] == 6
    assert state["tasks_started"] >= 6
    assert (checkpoint / "optimizer.pt").is_file()
    assert (checkpoint / SNAPSHOT_FILENAME).is_file()
    queued = read_snapshot(checkpoint)  # samples produced but not yet trained on
    assert first.weights_equal_after_sync

    second = run(load_config(overrides=[*COMMON, "trainer.total_steps=5", f"trainer.resume_from={checkpoint}",
                                        f"output.dir={tmp_path / 'b'}"]), log=lambda _: None)
    rows = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [4, 5]  # the step count continues
    assert [r["version"] for r in rows] == [4, 5]  # so does the weight version, engine included
    assert second.rollout["engine_versions"] == [5]
    assert second.samples_consumed == 10
    # The samples queued at the checkpoint come back first (FIFO): step 4 trains on the first two of
    # them, so its staleness is exactly theirs.
    assert len(queued) >= 2
    assert rows[0]["staleness_max"] == max(3 - s.min_token_version() for s in queued[:2])
    assert rows[0]["staleness_mean"] == sum(3 - s.min_token_version() for s in queued[:2]) / 2
    assert second.weights_equal_after_sync
    # It trained further from the restored optimizer: two more updates on top of the checkpoint's three.
    # (Asserted on the optimizer, not the weights: a tiny untrained model can draw only zero-advantage
    # groups in five steps, and Adam with zero gradients and zero moments leaves the weights as they are.)
    assert _adam_steps(tmp_path / "b" / "checkpoint") == {5.0}
    assert _adam_steps(checkpoint) == {3.0}


def _adam_steps(checkpoint) -> set[float]:
    state = torch.load(checkpoint / "optimizer.pt", weights_only=True)["state"]
    return {float(s["step"]) for s in state.values()}
