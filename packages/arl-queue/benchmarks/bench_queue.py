"""Throughput of the Ray queue actor: samples/s and MB/s for 1k–32k-token samples, msgspec vs cloudpickle.

Both paths move the same samples through a Ray actor on this machine, a producer putting one sample
per call while a consumer takes batches, and both are timed in the same run:
- msgspec: arl's path, `QueueClient` → `MessageQueueActor` (the actor decodes each sample to check its
  schema and re-encodes it on the way out: the real cost);
- cloudpickle: the reference's codec, the sample as Python builtins (dicts of lists, as the reference
  keeps them) `ray.cloudpickle.dumps`-ed by the producer into a minimal bytes FIFO actor and loaded by
  the consumer (the actor does no decoding: a lower bound on that path's cost).

It also reports how far above a trainer's consumption rate the queue sits: `--trainer-rate` samples/s,
default 37.0, the trainer rate apps/train measured on one H200 (tiny model, colocated; apps/train
README). Prints one JSON block; writes it to $OUT/bench_queue.json when $OUT is set.

    uv run python packages/arl-queue/benchmarks/bench_queue.py --tokens 1024 4096 16384 32768 --samples 200
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import msgspec

from arl.queue.codec import encode_sample
from arl.queue.ray_actor import QueueClient, create_queue_actor
from arl.queue.types import Response, Sample


def make_sample(tokens: int, n: int, rng: random.Random, index: int) -> Sample:
    """One prompt (256 tokens) with `n` responses totalling `tokens` response tokens."""
    per = max(1, tokens // n)
    responses = [
        Response(
            response_ids=[rng.randrange(150_000) for _ in range(per)],
            response_mask=[1] * per,
            response_logprobs=[-rng.random() * 5 for _ in range(per)],
            weight_versions=[7] * per,
            reward=float(rng.random() > 0.5),
        )
        for _ in range(n)
    ]
    return Sample(uid=f"s{index}", prompt_ids=[rng.randrange(150_000) for _ in range(256)], responses=responses,
                  start_version=7, end_version=7, task_id=f"t{index}")


class BytesQueueActor:
    """A minimal FIFO of opaque bytes (the cloudpickle path's queue: no decoding in the actor)."""

    def __init__(self) -> None:
        self._items: collections.deque[bytes] = collections.deque()
        self._event = asyncio.Event()

    async def put(self, data: bytes) -> bool:
        self._items.append(data)
        self._event.set()
        return True

    async def get_batch(self, n: int, timeout: float) -> list[bytes]:
        if not self._items:
            self._event.clear()
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                return []
        return [self._items.popleft() for _ in range(min(n, len(self._items)))]


async def _through(put: Any, get_batch: Any, items: list[Any], batch: int) -> float:
    """Seconds to move every item from a producer to a consumer that takes `batch` at a time."""
    got = 0

    async def consume() -> None:
        nonlocal got
        while got < len(items):  # all-or-nothing batches: never ask for more than is left
            got += len(await get_batch(min(batch, len(items) - got)))

    start = time.perf_counter()
    consumer = asyncio.create_task(consume())
    for item in items:
        await put(item)
    await asyncio.wait_for(consumer, 600)
    return time.perf_counter() - start


async def bench_msgspec(samples: list[Sample], batch: int) -> float:
    client = QueueClient(create_queue_actor(max_size=len(samples) + 1))
    await _through(client.put, client.get_batch, samples[:4], batch)  # warm-up: actor start, first calls
    return await _through(client.put, client.get_batch, samples, batch)


async def bench_cloudpickle(samples: list[Sample], batch: int) -> float:
    import ray
    from ray import cloudpickle

    actor = ray.remote(BytesQueueActor).options(max_concurrency=1000, num_cpus=0).remote()
    builtins = [msgspec.to_builtins(s) for s in samples]  # the reference keeps samples as plain dicts

    async def put(item: Any) -> None:
        await actor.put.remote(cloudpickle.dumps(item))

    async def get_batch(n: int) -> list[Any]:
        return [cloudpickle.loads(b) for b in await actor.get_batch.remote(n, 5.0)]

    await _through(put, get_batch, builtins[:4], batch)
    return await _through(put, get_batch, builtins, batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 16384, 32768],
                        help="response tokens per sample (summed over its n responses)")
    parser.add_argument("--n", type=int, default=8, help="responses per sample (the GRPO group)")
    parser.add_argument("--samples", type=int, default=200, help="samples moved per size and codec")
    parser.add_argument("--batch", type=int, default=8, help="samples per consumer get")
    parser.add_argument("--trainer-rate", type=float, default=37.0,
                        help="trainer consumption, samples/s (default: apps/train's H200 figure)")
    args = parser.parse_args()

    # Before Ray is imported: under `uv run` it would otherwise ship the tree and start workers through uv.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rng = random.Random(0)
    rows = []
    try:
        for tokens in args.tokens:
            samples = [make_sample(tokens, args.n, rng, i) for i in range(args.samples)]
            mb = sum(len(encode_sample(s)) for s in samples) / 1e6
            t_msgspec = asyncio.run(bench_msgspec(samples, args.batch))
            t_pickle = asyncio.run(bench_cloudpickle(samples, args.batch))
            row = {
                "tokens_per_sample": tokens,
                "mb_per_sample": round(mb / len(samples), 3),
                "msgspec_samples_per_s": round(len(samples) / t_msgspec, 1),
                "msgspec_mb_per_s": round(mb / t_msgspec, 1),
                "cloudpickle_samples_per_s": round(len(samples) / t_pickle, 1),
                "cloudpickle_mb_per_s": round(mb / t_pickle, 1),
                "msgspec_vs_cloudpickle": round(t_pickle / t_msgspec, 2),
                "msgspec_headroom_over_trainer": round(len(samples) / t_msgspec / args.trainer_rate, 1),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        ray.shutdown()
    result = {"bench": "arl-queue ray actor", "samples": args.samples, "n": args.n, "batch": args.batch,
              "trainer_rate_samples_per_s": args.trainer_rate, "cpus": os.cpu_count(), "rows": rows}
    print(json.dumps(result, indent=1))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_queue.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
