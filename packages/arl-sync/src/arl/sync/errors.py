"""Errors raised by arl-sync. All derive from `SyncError`.

A failed transfer never reaches the receiver's `apply` callback, so a target's weights stay as they
were; both sides raise one of these within `SyncConfig.timeout_s` instead of hanging.
"""


class SyncError(Exception):
    """Base of every error arl-sync raises."""


class SyncConfigError(SyncError, ValueError):
    """A `SyncConfig` field (or a constructor argument) is invalid, or the transport cannot run here."""


class SyncTimeoutError(SyncError, TimeoutError):
    """A peer did not answer within `SyncConfig.timeout_s` (a receiver did not join or acknowledge,
    or the sender stopped sending); the transfer was abandoned."""


class ReceiverLostError(SyncError):
    """A receiver died, disconnected, or reported a failure during a transfer. The sender aborted
    the whole transfer: every receiver keeps its previous weights."""


class TransferAbortedError(SyncError):
    """Raised on a receiver when the sender aborted the transfer (another receiver was lost, the
    sender's tensor iterator raised, or the sender closed); the staged bytes are discarded and the
    apply callback is not called. Raised on the sender when `WeightSender.cancel` stopped a sync."""


class SenderLostError(SyncError):
    """Raised on a receiver when the sender process died or closed mid-transfer."""


class ProtocolError(SyncError):
    """A metadata message arrived out of order or does not match the bytes received (a bug or a
    version mismatch between sender and receiver)."""


class TransportError(SyncError):
    """The data transport failed (shared memory could not be mapped, a CUDA IPC handle could not be
    opened, an NCCL call failed)."""


class ApplyError(SyncError):
    """The receiver's apply callback raised after a complete transfer. The target may hold partly
    applied weights: apply only while the engine is paused."""
