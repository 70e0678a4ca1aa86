"""The order of colocated turn-taking around one trainer step (the end-to-end run is in
tests/test_train_colocated.py): sleep only once the whole batch is taken, weights woken before the
transfer (after the trainer's cached GPU memory is released), KV cache woken before generation resumes."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # turn_doubles (--import-mode=importlib)
from turn_doubles import Inner, RolloutHandle  # noqa: E402

from arl_train.colocated import ColocatedControl, ColocatedSource  # noqa: E402


async def test_one_step_sleeps_after_the_batch_and_wakes_around_the_sync():
    log = []
    inner = Inner(log)
    control = ColocatedControl(
        inner,
        RolloutHandle(log),
        sleep_level=1,
        timeout_s=5,
        release_trainer_memory=lambda: log.append(("release_trainer_memory",)),
    )
    source = ColocatedSource(inner, control.sleep, required=5)
    got = await source.get_batch(5)
    assert log == [("get_batch", 5)] and not control.asleep  # 3 of 5: generation goes on
    got += await source.get_batch(2)
    assert len(got) == 5 and log[-1] == ("sleep", 1) and control.asleep
    await control.pause()
    await control.update_weights("tcp://x", b"{}", 1)
    await control.resume(0)
    assert log[-7:] == [
        ("sleep", 1),
        ("pause",),
        ("release_trainer_memory",),
        ("wake_up", ["weights"]),
        ("update_weights", 1),
        ("wake_up", ["kv_cache"]),
        ("resume", 0),
    ]
    assert log[-1] == ("resume", 0) and not control.asleep
    assert set(control.pop_timings()) == {
        "colocated_sleep_s",
        "colocated_wake_weights_s",
        "colocated_wake_kv_s",
    }


async def test_the_trainers_memory_still_on_its_way_out_is_settled_and_released_before_the_kv_cache_wakes():
    """One trainer rank with an overlapped optimizer offload: its copies run beside the weight wake and
    the transfer; the control settles them, then releases the freed memory, then wakes the KV cache."""
    log = []
    inner = Inner(log)

    def settle():
        log.append(("settle_trainer_memory",))
        return 0.25

    control = ColocatedControl(
        inner,
        RolloutHandle(log),
        sleep_level=2,
        timeout_s=5,
        release_trainer_memory=lambda: log.append(("release_trainer_memory",)),
        settle_trainer_memory=settle,
    )
    source = ColocatedSource(inner, control.sleep, required=3)
    await source.get_batch(3)
    await control.pause()
    await control.update_weights("tcp://x", b"{}", 1)
    await control.resume(0)
    assert log[1:] == [
        ("sleep", 2),
        ("pause",),
        ("release_trainer_memory",),
        ("wake_up", ["weights"]),
        ("update_weights", 1),
        ("settle_trainer_memory",),
        ("release_trainer_memory",),
        ("wake_up", ["kv_cache"]),
        ("resume", 0),
    ]
    assert control.pop_timings()["colocated_offload_wait_s"] == 0.25
