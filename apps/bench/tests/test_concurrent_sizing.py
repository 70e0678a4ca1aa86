"""`compare --size-concurrent`: concurrent's replica share from the trainer's peak measured in the same
compare's earlier runs and the card's memory (figures of the Qwen3-1.7B runs on an H100, BENCHMARKS.md)."""

import pytest

from arl_bench.compare import ModeResult, concurrent_share_from, replica_share_beside


def result(peak_gib: float, card_gib: float) -> ModeResult:
    return ModeResult(
        mode="time_sliced",
        app_mode="d",
        overrides=[],
        steps_measured=8,
        samples_per_s=1.0,
        tokens_per_s=1.0,
        generated_tokens_per_s=1.0,
        trainer_idle_fraction=0.5,
        rollout_idle_fraction=0.5,
        sync_s_per_step=0.5,
        staleness_mean=0.9,
        train_s_per_step=5.0,
        step_s_mean=14.5,
        response_length_mean=827.0,
        weights_equal_after_sync=True,
        wall_s=268.0,
        output_dir="/runs/x",
        trainer_peak_mem_gib=peak_gib,
        gpu_memory_gib=card_gib,
    )


def test_the_replica_gets_what_the_trainers_peak_and_the_margin_leave():
    # 1.7B trainer peaking at 60.1 GiB: (79.2 - 60.1 - 4) / 79.2 = 0.19 of an H100, rounded down to 0.05.
    assert replica_share_beside(60.1, 79.2) == 0.15
    assert replica_share_beside(60.1, 139.8) == 0.5  # an H200
    assert replica_share_beside(10.0, 139.8) == 0.8  # apps/train's limit for a resident replica
    with pytest.raises(ValueError, match="less than 0.1 of it is left"):
        replica_share_beside(70.0, 79.2)


def test_the_share_comes_from_the_largest_peak_of_the_runs_on_a_gpu():
    assert concurrent_share_from({}) is None
    assert concurrent_share_from({"colocated": result(0.0, 0.0)}) is None  # CPU runs measure no peak
    runs = {"colocated": result(59.4, 79.2), "time_sliced": result(60.1, 79.2)}
    assert concurrent_share_from(runs) == replica_share_beside(60.1, 79.2)
