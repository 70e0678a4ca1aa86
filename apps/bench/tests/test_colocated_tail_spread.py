"""colocated_tail_spread.py's closed form for a synchronous batch is the simulator's own engine model:
the time it computes equals CostModelEngine's on a virtual clock for the same batch."""

import asyncio
import importlib.util
from pathlib import Path

import pytest

from arl.proxy.types import SamplingParams
from arl.rollout.testing import CostModelEngine, DecodeCost, VirtualClockLoop

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "colocated_tail_spread.py"
_spec = importlib.util.spec_from_file_location("colocated_tail_spread", _PATH)
spread = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(spread)


def test_closed_form_equals_the_simulated_engine():
    cost = DecodeCost(batch_sizes=[1, 8, 32, 64], tokens_per_s=[600.0, 4000.0, 14000.0, 24000.0])
    prompt_lengths = [37, 410, 95, 1200, 655]  # every prompt's n responses share its length
    n = 8

    async def simulated() -> float:
        loop = asyncio.get_running_loop()
        engine = CostModelEngine(cost)  # prefill free (the default rate): decode only, as the closed form
        await engine.start()
        t0 = loop.time()
        await asyncio.gather(
            *(
                engine.generate(f"r{i}-{j}", [1], SamplingParams(max_tokens=length))
                for i, length in enumerate(prompt_lengths)
                for j in range(n)
            )
        )
        elapsed = loop.time() - t0
        await engine.stop()
        return elapsed

    loop = VirtualClockLoop()
    try:
        want = loop.run_until_complete(simulated())
    finally:
        loop.close()
    assert spread.step_generation_s(prompt_lengths, n, cost) == pytest.approx(want, rel=1e-6)
