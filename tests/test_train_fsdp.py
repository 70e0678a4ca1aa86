"""The app with a data-parallel trainer: two FSDP2 ranks (gloo, on the CPU) behind one trainer loop.

`resources.trainer_cpu_ranks=2` starts two trainer actors in one torch.distributed group; rank 0 reads
the queue and syncs the engine, rank 1 follows its collectives (`arl.trainer.group`). The run
must train, consume every sample exactly once (the ledger), leave the engine holding exactly the
trainer's weights after the last sync, and resume from its sharded checkpoint.
"""

import json
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file

from arl_train import ledger
from arl_train.config import load_config
from arl_train.run import run

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # a full app run (tiers: conftest.py)

COMMON = ["rollout.engine=torch", "actor.ppo_mini_batch_size=2", "rollout.n=2", "rollout.max_tokens=8",
          "async_training.staleness_threshold=1.0", "resources.trainer_cpu_ranks=2"]


def _tasks(tmp_path):
    """Prompts scored by `synthetic_hash`: every group has reward variance, so every step updates
    (the digits task's near-zero start often gives a random tiny model no gradient in 3 steps)."""
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Say something {i}.", "reward_fn": "synthetic_hash"}) + "\n"
                            for i in range(64)))
    return f"data.source={path}"


def _consumed_once(out_dirs, expected):
    """The last run's trainer took `expected` samples, each once, each produced by one of the runs
    (a resumed run first trains on the samples its checkpoint had queued)."""
    _, consumed = ledger.read(out_dirs[-1] / "ledger")
    produced = {p["uid"] for d in out_dirs for p in ledger.read(d / "ledger")[0]}
    uids = [c["uid"] for c in consumed]
    assert len(uids) == expected, "every step took exactly its batch, on rank 0 only"
    assert max(Counter(uids).values()) == 1, "a sample was consumed twice"
    assert set(uids) <= produced


def test_two_trainer_ranks_train_sync_and_resume(tmp_path, app_ray_head):
    data, ray = _tasks(tmp_path), f"ray.address={app_ray_head}"
    first = run(load_config(overrides=[*COMMON, data, ray, "trainer.total_steps=3", f"output.dir={tmp_path / 'a'}"]),
                log=lambda _: None)
    assert first.steps == 3 and first.samples_consumed == 6
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["grad_norm"] > 0 for r in rows)
    assert first.rollout["engine_versions"] == [3]
    assert first.weights_equal_after_sync and first.weights_max_abs_diff == 0.0, first.weights_problems
    _consumed_once([tmp_path / "a"], 6)
    checkpoint = tmp_path / "a" / "checkpoint"
    assert (checkpoint / "dcp").is_dir() and (checkpoint / "rng_rank1.pt").is_file()  # sharded, both ranks
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert (state["step"], state["version"], state["samples_seen"]) == (3, 3, 6)
    trained = load_file(checkpoint / "model.safetensors")  # the HF export rank 0 wrote
    initial = load_file(tmp_path / "a" / "model" / "model.safetensors")
    assert any(not torch.equal(trained[k], initial[k].to(trained[k].dtype)) for k in initial)

    second = run(load_config(overrides=[*COMMON, data, ray, "trainer.total_steps=4", f"trainer.resume_from={checkpoint}",
                                        f"output.dir={tmp_path / 'b'}"]), log=lambda _: None)
    rows = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["version"]) for r in rows] == [(4, 4)]
    assert second.samples_consumed == 8 and second.rollout["engine_versions"] == [4]
    assert second.weights_equal_after_sync and second.weights_max_abs_diff == 0.0, second.weights_problems
    _consumed_once([tmp_path / "a", tmp_path / "b"], 2)
    _, consumed_a = ledger.read(tmp_path / "a" / "ledger")
    _, consumed_b = ledger.read(tmp_path / "b" / "ledger")
    assert not {c["uid"] for c in consumed_a} & {c["uid"] for c in consumed_b}  # none trained on twice
    resumed = load_file(tmp_path / "b" / "checkpoint" / "model.safetensors")
    assert any(not torch.equal(resumed[k], trained[k]) for k in trained)  # it trained further
