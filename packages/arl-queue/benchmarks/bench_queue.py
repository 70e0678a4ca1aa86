"""Throughput of the Ray queue actor: samples/s and MB/s for 1k–32k-token samples, msgspec vs cloudpickle.

Three paths move the same samples through a Ray actor on this machine, a producer putting one sample
per call while a consumer takes batches, all timed in the same run:
- msgspec: arl's path, `QueueClient` → `MessageQueueActor`: schema 5 (per-token fields as packed
  int32/float32/uint8 bytes); the actor reads only the header and keeps the bytes, the consumer decodes;
- msgspec_v4: the path as it was before schema 5, kept as a baseline: schema-4 structs (per-token
  fields as msgpack lists) through an actor that decodes each sample to check it and re-encodes it on
  the way out, the consumer decoding again;
- cloudpickle: the reference's codec, the sample as Python builtins (dicts of lists, as the reference
  keeps them) `ray.cloudpickle.dumps`-ed by the producer into a minimal bytes FIFO actor and loaded by
  the consumer (the actor does no decoding: a lower bound on that path's cost).
The two baselines are driven by direct actor calls; arl's path goes through `QueueClient` (its
timeouts included). MB/s counts each path's own bytes on the wire.

Per size it also times each codec alone in this process (ms per sample: encode, decode, and for schema
5 the producer's cost of packing a sample built from lists), and reports how far above a trainer's
consumption rate the queue sits: `--trainer-rate` samples/s, default 37.0, the trainer rate apps/train
measured on one H200 (tiny model, colocated; apps/train/BENCHMARKS.md). Prints one JSON block; writes it to
$OUT/bench_queue.json when $OUT is set.

    uv run python packages/arl-queue/benchmarks/bench_queue.py --tokens 1024 4096 16384 32768 --samples 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from _schema_v4 import BytesQueueActor, V4QueueActor, V4Sample, v4_decoder, v4_encoder

from arl.queue.codec import decode_sample, encode_sample, to_builtins
from arl.queue.ray_actor import QueueClient, create_queue_actor
from arl.queue.types import Response, Sample


def v4_of(sample: Sample) -> V4Sample:
    """The same sample as schema 4 held it (lists); its log probs are the float32 values of `sample`."""
    raw = to_builtins(sample)
    raw["schema_version"] = 4
    return msgspec.convert(raw, V4Sample)


# ----- the samples -----


def make_lists(tokens: int, n: int, rng: random.Random) -> tuple[list[int], list[dict[str, Any]]]:
    """One prompt (256 tokens) and `n` responses' per-token lists totalling `tokens` response tokens, as an
    engine hands them over."""
    per = max(1, tokens // n)
    prompt = [rng.randrange(150_000) for _ in range(256)]
    responses = [
        {
            "response_ids": [rng.randrange(150_000) for _ in range(per)],
            "response_mask": [1] * per,
            "response_logprobs": [-rng.random() * 5 for _ in range(per)],
            "weight_versions": [7] * per,
            "reward": float(rng.random() > 0.5),
        }
        for _ in range(n)
    ]
    return prompt, responses


def build_sample(prompt: list[int], responses: list[dict[str, Any]], index: int) -> Sample:
    """A schema-5 `Sample` from lists (what the rollouter does; packs every per-token field)."""
    return Sample(
        uid=f"s{index}",
        prompt_ids=prompt,
        responses=[Response(**r) for r in responses],
        start_version=7,
        end_version=7,
        task_id=f"t{index}",
    )


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


async def _bench_bytes_actor(
    actor_cls: type,
    items: list[Any],
    batch: int,
    dumps: Callable[[Any], bytes],
    loads: Callable[[bytes], Any],
) -> float:
    import ray

    actor = ray.remote(actor_cls).options(max_concurrency=1000, num_cpus=0).remote()

    async def put(item: Any) -> None:
        await actor.put.remote(dumps(item))

    async def get_batch(n: int) -> list[Any]:
        return [loads(b) for b in await actor.get_batch.remote(n, 5.0)]

    await _through(put, get_batch, items[:4], batch)
    seconds = await _through(put, get_batch, items, batch)
    ray.kill(actor)
    return seconds


def _per_sample_ms(fn: Callable[[Any], Any], items: list[Any]) -> float:
    start = time.perf_counter()
    for item in items:
        fn(item)
    return round((time.perf_counter() - start) / len(items) * 1e3, 3)


def codec_costs(
    lists: list[tuple[list[int], list[dict[str, Any]]]],
    samples: list[Sample],
    v4: list[V4Sample],
    plain: list[dict[str, Any]],
) -> dict[str, float]:
    """ms per sample of each codec alone, in this process (no Ray, no actor)."""
    from ray import cloudpickle

    data = [encode_sample(s) for s in samples]
    data4 = [v4_encoder.encode(s) for s in v4]
    pickled = [cloudpickle.dumps(p) for p in plain]
    return {
        "msgspec_pack_from_lists_ms": _per_sample_ms(lambda x: build_sample(x[0], x[1], 0), lists),
        "msgspec_encode_ms": _per_sample_ms(encode_sample, samples),
        "msgspec_decode_ms": _per_sample_ms(decode_sample, data),
        "msgspec_v4_encode_ms": _per_sample_ms(v4_encoder.encode, v4),
        "msgspec_v4_decode_ms": _per_sample_ms(v4_decoder.decode, data4),
        "cloudpickle_dumps_ms": _per_sample_ms(cloudpickle.dumps, plain),
        "cloudpickle_loads_ms": _per_sample_ms(pickle.loads, pickled),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        default=[1024, 4096, 16384, 32768],
        help="response tokens per sample (summed over its n responses)",
    )
    parser.add_argument("--n", type=int, default=8, help="responses per sample (the GRPO group)")
    parser.add_argument("--samples", type=int, default=200, help="samples moved per size and codec")
    parser.add_argument("--batch", type=int, default=8, help="samples per consumer get")
    parser.add_argument(
        "--trainer-rate",
        type=float,
        default=37.0,
        help="trainer consumption, samples/s (default: apps/train's H200 figure)",
    )
    args = parser.parse_args()

    # Before Ray is imported: under `uv run` it would otherwise ship the tree and start workers through uv.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    # Workers import the baseline's actors and schema-4 structs from this folder (`_schema_v4`).
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    import ray
    from ray import cloudpickle

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rng = random.Random(0)
    rows = []
    try:
        for tokens in args.tokens:
            lists = [make_lists(tokens, args.n, rng) for _ in range(args.samples)]
            samples = [build_sample(p, r, i) for i, (p, r) in enumerate(lists)]
            v4 = [v4_of(s) for s in samples]
            plain = [to_builtins(s) for s in samples]  # the reference keeps samples as plain dicts
            mb = sum(len(encode_sample(s)) for s in samples) / 1e6
            mb4 = sum(len(v4_encoder.encode(s)) for s in v4) / 1e6
            mbp = sum(len(cloudpickle.dumps(p)) for p in plain) / 1e6
            k = min(len(samples), 20)
            costs = codec_costs(lists[:k], samples[:k], v4[:k], plain[:k])
            t_new = asyncio.run(bench_msgspec(samples, args.batch))
            t_v4 = asyncio.run(
                _bench_bytes_actor(V4QueueActor, v4, args.batch, v4_encoder.encode, v4_decoder.decode)
            )
            t_pickle = asyncio.run(
                _bench_bytes_actor(BytesQueueActor, plain, args.batch, cloudpickle.dumps, cloudpickle.loads)
            )
            n = len(samples)
            row = {
                "tokens_per_sample": tokens,
                "mb_per_sample": {
                    "msgspec": round(mb / n, 3),
                    "msgspec_v4": round(mb4 / n, 3),
                    "cloudpickle": round(mbp / n, 3),
                },
                "msgspec_samples_per_s": round(n / t_new, 1),
                "msgspec_mb_per_s": round(mb / t_new, 1),
                "msgspec_v4_samples_per_s": round(n / t_v4, 1),
                "msgspec_v4_mb_per_s": round(mb4 / t_v4, 1),
                "cloudpickle_samples_per_s": round(n / t_pickle, 1),
                "cloudpickle_mb_per_s": round(mbp / t_pickle, 1),
                "msgspec_vs_cloudpickle": round(t_pickle / t_new, 2),
                "msgspec_vs_msgspec_v4": round(t_v4 / t_new, 2),
                "msgspec_headroom_over_trainer": round(n / t_new / args.trainer_rate, 1),
                "codec_ms_per_sample": costs,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            del lists, samples, v4, plain
    finally:
        ray.shutdown()
    result = {
        "bench": "arl-queue ray actor",
        "samples": args.samples,
        "n": args.n,
        "batch": args.batch,
        "trainer_rate_samples_per_s": args.trainer_rate,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "rows": rows,
    }
    print(json.dumps(result, indent=1))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_queue.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
