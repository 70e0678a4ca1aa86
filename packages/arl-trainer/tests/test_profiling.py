"""`profiled_step`: the profiled block's ops table and Chrome trace (CPU: host ops)."""

import json

import torch

from arl.trainer.profiling import profiled_step


def test_profiled_step_writes_the_ops_table_and_the_trace(tmp_path):
    with profiled_step(tmp_path / "profile", 3):
        torch.mm(torch.ones(64, 64), torch.ones(64, 64))
    assert "aten::mm" in (tmp_path / "profile" / "step_3.txt").read_text()
    trace = json.loads((tmp_path / "profile" / "step_3.json").read_text())
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
