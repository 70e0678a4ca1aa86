"""The two interfaces every transport implements, and a bounded wait on a CUDA event."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from ..errors import SyncTimeoutError
from ..plan import Chunk


class SenderTransport(Protocol):
    """Owns the two send buffers (slots) and moves a packed slot to the receivers."""

    #: True when a slot may be reused only after every receiver acknowledged the bucket in it.
    needs_acks: bool

    def welcome_info(self, hello_device: str) -> bytes:
        """What a joining receiver needs to reach the buffers (sent once, in `Welcome`)."""
        ...

    def begin(self, member_ids: Sequence[bytes]) -> dict[bytes, bytes]:
        """Start a sync with these receivers; per-receiver setup to put in `Begin.info`."""
        ...

    def connect(self, timeout_s: float) -> None:
        """After `Begin` went out: finish any collective setup (e.g. NCCL group init)."""
        ...

    def wait_slot(self, slot: int, timeout_s: float, check: Callable[[], None]) -> None:
        """Block until `slot` may be packed again (transport-side; acks are handled by the sender)."""
        ...

    def pack(self, slot: int, chunks: list[Chunk], base: int = 0, stable: bool = False) -> None:
        """Copy (and cast) the chunks into `slot` (`base`: the bucket's first stream byte; chunk byte
        ranges are relative to it). `stable`: this same `chunks` list (same layout, re-pointed sources)
        comes again at later syncs, and its sources outlive this sync; a transport may keep state for it."""
        ...

    def post(self, slot: int, nbytes: int) -> None:
        """Make the first `nbytes` of `slot` available to the receivers (visible or in flight)."""
        ...

    def finish(self, timeout_s: float, check: Callable[[], None]) -> None:
        """Block until every posted bucket left the sender."""
        ...

    def abort(self) -> None:
        """Give the current sync up; the next `begin` starts clean."""
        ...

    def close(self) -> None: ...


class ReceiverTransport(Protocol):
    """Brings a bucket from the sender into a slice of the receiver's staging buffer."""

    needs_acks: bool

    def begin(self, info: bytes, timeout_s: float) -> None:
        """Apply the sender's per-sync setup (`Begin.info`, may be empty)."""
        ...

    def fetch(self, slot: int, nbytes: int, dst: torch.Tensor) -> None:
        """Bring bucket bytes into `dst` (uint8, `nbytes` long); done on return unless the transport is
        asynchronous, in which case `wait` completes it."""
        ...

    def wait(self, timeout_s: float, check: Callable[[], None]) -> None:
        """Block until every fetch issued so far has landed."""
        ...

    def abort(self) -> None: ...

    def close(self) -> None: ...


def wait_event(event: torch.cuda.Event, timeout_s: float, check: Callable[[], None], what: str) -> None:
    """Poll a CUDA event until done; `check` may raise (peer lost); SyncTimeoutError after `timeout_s`."""
    if event.query():
        return
    start = last_check = time.monotonic()
    deadline = start + timeout_s
    nap = 20e-6
    while not event.query():
        now = time.monotonic()
        if now > deadline:
            raise SyncTimeoutError(f"{what}: not done after {timeout_s:.1f}s")
        if now - last_check > 0.05:
            check()
            last_check = now
        time.sleep(nap)
        # Short naps while the wait is short (a same-GPU sync lands in ~10 ms: a 1 ms nap would add up to
        # 10% to it); back off once it is clearly a long wait.
        nap = min(nap * 2, 1e-4 if now - start < 0.1 else 1e-3)
