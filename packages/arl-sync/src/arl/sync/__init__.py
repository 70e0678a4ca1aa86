"""arl-sync: move a trainer's weights into running inference engines at the speed of the link.

sender = WeightSender(SyncConfig(transport="cpu"), num_receivers=1)
stats = sender.send(model.named_parameters(), version=3)        # trainer side
receiver = WeightReceiver(sender.address, SyncConfig(transport="cpu"))
version = receiver.receive(apply=model.load_weights)              # engine side (atomic)
"""

from .errors import (
    ApplyError,
    ProtocolError,
    ReceiverLostError,
    SenderLostError,
    SyncConfigError,
    SyncError,
    SyncTimeoutError,
    TransferAbortedError,
    TransportError,
)
from .receiver import WeightReceiver
from .sender import WeightSender
from .types import SyncConfig, SyncStats, TensorMeta

__all__ = [
    "ApplyError",
    "ProtocolError",
    "ReceiverLostError",
    "SenderLostError",
    "SyncConfig",
    "SyncConfigError",
    "SyncError",
    "SyncStats",
    "SyncTimeoutError",
    "TensorMeta",
    "TransferAbortedError",
    "TransportError",
    "WeightReceiver",
    "WeightSender",
]
