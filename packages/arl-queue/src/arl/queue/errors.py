"""Errors raised by arl-queue. All derive from `QueueError`."""


class QueueError(Exception):
    """Base of every error arl-queue raises."""


class QueueClosedError(QueueError):
    """A sample was put into a queue that is closed (or was closed while the put waited)."""


class QueueFullError(QueueError):
    """`put_nowait` found the queue full (with the "block" overflow policy)."""


class DecodeError(QueueError, ValueError):
    """Bytes could not be decoded as a `Sample` of the current schema (malformed or wrong shape)."""


class SegmentError(QueueError, ValueError):
    """A trajectory's segments are inconsistent (fields of different lengths, a prefix longer than the
    segment it refers to)."""


class SchemaVersionError(DecodeError):
    """An encoded sample carries a `schema_version` other than the one this code reads."""

    def __init__(self, found: int | None, expected: int, where: str = "") -> None:
        self.found = found
        self.expected = expected
        suffix = f" in {where}" if where else ""
        self.where = where
        super().__init__(
            f"sample schema_version {found!r}{suffix} does not match the supported version {expected}; "
            "producer and consumer must run the same arl-queue schema"
        )

    def __reduce__(self) -> tuple[type, tuple[int | None, int, str]]:
        # Rebuilt from its own arguments, so it survives pickling (e.g. raised inside a Ray actor).
        return (type(self), (self.found, self.expected, self.where))


class CorruptSnapshotError(QueueError):
    """A persisted queue snapshot could not be read back (truncated, bit-flipped or not a snapshot)."""

    def __init__(self, path: object, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"corrupt queue snapshot {path}: {reason}")

    def __reduce__(self) -> tuple[type, tuple[object, str]]:
        # Rebuilt from its own arguments, so it survives pickling (e.g. raised inside a Ray actor).
        return (type(self), (self.path, self.reason))


class QueueActorError(QueueError):
    """The queue's Ray actor did not answer in time or could not be reached."""


class RoutedExpertsError(QueueError, ValueError):
    """MoE routing rows could not be packed or unpacked (ragged rows, ids out of range, size mismatch)."""


class PackedArrayError(QueueError, ValueError):
    """A per-token array (token ids, log probs, mask, weight versions) cannot be packed or read back: an
    item outside its type (a token id beyond int32, a mask of -1), bytes that are not a whole number of
    items, a mask item other than 0/1, or a length that disagrees with its response's other fields."""
