"""Killing an engine replica mid-run: the run completes, the failover is counted, no sample is lost.

Two replicas of the in-tree torch engine (fastest on CPU); at the first step's progress line the
test SIGKILLs replica 1's actor process (its pid is in the driver's "replicas" line). Its in-flight
requests resume on replica 0, later syncs skip it (the sender is told the live receiver count), and
the sample ledger shows each consumed sample produced once and taken once, none dropped.
"""

import json
import os
import re
import signal

import pytest

from arl.queue.persistence import read_snapshot
from arl_train import ledger
from arl_train.config import load_config
from arl_train.run import run

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # a full app run (tiers: conftest.py)


def test_killing_a_replica_mid_run_completes_with_the_failover_counted(tmp_path, app_ray_head):
    config = load_config(
        overrides=[
            "rollout.engine=torch",
            "rollout.replicas=2",
            "trainer.total_steps=3",
            "actor.ppo_mini_batch_size=4",
            "rollout.n=4",
            "rollout.max_tokens=200",
            "async_training.staleness_threshold=1.0",
            f"output.dir={tmp_path}",
            f"ray.address={app_ray_head}",
        ]
    )
    pids: list[int] = []
    killed: list[int] = []

    def log(line: str) -> None:
        if line.startswith("arl: trainer"):
            pids.extend(int(p) for p in re.findall(r"'pid': (\d+)", line))
        elif line.startswith("step ") and not killed:  # mid-run: generation goes on while the trainer trains
            os.kill(pids[1], signal.SIGKILL)
            killed.append(pids[1])

    summary = run(config, log=log)
    assert len(pids) == 2 and killed, "the replicas' pids were not logged"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]

    assert summary.steps == 3 and summary.samples_consumed == 12
    last = summary.rollout
    assert last["replicas_healthy"] == [0]
    assert last["failovers"] > 0  # requests in flight on the dead replica resumed on the live one
    assert last["dropped_failed"] == 0 and last["dropped_timeout"] == 0 and last["failed_trajectories"] == 0
    assert [r["version"] for r in rows] == [1, 2, 3]  # syncs after the death went on without it
    assert summary.weights_equal_after_sync and last["engine_versions"] == [3]
    produced, consumed = ledger.read(tmp_path / "ledger")
    made = {p["uid"] for p in produced}
    taken = [c["uid"] for c in consumed]
    assert len(taken) == len(set(taken)) == 12 and set(taken) <= made  # no sample lost or taken twice
    # The rollout side goes on producing until it is stopped: what the trainer did not take is in the
    # final checkpoint's queue snapshot or was produced after it (never a drop: counted above as 0).
    queued = {s.uid for s in read_snapshot(tmp_path / "checkpoint")}
    assert queued <= made and not queued & set(taken) and len(made) >= last["produced"]
    # The step metrics of a real run: idle ratio per side in metrics.jsonl, the same rows in TensorBoard.
    assert all(0.0 <= r["trainer_idle_ratio"] <= 1.0 and 0.0 <= r["rollout_idle_ratio"] <= 1.0 for r in rows)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
