"""An engine replica in its own Ray actor: a generate call the rollout side gives up on (its timeout
cancels the await) is cancelled inside the actor too, so the engine stops decoding it."""

import asyncio

import pytest

from arl.proxy.types import SamplingParams
from arl.rollout.engines.torch_engine import TorchEngineConfig
from arl.rollout.testing import save_random_qwen3
from arl_train.engine_actor import MAX_CONCURRENCY, EngineActor, RemoteEngine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray1(app_ray_head):
    """This process connected to the suite's Ray head (root conftest.py) for the module's tests."""
    import ray

    ray.init(address=app_ray_head, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_a_cancelled_generate_is_cancelled_in_the_replica(ray1, tmp_path):
    model = save_random_qwen3(tmp_path, vocab=128, hidden=32, head_dim=16, max_positions=4096)
    handle = (
        ray1.remote(EngineActor)
        .options(max_concurrency=MAX_CONCURRENCY, num_cpus=0)
        .remote("torch", TorchEngineConfig(model_path=str(model)))
    )

    async def scenario() -> tuple[int, int]:
        engine = RemoteEngine(handle, initial_version=0, rpc_timeout_s=60, start_timeout_s=120)
        await engine.start()
        call = asyncio.create_task(engine.generate("long", [1, 2, 3], SamplingParams(max_tokens=4000)))
        while await handle.in_flight.remote() == 0:
            await asyncio.sleep(0.05)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(call, 0.5)  # as the server manager's generate timeout does
        left = -1
        async with asyncio.timeout(5):  # decoding it to the end would take far longer
            while (left := await handle.in_flight.remote()) != 0:
                await asyncio.sleep(0.05)
        out = await engine.generate("short", [1, 2, 3], SamplingParams(max_tokens=3))
        return left, len(out.token_ids)

    left, served = asyncio.run(scenario())
    assert left == 0  # the replica dropped the abandoned request
    assert served == 3  # and serves the next one
