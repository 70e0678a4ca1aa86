"""A short real run of apps/train: Ray, the queue actor, vLLM (CPU build) and the trainer.

Checks what the embedded default promises: samples flow through the queue, weights are synced
(with in-flight generations aborted and resumed: partial rollout), and after the last sync the
engine's weights equal the trainer's. Responses are long and the replica generates for one batch's
prompts at a time, so that generation, not training, sets the pace: every sync then finds requests in
flight that already hold tokens of the old weights. (With all of the staleness budget's prompts at once,
the tiny model could finish them before the sync on a machine whose trainer is slowed by a neighbour,
and the only requests caught were ones just started, with no token yet: resumed, but not mixed.)
"""

import json

import pytest

from arl_train.config import load_config
from arl_train.run import run

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # a full app run (tiers: conftest.py)


def test_short_async_run_syncs_weights_and_resumes_partial_rollouts(tmp_path):
    config = load_config(
        overrides=[
            "trainer.total_steps=4",
            "actor.ppo_mini_batch_size=4",
            "rollout.n=4",
            "rollout.max_tokens=400",
            "rollout.max_concurrent_per_replica=4",
            "async_training.staleness_threshold=1.0",
            f"output.dir={tmp_path}",
        ]
    )
    lines: list[str] = []
    summary = run(config, log=lines.append)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]

    assert summary.steps == 4 and len(rows) == 4
    # Samples flowed through the queue: every step consumed a full batch produced by the rollout side.
    assert summary.samples_consumed == 16
    assert summary.rollout["produced"] >= 16
    assert all(r["response_length_mean"] > 0 for r in rows)
    # Weight syncs happened, each bumped the version, and the engine serves the last one.
    assert summary.syncs == 4
    assert [r["version"] for r in rows] == [1, 2, 3, 4]
    assert summary.rollout["engine_versions"] == [4]
    # Partial rollout: generations in flight at a sync were aborted and resumed with the new weights.
    assert summary.rollout["resumed_requests"] > 0
    assert any(r["mixed_version_samples"] > 0 for r in rows)
    # After the sync the engine's weights equal the trainer's: readable tensors bit for bit, prepacked
    # ones through identical log probs on a probe sequence.
    assert summary.weights_equal_after_sync and summary.weights_finite
    assert summary.weights_max_abs_diff == 0.0
    assert summary.probe_logprob_max_abs_diff < 1e-4
    # ... and the run says so before writing its final checkpoint (which can still fail, e.g. a full disk)
    assert "arl: engine weights equal to the trainer's at version 4" in lines
    assert (tmp_path / "reward.png").stat().st_size > 0
    assert (tmp_path / "checkpoint" / "model.safetensors").is_file()
    assert (tmp_path / "checkpoint" / "trainer_state.json").is_file()
    # The step metrics of a real run: idle ratio per side in metrics.jsonl, the same rows in TensorBoard.
    assert all(0.0 <= r["trainer_idle_ratio"] <= 1.0 and 0.0 <= r["rollout_idle_ratio"] <= 1.0 for r in rows)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
