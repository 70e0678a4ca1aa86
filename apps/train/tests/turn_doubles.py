"""Recording doubles for the turn-taking wrappers' tests (colocated and time-sliced): the rollout actor
handle and the plain rollout control + sample source underneath, each call appended to one log."""


class _Method:
    """A Ray actor method: `.remote(*args)` logs the call and returns an awaitable."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def remote(self, *args):
        async def call():
            self.log.append((self.name, *args))
            return 0.0

        return call()


class RolloutHandle:
    """The rollout actor's sleep / wake_up / resume_generation, as the wrappers call them."""

    def __init__(self, log):
        self.sleep = _Method(log, "sleep")
        self.wake_up = _Method(log, "wake_up")
        self.resume = _Method(log, "resume_generation")


class Inner:
    """The plain rollout control and sample source the wrappers sit on (at most 3 samples per call)."""

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
        return list(range(min(n, 3)))

    async def size(self):
        return 0
