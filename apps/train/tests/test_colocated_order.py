"""The order of colocated turn-taking around one trainer step (the end-to-end run is in
tests/test_train_colocated.py): sleep only once the whole batch is taken, weights woken before the
transfer (after the trainer's cached GPU memory is released), KV cache woken before generation resumes."""

from arl_train.colocated import ColocatedControl, ColocatedSource


class _Method:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def remote(self, *args):
        async def call():
            self.log.append((self.name, *args))
            return 0.0

        return call()


class _RolloutActorHandle:
    def __init__(self, log):
        self.sleep = _Method(log, "sleep")
        self.wake_up = _Method(log, "wake_up")


class _Inner:
    """The plain rollout control and sample source the colocated wrappers sit on."""

    def __init__(self, log):
        self.log = log

    async def pause(self):
        self.log.append(("pause",))

    async def update_weights(self, address, cfg, version):
        self.log.append(("update_weights", version))

    async def resume(self, queued):
        self.log.append(("resume", queued))

    async def get_batch(self, n, timeout=None):
        self.log.append(("get_batch", n))
        return list(range(min(n, 3)))  # at most 3 samples per call

    async def size(self):
        return 0


async def test_one_step_sleeps_after_the_batch_and_wakes_around_the_sync():
    log = []
    inner = _Inner(log)
    control = ColocatedControl(inner, _RolloutActorHandle(log), sleep_level=1, timeout_s=5,
                               release_trainer_memory=lambda: log.append(("release_trainer_memory",)))
    source = ColocatedSource(inner, control, required=5)
    got = await source.get_batch(5)
    assert log == [("get_batch", 5)] and not control.asleep  # 3 of 5: generation goes on
    got += await source.get_batch(2)
    assert len(got) == 5 and log[-1] == ("sleep", 1) and control.asleep
    await control.pause()
    await control.update_weights("tcp://x", b"{}", 1)
    await control.resume(0)
    assert log[-7:] == [("sleep", 1), ("pause",), ("release_trainer_memory",), ("wake_up", ["weights"]), ("update_weights", 1),
                        ("wake_up", ["kv_cache"]), ("resume", 0)]
    assert log[-1] == ("resume", 0) and not control.asleep
    assert set(control.pop_timings()) == {"colocated_sleep_s", "colocated_wake_weights_s", "colocated_wake_kv_s"}


async def test_the_trainers_memory_still_on_its_way_out_is_settled_and_released_before_the_kv_cache_wakes():
    """One trainer rank with an overlapped optimizer offload: its copies run beside the weight wake and
    the transfer; the control settles them, then releases the freed memory, then wakes the KV cache."""
    log = []
    inner = _Inner(log)

    def settle():
        log.append(("settle_trainer_memory",))
        return 0.25

    control = ColocatedControl(inner, _RolloutActorHandle(log), sleep_level=2, timeout_s=5,
                               release_trainer_memory=lambda: log.append(("release_trainer_memory",)),
                               settle_trainer_memory=settle)
    source = ColocatedSource(inner, control, required=3)
    await source.get_batch(3)
    await control.pause()
    await control.update_weights("tcp://x", b"{}", 1)
    await control.resume(0)
    assert log[1:] == [("sleep", 2), ("pause",), ("release_trainer_memory",), ("wake_up", ["weights"]),
                       ("update_weights", 1), ("settle_trainer_memory",), ("release_trainer_memory",),
                       ("wake_up", ["kv_cache"]), ("resume", 0)]
    assert control.pop_timings()["colocated_offload_wait_s"] == 0.25
