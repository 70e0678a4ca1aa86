"""A compare whose modes fail keeps going: each failure is recorded with its cause, the report is still
written, and the command exits non-zero. The failures here are real refusals at load (no Ray starts).
`apps/bench report` on folders without a finished run says so (its figures from finished runs are
checked against the compare's own in test_bench_cpu.py)."""

import json
from pathlib import Path

from arl_bench.cli import main
from arl_bench.compare import failure_line, report_from_runs, run_modes
from arl_bench.report import write

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "cpu.toml"


def test_refused_modes_are_recorded_and_the_report_is_written(tmp_path):
    out = tmp_path / "bench"
    logged: list[str] = []
    result = run_modes(
        CONFIG,
        ["trainer.total_steps=2"],
        ["time_sliced", "concurrent"],
        out,
        warmup_steps=1,
        shared_overrides=["resources.trainer_memory_fraction=0.5"],
        concurrent_overrides=["resources.trainer_memory_fraction=1.5"],
        log=logged.append,
    )
    assert result["modes"] == {}
    failed = result["failed_modes"]
    assert set(failed) == {"time_sliced", "concurrent"}
    # time_sliced sleeps its replica, so a memory split is refused for it; concurrent's is out of range.
    assert (
        "resources.trainer_memory_fraction" in failed["time_sliced"] and "concurrent" in failed["time_sliced"]
    )
    assert "resources.trainer_memory_fraction" in failed["concurrent"] and "[0, 1)" in failed["concurrent"]
    assert any(line.startswith("bench: mode concurrent failed") for line in logged)
    json_path, png = write(result, out)
    assert json.loads(json_path.read_text())["failed_modes"] == failed
    assert png.stat().st_size > 0


def test_failure_line_keeps_the_cause_of_a_remote_traceback():
    remote = RuntimeError(
        'ray::TrainerActor.train_step()\n  File "x.py", line 1\n\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB.\n"
    )
    assert (
        failure_line(remote)
        == "RuntimeError: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB."
    )
    assert failure_line(ValueError()) == "ValueError: "


def test_report_from_runs_counts_an_unfinished_run_as_failed(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2  # no run folder at all
    assert "no mode's run folder" in capsys.readouterr().err
    (tmp_path / "concurrent").mkdir()
    # what a run that died in its first step leaves
    (tmp_path / "concurrent" / "metrics.jsonl").write_text("")
    result = report_from_runs(tmp_path, warmup_steps=1)
    assert result["modes"] == {}
    assert "did not finish" in result["failed_modes"]["concurrent"]
    assert main(["report", str(tmp_path), "--warmup-steps", "1"]) == 1
    assert json.loads((tmp_path / "bench.json").read_text())["failed_modes"] == result["failed_modes"]
