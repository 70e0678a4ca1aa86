"""Sharded checkpoints with torch.distributed.checkpoint, and an HF safetensors export vLLM loads.

`save_sharded` writes model and optimizer state as DCP shards (each rank writes its own), every
rank's RNG state, the LR schedule, and rank 0's trainer state (step, version, scheduler, ...) as JSON. `load_sharded`
reads them back into a policy on any number of ranks (DCP reshards N → M); a rank without a saved RNG
state of its own keeps its seed. `export_hf` gathers full parameters to rank 0 and writes an ordinary
HF folder (config.json + model.safetensors). Works with either backend (`PackedPolicy`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from arl.trainer.engine import PackedPolicy

TRAINER_STATE = "trainer_state.json"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def save_sharded(policy: PackedPolicy, directory: str | Path, trainer_state: dict[str, Any]) -> Path:
    """Every rank calls this; returns the folder."""
    directory = Path(directory)
    if _rank() == 0:
        directory.mkdir(parents=True, exist_ok=True)
    _barrier()
    state = {
        "model": get_model_state_dict(policy.packed),
        "optim": get_optimizer_state_dict(policy.packed, policy.optimizer),
    }
    dcp.save(state, checkpoint_id=str(directory / "dcp"))
    torch.save(_rng_state(), directory / f"rng_rank{_rank()}.pt")
    if _rank() == 0:
        torch.save(policy.scheduler.state_dict(), directory / "scheduler.pt")  # the same on every rank
        (directory / TRAINER_STATE).write_text(json.dumps(trainer_state, indent=2))
    _barrier()
    return directory


def load_sharded(policy: PackedPolicy, directory: str | Path) -> dict[str, Any]:
    """Every rank calls this; restores weights, optimizer, RNG; returns the trainer state."""
    directory = Path(directory)
    if not (directory / "dcp").is_dir():
        raise FileNotFoundError(f"{directory}: no sharded checkpoint (dcp/) here")
    state = {
        "model": get_model_state_dict(policy.packed),
        "optim": get_optimizer_state_dict(policy.packed, policy.optimizer),
    }
    dcp.load(state, checkpoint_id=str(directory / "dcp"))
    set_model_state_dict(policy.packed, state["model"])
    set_optimizer_state_dict(policy.packed, policy.optimizer, state["optim"])
    if (directory / "scheduler.pt").exists():
        from arl.trainer.schedule import load_lr_scheduler_state

        load_lr_scheduler_state(policy.scheduler, torch.load(directory / "scheduler.pt", weights_only=False))
    rng = directory / f"rng_rank{_rank()}.pt"
    if rng.exists():
        saved = torch.load(rng, weights_only=True)
        torch.set_rng_state(saved["cpu"])
        if "cuda" in saved and torch.cuda.is_available():
            torch.cuda.set_rng_state(saved["cuda"])
    return json.loads((directory / TRAINER_STATE).read_text())


def export_hf(policy: PackedPolicy, directory: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Full weights in HF naming as config.json + model.safetensors, written by rank 0 (all ranks call)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    full = get_model_state_dict(
        policy.packed, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if _rank() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        tied = bool(getattr(policy.model.config, "tie_word_embeddings", False))
        out = {}
        for key, t in full.items():
            name = key.removeprefix("hf.")
            if tied and name == "lm_head.weight":
                continue  # tied to the embedding; HF and vLLM re-tie it on load
            out[name] = (t.to(dtype) if dtype is not None else t).contiguous()
        save_file(out, str(directory / "model.safetensors"), metadata={"format": "pt"})
        policy.model.config.save_pretrained(directory)
    _barrier()
    return directory
