"""A compare whose modes fail keeps going: each failure is recorded with its cause, the report is still
written, and the command exits non-zero. The failures here are real refusals at load (no Ray starts)."""

import json
from pathlib import Path

from arl_bench.compare import failure_line, run_modes
from arl_bench.report import write

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "cpu.toml"


def test_refused_modes_are_recorded_and_the_report_is_written(tmp_path):
    out = tmp_path / "bench"
    logged: list[str] = []
    result = run_modes(CONFIG, ["trainer.total_steps=2"], ["time_sliced", "concurrent"], out, warmup_steps=1,
                       shared_overrides=["resources.trainer_memory_fraction=0.5"],
                       concurrent_overrides=["resources.trainer_memory_fraction=1.5"], log=logged.append)
    assert result["modes"] == {}
    failed = result["failed_modes"]
    assert set(failed) == {"time_sliced", "concurrent"}
    # time_sliced sleeps its replica, so a memory split is refused for it; concurrent's is out of range.
    assert "resources.trainer_memory_fraction" in failed["time_sliced"] and "concurrent" in failed["time_sliced"]
    assert "resources.trainer_memory_fraction" in failed["concurrent"] and "[0, 1)" in failed["concurrent"]
    assert any(line.startswith("bench: mode concurrent failed") for line in logged)
    json_path, png = write(result, out)
    assert json.loads(json_path.read_text())["failed_modes"] == failed
    assert png.stat().st_size > 0


def test_failure_line_keeps_the_cause_of_a_remote_traceback():
    remote = RuntimeError("ray::TrainerActor.train_step()\n  File \"x.py\", line 1\n\n"
                          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB.\n")
    assert failure_line(remote) == "RuntimeError: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB."
    assert failure_line(ValueError()) == "ValueError: "
