"""Checks that an inference engine holds exactly the trainer's weights after a sync.

vLLM fuses some projections (q/k/v into `qkv_proj`, gate/up into `gate_up_proj`) and may tie
`lm_head` to the embeddings; the expected engine tensor is rebuilt from the trainer's HF tensors.
vLLM's CPU build moves linear weights into prepacked kernels and leaves an empty parameter behind:
those are reported as `prepacked` and must be checked through the engine's outputs instead (the app
compares the engine's log probs with the trainer's on a probe sequence).
"""

from __future__ import annotations

import torch

_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def expected_engine_tensor(name: str, hf: dict[str, torch.Tensor]) -> torch.Tensor | None:
    if name in hf:
        return hf[name]
    for fused, parts in _FUSED.items():
        if f".{fused}." in name:
            pieces = [hf.get(name.replace(fused, p)) for p in parts]
            if all(p is not None for p in pieces):
                return torch.cat(pieces, dim=0)  # type: ignore[arg-type]
    if name == "lm_head.weight":
        return hf.get("model.embed_tokens.weight")
    return None


def compare_weights(trainer: dict[str, torch.Tensor], engine: dict[str, torch.Tensor]) -> dict[str, object]:
    """Max abs difference over every engine tensor, and the names that differ or are unknown."""
    max_diff = 0.0
    mismatched: list[str] = []
    unmatched: list[str] = []
    prepacked: list[str] = []
    for name, tensor in engine.items():
        expected = expected_engine_tensor(name, trainer)
        if tensor.numel() == 0 and expected is not None and expected.numel() > 0:
            prepacked.append(name)
            continue
        if expected is None or expected.shape != tensor.shape:
            unmatched.append(name)
            continue
        diff = (expected.float() - tensor.float()).abs().max().item() if tensor.numel() else 0.0
        max_diff = max(max_diff, diff)
        if diff > 0:
            mismatched.append(name)
    return {
        "equal": not mismatched and not unmatched and len(engine) > len(prepacked),
        "max_abs_diff": max_diff,
        "mismatched": mismatched,
        "unmatched": unmatched,
        "prepacked": prepacked,
        "compared": len(engine) - len(unmatched) - len(prepacked),
    }
