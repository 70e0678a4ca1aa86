"""A replica that dies mid-request: its requests resume on a live one with the tokens sampled so far."""

import asyncio

import pytest

from arl.proxy.types import SamplingParams
from arl.rollout import LoadBalancer, ServerManager
from arl.rollout.errors import NoHealthyReplicaError
from arl.rollout.testing import SimEngine


def test_balancer_leaves_out_an_unhealthy_replica_and_moves_its_sticky_trajectories():
    lb = LoadBalancer(2)
    assert lb.acquire("a") == 0
    lb.release(0)
    assert lb.mark_unhealthy(0) and not lb.mark_unhealthy(0)
    assert lb.acquire("a") == 1  # sticky to a dead replica: moved
    assert lb.acquire("b") == 1
    assert lb.healthy == [1]
    lb.mark_unhealthy(1)
    with pytest.raises(NoHealthyReplicaError, match="all 2"):
        lb.acquire("c")


def test_in_flight_requests_fail_over_with_their_tokens_and_syncs_skip_the_dead_replica():
    async def main() -> None:
        engines = [SimEngine(token_delay_s=0.01), SimEngine(token_delay_s=0.01)]
        manager = ServerManager(engines)
        params = SamplingParams(max_tokens=40)
        calls = [asyncio.create_task(manager.generate(f"r{i}", [i * 100], params)) for i in range(4)]
        await asyncio.sleep(0.1)  # every request is mid-generation on one of the two replicas
        await manager.pause("abort")  # a sync: each request keeps what it sampled and resumes after
        await manager.resume()
        await asyncio.sleep(0.05)
        engines[0].kill()
        outs = await asyncio.gather(*calls)
        for i, out in enumerate(outs):  # one uninterrupted completion each, as if nothing happened
            assert out.token_ids == [(i * 100 + k + 1) % 1000 for k in range(40)]
            assert out.stop_reason == "length"
        assert manager.failovers == 2  # the two requests replica 0 held
        assert manager.healthy_replicas == [1] and manager.lost_replicas == [0]
        moved = [c for c in engines[1].calls if c[0].startswith(("r0-", "r2-"))]
        # Resubmitted with the prefix sampled before the sync (what the dead call sampled is lost).
        assert len(moved) == 2 and all(len(c[1]) > 1 for c in moved)
        await manager.pause("abort")  # a sync skips the dead replica instead of failing on it
        await manager.resume()
        assert manager.weight_versions == [0]
        engines[1].kill()
        with pytest.raises(NoHealthyReplicaError):
            await manager.generate("late", [1], params)

    asyncio.run(main())


def test_each_replica_can_load_from_its_own_sender():
    """One sender address per replica (colocated trainer ranks each feed the replica on their GPU):
    replica i loads what sender i sent; a list of the wrong length is refused by name."""
    import msgspec
    import torch

    from arl.sync import SyncConfig, WeightSender

    async def main() -> None:
        config = SyncConfig(transport="cpu", timeout_s=30)
        engines = [SimEngine(), SimEngine()]
        manager = ServerManager(engines)
        senders = [WeightSender(config, num_receivers=1) for _ in engines]
        try:
            weights = [[("w", torch.full((4,), float(i)))] for i in range(2)]
            sends = [asyncio.to_thread(s.send, w, 1) for s, w in zip(senders, weights)]
            load = manager.load_weights([s.address for s in senders], msgspec.json.encode(config), 1)
            await asyncio.gather(load, *sends)
            assert [e.weights["w"].tolist() for e in engines] == [[0.0] * 4, [1.0] * 4]
            assert manager.weight_versions == [1, 1]
            assert manager.sync_sources == [s.address for s in senders]
            with pytest.raises(ValueError, match="3 sender addresses for 2 replicas"):
                await manager.load_weights(["a", "b", "c"], msgspec.json.encode(config), 2)
        finally:
            for s in senders:
                s.close()

    asyncio.run(main())
