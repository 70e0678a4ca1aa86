"""arl-queue: the sample wire schema, the bounded sample queue, and its persistence.

`import arl.queue` needs only msgspec; Ray is imported lazily by `create_queue_actor` and
`QueueClient` (install the `ray` extra to use them).
"""

from arl.queue.codec import decode_sample, encode_sample, read_header, to_builtins
from arl.queue.errors import (
    CorruptSnapshotError,
    DecodeError,
    PackedArrayError,
    QueueActorError,
    QueueClosedError,
    QueueError,
    QueueFullError,
    RoutedExpertsError,
    SchemaVersionError,
    SegmentError,
)
from arl.queue.packed import Float32Array, Int32Array, UInt8Array
from arl.queue.persistence import SNAPSHOT_FILENAME, read_snapshot, write_snapshot
from arl.queue.queue import MessageQueue
from arl.queue.ray_actor import MessageQueueActor, QueueClient, create_queue_actor
from arl.queue.segments import TrainingRow, iter_segment_rows, pack_segments, response_from_segments
from arl.queue.types import (
    READABLE_SCHEMA_VERSIONS,
    SCHEMA_VERSION,
    OverflowPolicy,
    PackedSegment,
    QueueStats,
    Response,
    Sample,
    SegmentRow,
)

__all__ = [
    "READABLE_SCHEMA_VERSIONS",
    "SCHEMA_VERSION",
    "SNAPSHOT_FILENAME",
    "CorruptSnapshotError",
    "DecodeError",
    "Float32Array",
    "Int32Array",
    "MessageQueue",
    "MessageQueueActor",
    "OverflowPolicy",
    "PackedArrayError",
    "PackedSegment",
    "QueueActorError",
    "QueueClient",
    "QueueClosedError",
    "QueueError",
    "QueueFullError",
    "QueueStats",
    "Response",
    "RoutedExpertsError",
    "Sample",
    "SchemaVersionError",
    "SegmentError",
    "SegmentRow",
    "TrainingRow",
    "UInt8Array",
    "create_queue_actor",
    "decode_sample",
    "encode_sample",
    "iter_segment_rows",
    "pack_segments",
    "read_header",
    "read_snapshot",
    "response_from_segments",
    "to_builtins",
    "write_snapshot",
]
