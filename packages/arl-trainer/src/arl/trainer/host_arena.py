"""`HostArena`: one host buffer of exactly the bytes a list of tensors needs, page-locked for
asynchronous GPU copies, carved into a view per tensor.

Why not a pinned tensor each (`torch.empty(..., pin_memory=True)`): torch's pinned-memory allocator
rounds every allocation up to the next power of two and keeps the blocks cached. For AdamW's state
that wastes up to half the page-locked memory: a Qwen2.5-7B MLP moment of 259 MiB takes 512 MiB, and
one buffer for everything would round 52 GiB up to 64. Here the buffer is ordinary host memory of the
exact size, registered with the CUDA driver (`cudaHostRegister`) so copies to and from it run at the
pinned rate without staging, and unregistered when the arena is collected.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import torch

from arl.sync.plan import align_up

#: Every tensor starts on a page boundary (DMA-friendly; a few KiB over a state of GiBs).
ALIGN_BYTES = 4096


def _touch_pages(buffer: torch.Tensor) -> None:
    """Fault the buffer's pages in on every intra-op thread (torch's fill is parallel); registering
    untouched memory faults them in one by one inside the driver call, on one thread."""
    buffer.zero_()


def _register(buffer: torch.Tensor) -> None:
    err = int(torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), buffer.numel(), 0))
    if err != 0:
        raise RuntimeError(
            f"cudaHostRegister of {buffer.numel() / 2**30:.1f} GiB of host memory failed "
            f"(cudaError {err}): not enough lockable host memory?"
        )


def _unregister(buffer: torch.Tensor) -> None:
    torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr())  # the buffer is freed after this returns


class HostArena:
    """Host memory for tensors of `specs` ((shape, dtype) each), back to back at `ALIGN_BYTES`
    boundaries; `pinned`: page-locked for the GPU (CUDA only), `touch_first`: its pages faulted in on
    every core before the registration (see `_touch_pages`). `views[i]` is tensor i's place."""

    def __init__(
        self, specs: Sequence[tuple[tuple[int, ...], torch.dtype]], *, pinned: bool, touch_first: bool = True
    ) -> None:
        self.specs = [(tuple(shape), dtype) for shape, dtype in specs]
        sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in self.specs]
        offsets, pos = [], 0
        for size in sizes:
            pos = align_up(pos, ALIGN_BYTES)
            offsets.append(pos)
            pos += size
        self.nbytes = pos
        self.buffer = torch.empty(max(pos, 1), dtype=torch.uint8)
        self.pinned = pinned
        if pinned:
            if touch_first:
                _touch_pages(self.buffer)
            _register(self.buffer)
            weakref.finalize(self, _unregister, self.buffer)
        self.views = [
            self.buffer[o : o + size].view(dtype).view(shape)
            for o, size, (shape, dtype) in zip(offsets, sizes, self.specs, strict=True)
        ]

    def holds(self, specs: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> bool:
        """Whether this arena is laid out for exactly these tensors (then it is reused)."""
        return [(tuple(s), d) for s, d in specs] == self.specs
