"""arl-queue: the sample wire schema, the bounded sample queue, and its persistence.

`import arl.queue` needs only msgspec; Ray is imported lazily by `create_queue_actor` and
`QueueClient` (install the `ray` extra to use them).
"""

from arl.queue.codec import decode_sample, encode_sample
from arl.queue.errors import (
    CorruptSnapshotError,
    DecodeError,
    QueueActorError,
    QueueClosedError,
    QueueError,
    QueueFullError,
    RoutedExpertsError,
    SchemaVersionError,
)
from arl.queue.persistence import SNAPSHOT_FILENAME, read_snapshot, write_snapshot
from arl.queue.queue import MessageQueue
from arl.queue.ray_actor import MessageQueueActor, QueueClient, create_queue_actor
from arl.queue.types import READABLE_SCHEMA_VERSIONS, SCHEMA_VERSION, OverflowPolicy, QueueStats, Response, Sample

__all__ = [
    "READABLE_SCHEMA_VERSIONS",
    "SCHEMA_VERSION",
    "SNAPSHOT_FILENAME",
    "CorruptSnapshotError",
    "DecodeError",
    "MessageQueue",
    "MessageQueueActor",
    "OverflowPolicy",
    "QueueActorError",
    "QueueClient",
    "QueueClosedError",
    "QueueError",
    "QueueFullError",
    "RoutedExpertsError",
    "QueueStats",
    "Response",
    "Sample",
    "SchemaVersionError",
    "create_queue_actor",
    "decode_sample",
    "encode_sample",
    "read_snapshot",
    "write_snapshot",
]
