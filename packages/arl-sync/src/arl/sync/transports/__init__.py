"""Data transports: how the bytes of a bucket go from the sender's buffer to a receiver.

The sender and receiver pipelines (`arl.sync.sender`, `arl.sync.receiver`) are transport-agnostic;
`make_sender_transport` / `make_receiver_transport` pick the implementation named in `SyncConfig.transport`.
"""

from __future__ import annotations

import torch

from ..errors import SyncConfigError
from ..types import SyncConfig
from .base import ReceiverTransport, SenderTransport


def make_sender_transport(
    cfg: SyncConfig, device: torch.device | None, host: str = "127.0.0.1"
) -> SenderTransport:
    """The sender side of `cfg.transport`, with its two bucket buffers allocated; `host` is the address
    the sender's node is reached at (where "tcp" listens, whose interface "nccl" uses)."""
    if cfg.transport == "cpu":
        from .shm import ShmSender

        return ShmSender(cfg)
    if cfg.transport == "tcp":
        from .tcp import TcpSender

        return TcpSender(cfg, host)
    if cfg.transport == "cuda_ipc":
        from .cuda_ipc import IpcSender

        return IpcSender(cfg, device)
    if cfg.transport == "nccl":
        from .nccl import NcclSender

        return NcclSender(cfg, device, host)
    raise SyncConfigError(
        f"unknown transport {cfg.transport!r} (expected 'cpu', 'tcp', 'nccl' or 'cuda_ipc')"
    )


def make_receiver_transport(
    cfg: SyncConfig, device: torch.device, info: bytes, peer: str = ""
) -> ReceiverTransport:
    """The receiver side of `cfg.transport`, set up from the sender's `Welcome.info`; `peer` is the
    sender's host (whose route tells "nccl" which interface to use)."""
    if cfg.transport == "cpu":
        from .shm import ShmReceiver

        return ShmReceiver(cfg, device, info)
    if cfg.transport == "tcp":
        from .tcp import TcpReceiver

        return TcpReceiver(cfg, device, info)
    if cfg.transport == "cuda_ipc":
        from .cuda_ipc import IpcReceiver

        return IpcReceiver(cfg, device, info)
    if cfg.transport == "nccl":
        from .nccl import NcclReceiver

        return NcclReceiver(cfg, device, info, peer)
    raise SyncConfigError(f"unknown transport {cfg.transport!r}")


__all__ = ["ReceiverTransport", "SenderTransport", "make_receiver_transport", "make_sender_transport"]
