"""The queue's wire schema 4 (per-token fields as msgpack lists) and the actors of the benchmark's
baseline paths. A module of its own so that Ray workers import these classes by name (msgspec structs
and decoders do not survive cloudpickle's by-value copy of a script's classes)."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import msgspec

# arl-queue's schema 4, as it was before per-token fields were packed.


class V4Routes(msgspec.Struct, kw_only=True, frozen=True):
    data: bytes
    shape: tuple[int, int, int]
    dtype: str = "uint8"


class V4Segment(msgspec.Struct, kw_only=True, array_like=True):
    shared_prefix: int
    prompt_tail: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    weight_versions: list[int]
    routed_experts: V4Routes | None = None


class V4Response(msgspec.Struct, kw_only=True):
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    weight_versions: list[int]
    reward: float
    finish_reason: str = "stop"
    num_turns: int = 1
    rewards: dict[str, float] = msgspec.field(default_factory=dict)
    routed_experts: V4Routes | None = None
    prompt_ids: list[int] | None = None
    next_segments: list[V4Segment] = msgspec.field(default_factory=list)


class V4Sample(msgspec.Struct, kw_only=True):
    uid: str
    prompt_ids: list[int]
    responses: list[V4Response]
    start_version: int
    end_version: int
    task_id: str = ""
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    timings: dict[str, float] = msgspec.field(default_factory=dict)
    schema_version: int = 4


v4_encoder = msgspec.msgpack.Encoder()
v4_decoder = msgspec.msgpack.Decoder(V4Sample)


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


class V4QueueActor(BytesQueueActor):
    """The queue actor as it was with schema 4: decodes each sample on put (its schema check), keeps
    the decoded sample, encodes it again for the consumer."""

    def __init__(self) -> None:
        super().__init__()
        self._samples: collections.deque[V4Sample] = collections.deque()

    async def put(self, data: bytes) -> bool:
        self._samples.append(v4_decoder.decode(data))
        self._event.set()
        return True

    async def get_batch(self, n: int, timeout: float) -> list[bytes]:
        if not self._samples:
            self._event.clear()
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                return []
        return [v4_encoder.encode(self._samples.popleft()) for _ in range(min(n, len(self._samples)))]
