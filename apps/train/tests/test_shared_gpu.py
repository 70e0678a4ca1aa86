"""Shared-GPU schedules (`resources.shared_gpu`, arl_train.shared_gpu): what load_config makes of them,
the settings it refuses by name, and the order of a time-sliced step's calls (the end-to-end runs are in
tests/test_train_colocated.py), and the error a trainer out of memory beside a resident replica gets."""

import sys
from pathlib import Path

import pytest
import torch

from arl_train.actors import engine_config
from arl_train.config import ConfigError, load_config
from arl_train.placement import layout_of
from arl_train.shared_gpu import (
    SharedGpuOutOfMemory,
    TimeSlicedControl,
    TimeSlicedSource,
    concurrent_oom_advice,
    explain_out_of_memory,
)

sys.path.insert(0, str(Path(__file__).parent))  # turn_doubles (--import-mode=importlib)
from turn_doubles import Inner, RolloutHandle  # noqa: E402

GPU = ["resources.trainer_gpus=1", "rollout.device=cuda", "actor.device=cuda"]


@pytest.mark.parametrize("schedule", ["time_sliced", "concurrent"])
def test_a_shared_schedule_is_colocated_and_keeps_the_async_mode(schedule):
    cfg = load_config(
        overrides=[*GPU, f"resources.shared_gpu={schedule}", "rollout.gpu_memory_utilization=0.3"]
    )
    lay = layout_of(cfg)
    assert cfg.resources.colocate and lay.colocate and lay.shared_gpu == schedule
    assert cfg.sync.transport == "cuda_ipc"  # the rank writes into the replica beside it
    at = cfg.async_training  # the default file's mode d stays mode d (colocated alone would make it a)
    assert (at.staleness_threshold, at.trigger_parameter_sync_step, at.partial_rollout) == (0.5, 1, True)
    # Only the time-sliced replica sleeps (vLLM's sleep mode); the concurrent one stays resident.
    assert lay.sleeps == (schedule == "time_sliced")
    assert engine_config(cfg, "/m", 0, 0)[1].enable_sleep_mode == (schedule == "time_sliced")


def test_the_one_gpu_config_runs_concurrent_under_mps_and_names_the_keys_to_take_turns_instead():
    one_gpu = Path(__file__).resolve().parents[1] / "configs" / "gpu_1.toml"
    r = load_config(one_gpu).resources
    assert (r.shared_gpu, r.mps, r.mps_trainer_sm_percent) == ("concurrent", "start", 75)
    with pytest.raises(ConfigError, match=r"resources\.mps=off resources\.mps_trainer_sm_percent=0"):
        load_config(one_gpu, ["resources.shared_gpu=time_sliced"])
    taking_turns = [
        "resources.shared_gpu=time_sliced",
        "resources.mps=off",
        "resources.mps_trainer_sm_percent=0",
    ]
    assert layout_of(load_config(one_gpu, taking_turns)).sleeps


def test_time_sliced_always_resumes_partials_and_mode_b_keeps_its_sync_period():
    c = load_config(overrides=["resources.shared_gpu=time_sliced"], mode="c")
    assert c.async_training.partial_rollout and c.async_training.staleness_threshold == 0.5
    b = load_config(overrides=["resources.shared_gpu=concurrent"], mode="b")
    assert b.async_training.trigger_parameter_sync_step == 2 and not b.async_training.partial_rollout


def test_two_cpu_ranks_each_sync_the_replica_beside_them():
    lay = layout_of(
        load_config(
            overrides=[
                "resources.shared_gpu=time_sliced",
                "resources.trainer_cpu_ranks=2",
                "rollout.replicas=2",
            ]
        )
    )
    assert lay.per_rank_sync and lay.sleeps


