"""The Ray actor and its client on a real local Ray: concurrent producers and consumer, close, errors."""

from __future__ import annotations

import asyncio
import os

import pytest

from arl.queue import (
    SCHEMA_VERSION,
    MessageQueue,
    QueueClient,
    QueueClosedError,
    QueueFullError,
    SchemaVersionError,
    create_queue_actor,
)

# Set before Ray is imported. Workers share this venv (editable installs), so Ray's `uv run` hook,
# which would zip the working tree and start every worker through `uv run`, is not needed.
for _key, _value in {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
}.items():
    os.environ.setdefault(_key, _value)

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_actor_client_round_trip_with_concurrent_producers_and_consumer(ray_local, tmp_path, sample):
    handle = create_queue_actor(4, name="arl-queue-test", persist_dir=tmp_path)
    client = QueueClient(handle, rpc_timeout=30, poll_interval=0.2)
    n_prod, per = 2, 25
    got = []

    async def produce(p: int) -> None:
        for i in range(per):
            assert await client.put(sample(p * 1000 + i))  # no timeout: polls in 0.2 s chunks

    async def consume() -> None:
        while len(got) < n_prod * per:
            got.extend(await client.get_batch(3, timeout=0.5))

    async with asyncio.TaskGroup() as tg:
        for p in range(n_prod):
            tg.create_task(produce(p))
        tg.create_task(consume())

    assert sorted(s.uid for s in got) == sorted(f"s{p * 1000 + i}" for p in range(n_prod) for i in range(per))
    for p in range(n_prod):
        mine = [s for s in got if int(s.uid[1:]) // 1000 == p]
        assert mine == [sample(p * 1000 + i) for i in range(per)]  # exact content and FIFO per producer

    # Bounded: a full queue makes put time out (False), put_nowait raise the queue's own error.
    for i in range(4):
        await client.put_nowait(sample(100 + i))
    assert await client.size() == 4
    assert await client.put(sample(999), timeout=0.3) is False
    with pytest.raises(QueueFullError):
        await client.put_nowait(sample(999))
    assert (await client.get(timeout=1)).uid == "s100"

    # The actor checks the schema version of what it is given.
    stale = sample(5)
    stale.schema_version = SCHEMA_VERSION + 1
    with pytest.raises(SchemaVersionError):
        await client.put(stale, timeout=1)

    stats = await client.stats()
    assert stats.total_put == n_prod * per + 4 and stats.total_got == n_prod * per + 1
    assert stats.peak_size <= 4 and stats.put_timeouts == 1

    # A consumer waiting with no timeout is woken by close; close snapshots what is left.
    waiter = asyncio.create_task(client.get_batch(10))
    await asyncio.sleep(0.3)
    await client.close()
    assert [s.uid for s in await asyncio.wait_for(waiter, 10)] == ["s101", "s102", "s103"]
    with pytest.raises(QueueClosedError):
        await client.put(sample(7))
    assert await client.get() is None
    assert [s.uid for s in MessageQueue.restore(tmp_path, 4).drain_nowait()] == ["s101", "s102", "s103"]

    # The named actor can be found again.
    assert await QueueClient.from_name("arl-queue-test").size() == 0
    ray.kill(handle)
