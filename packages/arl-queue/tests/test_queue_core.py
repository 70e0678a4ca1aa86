"""The asyncio core: bounds, blocking, timeouts, order, batches, close semantics, stats."""

from __future__ import annotations

import asyncio

import pytest

from arl.queue import MessageQueue, QueueClosedError, QueueFullError


async def test_fifo_order_and_stats(sample):
    q = MessageQueue(10)
    for i in range(5):
        assert await q.put(sample(i)) is True
    assert q.size() == len(q) == 5
    got = [await q.get(timeout=0) for _ in range(5)]
    assert [s.uid for s in got] == [f"s{i}" for i in range(5)]
    st = q.stats()
    assert (st.total_put, st.total_got, st.size, st.peak_size, st.max_size) == (5, 5, 0, 5, 10)
    assert st.dropped == 0 and st.put_timeouts == 0 and not st.closed


async def test_invalid_arguments():
    with pytest.raises(ValueError):
        MessageQueue(0)
    with pytest.raises(ValueError):
        MessageQueue(1, overflow="drop_newest")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await MessageQueue(1).get_batch(0)


async def test_put_blocks_when_full_until_space(sample):
    q = MessageQueue(2)
    await q.put(sample(0))
    await q.put(sample(1))
    assert q.full()
    putter = asyncio.create_task(q.put(sample(2)))
    await asyncio.sleep(0.05)
    assert not putter.done(), "put must wait while the queue is full"
    assert q.size() == 2
    assert (await q.get()).uid == "s0"
    assert await asyncio.wait_for(putter, 1) is True
    assert [s.uid for s in await q.get_batch(2, timeout=0)] == ["s1", "s2"]


async def test_put_timeout_returns_false_and_keeps_queue(sample):
    q = MessageQueue(1)
    await q.put(sample(0))
    t0 = asyncio.get_running_loop().time()
    assert await q.put(sample(1), timeout=0.1) is False
    assert asyncio.get_running_loop().time() - t0 >= 0.09
    assert await q.put(sample(2), timeout=0) is False
    assert await q.put(sample(3), timeout=0.05, count_timeout=False) is False
    assert q.size() == 1
    assert (await q.get()).uid == "s0"
    st = q.stats()
    assert st.put_timeouts == 2 and st.dropped == 0 and st.total_put == 1


async def test_put_nowait(sample):
    q = MessageQueue(1)
    q.put_nowait(sample(0))
    with pytest.raises(QueueFullError):
        q.put_nowait(sample(1))
    assert q.get_nowait().uid == "s0"
    assert q.get_nowait() is None


async def test_drop_oldest_policy_counts_drops(sample):
    q = MessageQueue(3, overflow="drop_oldest")
    for i in range(5):
        assert await q.put(sample(i), timeout=0) is True
    q.put_nowait(sample(5))
    assert [s.uid for s in q.drain_nowait()] == ["s3", "s4", "s5"]
    st = q.stats()
    assert st.dropped == 3 and st.total_put == 6 and st.peak_size == 3


async def test_get_timeout_returns_none():
    q = MessageQueue(2)
    t0 = asyncio.get_running_loop().time()
    assert await q.get(timeout=0.1) is None
    assert asyncio.get_running_loop().time() - t0 >= 0.09
    assert await q.get(timeout=0) is None


async def test_get_waits_for_a_put(sample):
    q = MessageQueue(2)
    getter = asyncio.create_task(q.get(timeout=5))
    await asyncio.sleep(0.02)
    assert not getter.done()
    q.put_nowait(sample(7))
    assert (await asyncio.wait_for(getter, 1)).uid == "s7"


async def test_get_batch_waits_for_n_then_returns_in_order(sample):
    q = MessageQueue(10)
    batch_task = asyncio.create_task(q.get_batch(3, timeout=5))
    for i in range(4):
        await asyncio.sleep(0.01)
        await q.put(sample(i))
    batch = await asyncio.wait_for(batch_task, 1)
    assert [s.uid for s in batch] == ["s0", "s1", "s2"]
    assert q.size() == 1


async def test_get_batch_timeout_returns_partial_or_nothing(sample):
    q = MessageQueue(10)
    await q.put(sample(0))
    await q.put(sample(1))
    assert await q.get_batch(3, timeout=0.05, partial=False) == []
    assert q.size() == 2
    assert [s.uid for s in await q.get_batch(3, timeout=0.05)] == ["s0", "s1"]
    assert await q.get_batch(3, timeout=0.01) == []


async def test_get_batch_larger_than_capacity_takes_a_full_queue(sample):
    q = MessageQueue(2)
    await q.put(sample(0))
    await q.put(sample(1))
    assert [s.uid for s in await asyncio.wait_for(q.get_batch(5), 1)] == ["s0", "s1"]


async def test_close_wakes_getters_and_putters(sample):
    q = MessageQueue(1)
    getter = asyncio.create_task(q.get())
    batcher = asyncio.create_task(q.get_batch(2))
    await asyncio.sleep(0.01)
    q.close()
    assert await asyncio.wait_for(getter, 1) is None
    assert await asyncio.wait_for(batcher, 1) == []

    q2 = MessageQueue(1)
    await q2.put(sample(0))
    putter = asyncio.create_task(q2.put(sample(1)))
    await asyncio.sleep(0.01)
    q2.close()
    with pytest.raises(QueueClosedError):
        await asyncio.wait_for(putter, 1)
    assert q2.closed and q2.stats().closed


async def test_after_close_puts_raise_and_gets_drain(sample):
    q = MessageQueue(5)
    for i in range(3):
        await q.put(sample(i))
    q.close()
    q.close()  # idempotent
    with pytest.raises(QueueClosedError):
        await q.put(sample(9))
    with pytest.raises(QueueClosedError):
        q.put_nowait(sample(9))
    assert (await q.get()).uid == "s0"
    assert [s.uid for s in await q.get_batch(5)] == ["s1", "s2"]
    assert await q.get() is None  # closed and drained: returns at once, no timeout needed
    assert await q.get_batch(2) == []


async def test_concurrent_producers_consumers_lose_nothing(sample):
    q = MessageQueue(4)
    n_prod, per = 4, 50
    got: list[str] = []

    async def produce(p: int) -> None:
        for i in range(per):
            assert await q.put(sample(p * 1000 + i), timeout=5)

    async def consume() -> None:
        while (s := await q.get(timeout=5)) is not None:
            got.append(s.uid)

    async with asyncio.TaskGroup() as tg:
        consumers = [tg.create_task(consume()) for _ in range(3)]
        async with asyncio.TaskGroup() as producers:
            for p in range(n_prod):
                producers.create_task(produce(p))
        q.close()
    assert all(c.done() for c in consumers)
    assert sorted(got) == sorted(f"s{p * 1000 + i}" for p in range(n_prod) for i in range(per))
    # Per producer, FIFO order is preserved.
    for p in range(n_prod):
        mine = [int(u[1:]) for u in got if int(u[1:]) // 1000 == p]
        assert mine == sorted(mine)
    st = q.stats()
    assert st.total_put == st.total_got == n_prod * per and st.peak_size <= 4


async def test_cancelled_waiters_leave_no_state(sample):
    q = MessageQueue(1)
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0.01)
    getter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await getter
    await q.put(sample(0))
    putter = asyncio.create_task(q.put(sample(1)))
    await asyncio.sleep(0.01)
    putter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await putter
    assert [s.uid for s in q.drain_nowait()] == ["s0"]
    assert q._not_empty._futures == [] and q._not_full._futures == []
