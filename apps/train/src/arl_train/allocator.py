"""The CUDA caching allocator's setting for the trainer ranks' processes: expandable segments.

PyTorch's default allocator reserves fixed segments (one `cudaMalloc` each) and reuses a freed block only
for requests that fit inside it. A trainer step changes shape all the time (packed micro-batches of
different lengths, the optimizer state coming back from host memory, in colocated mode its cache handed
back to the replicas before every wake), so freed blocks pile up that later requests cannot use.
Expandable segments map physical pages into one growing virtual range instead, so what one phase frees
serves the next (the peers turn them on for their trainers against fragmentation out-of-memory errors:
SkyRL, NeMo-RL). arl leaves them off unless `actor.expandable_segments` asks: on one H200 they made
the colocated 8B step no faster (5.09 vs 5.15 s per step, apps/train/BENCHMARKS.md).

Only the trainer ranks get them: vLLM's sleep mode cannot allocate its pool from expandable segments,
and the replicas are other processes. The trainer never exports its memory by CUDA IPC (a receiver
exports its staging buffer and the trainer writes into it), which the peers turn expandable segments
off around (SkyRL).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# PyTorch reads PYTORCH_ALLOC_CONF first (2.10+) and PYTORCH_CUDA_ALLOC_CONF, the older name, otherwise.
_NAMES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def trainer_allocator_env(
    expandable_segments: bool, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment variables a CUDA trainer rank starts with (before CUDA initialises in it).

    {} when `expandable_segments` is off or the allocator configuration in `environ` (the driver's
    environment, which Ray's workers inherit; default `os.environ`) already names `expandable_segments`:
    the user's choice stands. Otherwise that configuration with `expandable_segments:True` added, under
    the name it was set by (the older name when none was), so its other options are kept."""
    environ = os.environ if environ is None else environ
    if not expandable_segments:
        return {}
    name = next((n for n in _NAMES if environ.get(n)), "PYTORCH_CUDA_ALLOC_CONF")
    conf = environ.get(name, "").strip().strip(",")
    if "expandable_segments" in conf:
        return {}
    return {name: f"{conf},expandable_segments:True" if conf else "expandable_segments:True"}
