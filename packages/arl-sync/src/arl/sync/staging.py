"""The receiver's staging buffer: one uint8 tensor laid out exactly like the sender's byte stream.

Bucket k lands at [k*bucket_bytes, ...) with one copy, and the tensors handed to `apply` are views of
it. It is allocated to the sender's size hint at the start of a sync and reused by the next sync
(unless the receiver was told not to reuse it); it grows if the stream outruns the hint.
"""

from __future__ import annotations

import torch


class Staging:
    """A growable byte buffer on one device."""

    def __init__(self, device: torch.device, reuse: bool = True) -> None:
        self.device = device
        self.reuse = reuse
        self.buf = torch.empty(0, dtype=torch.uint8, device=device)

    @property
    def capacity(self) -> int:
        return self.buf.numel()

    def reserve(self, size_hint: int) -> None:
        """Start a sync expected to need `size_hint` bytes (0: unknown)."""
        too_small = self.capacity < size_hint
        wasteful = size_hint > 0 and self.capacity > size_hint + size_hint // 4
        if not self.reuse or too_small or wasteful:
            self.buf = torch.empty(0, dtype=torch.uint8, device=self.device)  # free first
            self.buf = torch.empty(size_hint, dtype=torch.uint8, device=self.device)

    def ensure(self, end: int, filled: int) -> None:
        """Make [0, end) addressable, keeping the first `filled` bytes."""
        if end <= self.capacity:
            return
        new = torch.empty(max(end, self.capacity + self.capacity // 2), dtype=torch.uint8, device=self.device)
        if filled:
            new[:filled].copy_(self.buf[:filled])
        self.buf = new

    def slice(self, lo: int, hi: int) -> torch.Tensor:
        return self.buf[lo:hi]
