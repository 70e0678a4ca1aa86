"""Room on disk for a checkpoint, checked before one is written, and no partial folder left behind.

Both backends write a checkpoint beside the previous one (into `<name>.tmp`, renamed at the end), so
a save needs room for a whole new copy. With fp32 master weights that is large: at 7B, 28 GB of
weights and 56 GB of AdamW moments, more than many nodes' local disks hold (the H200 machine of
BENCHMARKS.md has 64 GiB).
Without a check the write fails part-way with the serializer's error, which names neither the folder
nor the sizes, and leaves tens of GB of partial files for the next run to trip over. Here the save
first compares what it will write with the free space of the folder's file system and raises
`CheckpointError` naming both; a write that still fails removes its partial folder.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from arl.trainer.errors import CheckpointError

#: Room kept beyond the tensors' bytes: file headers, configs, tokenizer files, RNG and LR state.
OVERHEAD_BYTES = 64 << 20


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the tensors at their full (global) shape: a DTensor counts as the whole tensor, and an
    offloaded optimizer tensor (storage freed, shape kept) as what it holds on the host."""
    return sum(t.numel() * t.element_size() for t in tensors)


def checkpoint_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, weight_copies: int = 1) -> int:
    """What a checkpoint of `model` and `optimizer` writes: `weight_copies` copies of the parameters
    (the HF folder; FSDP2 adds its sharded copy) and every tensor of the optimizer's state. Before the
    first step (no state yet) AdamW's two moments per trained parameter are counted, which is what
    every later checkpoint holds: a run can check at its start that its checkpoints will fit."""
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    state_bytes = (
        tensor_bytes(state)
        if state
        else 2 * tensor_bytes(p for group in optimizer.param_groups for p in group["params"])
    )
    return weight_copies * tensor_bytes(model.parameters()) + state_bytes + OVERHEAD_BYTES


def _existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def free_bytes(directory: Path) -> int:
    """Free bytes of the file system `directory` will be on (its nearest existing ancestor's)."""
    return shutil.disk_usage(_existing(directory)).free


def shortfall_bytes(directory: Path, nbytes: int) -> int:
    """How many bytes short the file system of `directory` is of `nbytes` (0: it fits)."""
    return max(0, nbytes - free_bytes(directory))


def space_error(directory: Path, nbytes: int, shortfall: int) -> CheckpointError:
    gib = 2**30
    return CheckpointError(
        f"checkpoint {directory}: it needs ~{nbytes / gib:.1f} GiB (weights and optimizer state, written "
        f"beside any previous checkpoint) and its file system ({_existing(directory)}) is "
        f"{shortfall / gib:.1f} GiB short; free space there or point the output elsewhere"
    )


def require_space(directory: Path, nbytes: int) -> None:
    """Raise `CheckpointError` unless `nbytes` fit on the file system `directory` will be on."""
    shortfall = shortfall_bytes(directory, nbytes)
    if shortfall:
        raise space_error(directory, nbytes, shortfall)


@contextlib.contextmanager
def removed_on_failure(tmp: Path, remove: bool = True) -> Iterator[None]:
    """Inside the block a checkpoint is written to `tmp`; if it raises, `tmp` is removed (when
    `remove`: under FSDP2 only rank 0 removes) and the error propagates."""
    try:
        yield
    except BaseException:
        if remove:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
