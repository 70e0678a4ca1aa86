"""arl-sync: move a trainer's weights into running inference engines at the speed of the link.

sender = WeightSender(SyncConfig(transport="cpu"), num_receivers=1)
stats = sender.send(model.named_parameters(), version=3)        # trainer side
receiver = WeightReceiver(sender.address, SyncConfig(transport="cpu"))
version = receiver.receive(apply=model.load_weights)              # engine side (atomic)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
from .types import SyncConfig, SyncStats, TensorMeta

# The endpoints load torch: loaded on first use, so that `SyncConfig` is read without it.
_LAZY = {"WeightReceiver": "receiver", "WeightSender": "sender"}

if TYPE_CHECKING:
    from .receiver import WeightReceiver
    from .sender import WeightSender

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'arl.sync' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"arl.sync.{module}"), name)
    globals()[name] = value
    return value
