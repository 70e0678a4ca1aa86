"""Killing an engine replica mid-run: the run completes, the failover is counted, no sample is lost.

Two replicas of the in-tree torch engine (fastest on CPU); at the first step's progress line the
test SIGKILLs replica 1's actor process (its pid is in the driver's "replicas" line). Its in-flight
requests resume on replica 0, later syncs skip it (the sender is told the live receiver count), and
the sample ledger shows every produced sample consumed or still queued, none dropped.
"""

import json
import os
import re
import signal

import pytest

from arl_train import ledger
from arl_train.config import load_config
from arl_train.run import run

pytestmark = pytest.mark.slow


def test_killing_a_replica_mid_run_completes_with_the_failover_counted(tmp_path):
    config = load_config(overrides=[
        "rollout.engine=torch", "rollout.replicas=2", "trainer.total_steps=4",
        "actor.ppo_mini_batch_size=4", "rollout.n=4", "rollout.max_tokens=200",
        "async_training.staleness_threshold=1.0", f"output.dir={tmp_path}",
    ])
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

    assert summary.steps == 4 and summary.samples_consumed == 16
    last = summary.rollout
    assert last["replicas_healthy"] == [0]
    assert last["failovers"] > 0  # requests in flight on the dead replica resumed on the live one
    assert last["dropped_failed"] == 0 and last["dropped_timeout"] == 0 and last["failed_trajectories"] == 0
    assert [r["version"] for r in rows] == [1, 2, 3, 4]  # syncs after the death went on without it
    assert summary.weights_equal_after_sync and last["engine_versions"] == [4]
    produced, consumed = ledger.read(tmp_path / "ledger")
    made = {p["uid"] for p in produced}
    taken = [c["uid"] for c in consumed]
    assert len(taken) == len(set(taken)) == 16 and set(taken) <= made  # no sample lost or taken twice
    assert len(made) == last["produced"]