@pytest.mark.parametrize(
    "overrides, mode, message",
    [
        (["resources.shared_gpu=time_sliced"], "a", "needs an asynchronous mode"),
        (
            [
                *GPU,
                "resources.shared_gpu=concurrent",
                "resources.trainer_gpus=2",
                "rollout.replicas=1",
                "rollout.gpu_memory_utilization=0.3",
            ],
            None,
            "resources.trainer_gpus = 2: with resources.shared_gpu='concurrent' needs as many trainer GPUs",
        ),
        (
            [*GPU, "resources.shared_gpu=time_sliced", "resources.tensor_parallel_size=2"],
            None,
            "resources.tensor_parallel_size = 2: with resources.shared_gpu='time_sliced'",
        ),
        (
            [*GPU, "resources.shared_gpu=concurrent"],
            None,
            "rollout.gpu_memory_utilization = 0.85: with resources.shared_gpu='concurrent'",
        ),
        (
            [
                *GPU,
                "resources.shared_gpu=concurrent",
                "rollout.gpu_memory_utilization=0.5",
                "resources.trainer_memory_fraction=0.6",
            ],
            None,
            "is more than the whole GPU",
        ),
        (
            [*GPU, "resources.shared_gpu=time_sliced", "resources.trainer_memory_fraction=0.5"],
            None,
            "resources.trainer_memory_fraction = 0.5: splits a GPU",
        ),
        (
            ["resources.shared_gpu=concurrent", "rollout.device=cuda"],
            None,
            "resources.shared_gpu = 'concurrent': puts trainer",
        ),
        (["resources.shared_gpu=sometimes"], None, "shared_gpu"),
        (
            [*GPU, "resources.shared_gpu=time_sliced", "resources.mps=start"],
            None,
            "resources.mps = 'start': is for resources.shared_gpu='concurrent'",
        ),
        (
            ["resources.shared_gpu=concurrent", "resources.mps=start"],
            None,
            "resources.mps = 'start': needs GPUs",
        ),
        (
            [
                *GPU,
                "resources.shared_gpu=concurrent",
                "rollout.gpu_memory_utilization=0.3",
                "resources.mps=start",
                "ray.address=auto",
            ],
            None,
            "resources.mps = 'start': starts the daemon on this machine",
        ),
        (
            [
                *GPU,
                "resources.shared_gpu=concurrent",
                "rollout.gpu_memory_utilization=0.3",
                "resources.mps_trainer_sm_percent=50",
            ],
            None,
            "resources.mps_trainer_sm_percent = 50: caps the trainer's SMs",
        ),
        (
            [
                *GPU,
                "resources.shared_gpu=concurrent",
                "rollout.gpu_memory_utilization=0.3",
                "resources.mps=start",
                "resources.mps_trainer_sm_percent=120",
            ],
            None,
            "resources.mps_trainer_sm_percent = 120: must be in",
        ),
    ],
)
def test_bad_shared_settings_are_refused_at_load_by_name(overrides, mode, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(overrides=overrides, mode=mode)


def _wrappers(log, required=5):
    inner = Inner(log)
    control = TimeSlicedControl(
        inner,
        RolloutHandle(log),
        sleep_level=1,
        timeout_s=5,
        release_trainer_memory=lambda: log.append(("release",)),
    )
    return control, TimeSlicedSource(inner, control, required=required)


async def test_a_synced_step_aborts_at_the_batch_sleeps_then_wakes_around_the_transfer():
    log = []
    control, source = _wrappers(log)
    await source.get_batch(5)
    assert not control.yielded  # 3 of 5: the replica keeps generating
    await source.get_batch(2)
    # The batch is in: in-flight generations aborted (kept for resume), replica asleep, trainer trains.
    assert log[-2:] == [("pause",), ("sleep", 1)] and control.yielded
    await control.pause()
    await control.update_weights("tcp://x", b"{}", 1)
    await control.resume(4)
    await source.end_step()  # synced: nothing left to hand back
    assert log[-6:] == [
        ("release",),
        ("wake_up", ["weights"]),
        ("update_weights", 1),
        ("release",),
        ("wake_up", ["kv_cache"]),
        ("resume", 4),
    ]
    timings = control.pop_timings()
    assert {"shared_pause_s", "shared_sleep_s", "shared_wake_weights_s", "shared_wake_kv_s"} <= timings.keys()
    assert timings["shared_yields_total"] == 1


async def test_a_step_without_a_sync_hands_the_gpu_back_without_rearming_the_budget():
    log = []
    control, source = _wrappers(log, required=3)
    await source.get_batch(3)
    await source.end_step()  # trigger_parameter_sync_step > 1: no sync this step
    assert log[-3:] == [("release",), ("wake_up", None), ("resume_generation", None)]
    assert not control.yielded
    await source.get_batch(3)  # the next step yields again
    assert control.yielded and log[-1] == ("sleep", 1)


async def test_samples_dropped_after_the_yield_give_the_replica_the_gpu_back_until_they_come():
    log = []
    control, source = _wrappers(log, required=3)
    await source.get_batch(3)
    assert control.yielded
    await source.get_batch(1)  # e.g. one sample over max_version_lag was dropped
    assert log[-6:] == [
        ("release",),
        ("wake_up", None),
        ("resume_generation", None),
        ("get_batch", 1),
        ("pause",),
        ("sleep", 1),
    ]
    assert control.yielded and control.yields == 2


def test_out_of_memory_beside_a_resident_replica_names_the_keys_of_the_split():
    cfg = load_config(
        overrides=[
            *GPU,
            "resources.shared_gpu=concurrent",
            "rollout.gpu_memory_utilization=0.35",
            "actor.max_tokens_per_microbatch=16384",
        ]
    )
    torch_message = (
        "CUDA out of memory. Tried to allocate 128.00 MiB. GPU 0 has a total capacity of 79.18 GiB"
    )
    with pytest.raises(SharedGpuOutOfMemory) as caught:
        with explain_out_of_memory(concurrent_oom_advice(cfg)):
            raise torch.OutOfMemoryError(torch_message)
    message = str(caught.value)
    for named in (
        "rollout.gpu_memory_utilization=0.35",
        "actor.max_tokens_per_microbatch (is 16384)",
        "actor.activation_checkpointing",
        "actor.activation_offload",
        "resources.shared_gpu='time_sliced'",
        f"torch: {torch_message}",
    ):
        assert named in message
    assert isinstance(caught.value.__cause__, torch.OutOfMemoryError)
    with pytest.raises(ValueError):  # any other error passes through as it is
        with explain_out_of_memory(concurrent_oom_advice(cfg)):
            raise ValueError("not memory")


@pytest.mark.gpu
def test_a_real_cuda_out_of_memory_becomes_the_shared_gpu_error():
    """What CUDA raises when an allocation does not fit is what `explain_out_of_memory` catches."""
    cfg = load_config(
        overrides=[*GPU, "resources.shared_gpu=concurrent", "rollout.gpu_memory_utilization=0.35"]
    )
    too_big = torch.cuda.get_device_properties(0).total_memory * 2
    with pytest.raises(SharedGpuOutOfMemory, match="rollout.gpu_memory_utilization=0.35") as caught:
        with explain_out_of_memory(concurrent_oom_advice(cfg)):
            torch.empty(too_big, dtype=torch.uint8, device="cuda")
    assert "torch: CUDA out of memory" in str(caught.value)
