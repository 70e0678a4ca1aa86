"""GPU memory the trainer hands back to the driver, for a GPU it shares with an inference engine.

PyTorch's caching allocator keeps freed blocks reserved for this process; an engine waking on the same GPU
allocates through its own allocator and would find them taken (measured: a 1.7B-shape colocated run ran
out of memory at wake with the trainer's ~40 GiB step peak still reserved). Colocated and time-sliced
layouts (apps/train) and the ranks of a trainer group (`arl.trainer.group.release_memory_together`) call
this between a training step and the engine's wake-up.
"""

from __future__ import annotations

import torch


def release_cached_gpu_memory() -> None:
    """Hand the trainer's cached CUDA blocks (activations of the step just done) back to the driver.

    A no-op where CUDA was never used."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
