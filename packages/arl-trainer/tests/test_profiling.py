"""`profiled_step`: the profiled block's ops table and Chrome trace (CPU: host ops), and a policy
step's named phases in it."""

import json

import torch
from trainer_helpers import config, random_batch

from arl.trainer import HFPolicy
from arl.trainer.profiling import profiled_step


def test_profiled_step_writes_the_ops_table_and_the_trace(tmp_path):
    with profiled_step(tmp_path / "profile", 3):
        torch.mm(torch.ones(64, 64), torch.ones(64, 64))
    assert "aten::mm" in (tmp_path / "profile" / "step_3.txt").read_text()
    trace = json.loads((tmp_path / "profile" / "step_3.json").read_text())
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])


def test_a_profiled_train_step_shows_its_phases(tiny_model_dir, tmp_path):
    policy = HFPolicy(tiny_model_dir, config())
    batch = random_batch(seed=1)
    with profiled_step(tmp_path / "profile", 1):
        policy.train_step(batch, mini_batch_rows=batch.input_ids.shape[0] // 2)  # two updates
    trace = json.loads((tmp_path / "profile" / "step_1.json").read_text())
    ranges = [e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("arl.")]
    micro_batches = ranges.count("arl.forward")
    assert micro_batches >= 2  # at least one per update (40-token budget: several)
    assert ranges.count("arl.backward") == micro_batches
    assert ranges.count("arl.optimizer_step") == 2
    assert ranges.count("arl.proximal") == 1 and ranges.count("arl.reference") == 1
    forward = [e for e in trace["traceEvents"] if e.get("name") == "arl.forward"][0]
    inside = [
        e
        for e in trace["traceEvents"]
        if e.get("cat") == "cpu_op"
        and e.get("tid") == forward["tid"]
        and forward["ts"] <= e["ts"] <= forward["ts"] + forward["dur"]
    ]
    assert any(e["name"] in ("aten::mm", "aten::addmm", "aten::linear") for e in inside)  # the model's ops
