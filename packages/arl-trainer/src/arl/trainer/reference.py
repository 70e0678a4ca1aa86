"""The frozen reference policy of KL regularisation (`algorithm.kl_coef > 0`): building and freezing it.

Which weights: the model the run *started* from. By default a backend copies its own initial
weights (before the first update); given `reference_path` it loads that HF folder instead. A resumed
run must pass the ORIGINAL base model there (the app records it as `reference_path` in every
checkpoint's trainer state), never the checkpoint it resumes, or the KL would be measured against
a moving target.

Frozen: eval mode, `requires_grad=False`, no optimizer state, not in checkpoints (it is a folder
that can be loaded again). Its log probs come from the same packed forward and chunked head as the
policy's (`PackedPolicy.reference_log_probs`), replaying the same MoE routes.

dtype (memory): the reference holds its matmul weights in the compute dtype, i.e. exactly the values
the policy's mixed-precision forward multiplies with, so at the first step its log probs equal the
policy's and it costs 2 bytes per weight instead of 4 (+ no gradient, no AdamW state):
- one device (`HFPolicy`, bf16 autocast): `nn.Linear` weights in bf16; embeddings, norms, biases and
  other tensors (e.g. fused MoE expert tensors, whose kernels may not autocast) keep the policy's
  parameter dtype, and the reference runs under the same autocast, so its forward is the policy's
  forward bit for bit. A Qwen2.5-7B reference is 15.2 GiB (vs 28.4 GiB of fp32 policy weights).
- FSDP2 (`FSDPPolicy`, `MixedPrecisionPolicy(param_dtype=bf16)`): every parameter in bf16 (that is
  what FSDP's mixed precision computes with), sharded like the policy: 14 GiB / world size for 7B.
- no mixed precision (CPU, fp32): an exact fp32 copy.
"""

from __future__ import annotations

from pathlib import Path

import torch

from arl.trainer.errors import ReferencePolicyError
from arl.trainer.model import reset_rotary_buffers


def freeze(model: torch.nn.Module) -> torch.nn.Module:
    """Eval mode and no gradients, in place; returns `model`."""
    model.eval()
    model.requires_grad_(False)
    return model


def cast_linear_weights(hf_model: torch.nn.Module, dtype: torch.dtype | None) -> torch.nn.Module:
    """`nn.Linear` weights (not tied to an embedding) to `dtype` in place: what autocast feeds the
    matmuls anyway. Everything else keeps its dtype. `dtype=None`: nothing changes."""
    if dtype is None:
        return hf_model
    embeddings = {id(m.weight) for m in hf_model.modules() if isinstance(m, torch.nn.Embedding)}
    for module in hf_model.modules():
        if isinstance(module, torch.nn.Linear) and id(module.weight) not in embeddings:
            module.weight.data = module.weight.data.to(dtype)
    return hf_model


def check_same_parameters(policy: torch.nn.Module, reference: torch.nn.Module, where: str) -> None:
    """The reference must have the policy's parameters (names and shapes): a KL between models of
    different vocabularies or architectures is meaningless."""
    mine = {n: tuple(p.shape) for n, p in policy.named_parameters()}
    theirs = {n: tuple(p.shape) for n, p in reference.named_parameters()}
    if mine != theirs:
        missing = sorted(set(mine) ^ set(theirs))[:3]
        shapes = [n for n in mine if n in theirs and mine[n] != theirs[n]][:3]
        raise ReferencePolicyError(
            f"reference model {where} does not match the policy: parameters only in one of them {missing}, "
            f"different shapes {[(n, mine[n], theirs[n]) for n in shapes]}"
        )


def copy_of(
    hf_model: torch.nn.Module, *, linear_dtype: torch.dtype | None, device: torch.device
) -> torch.nn.Module:
    """A frozen copy of `hf_model`'s current weights (one device): built on the meta device, so no
    transient second full-precision copy is made; `nn.Linear` weights stored in `linear_dtype`."""
    from transformers import AutoModelForCausalLM

    param_dtype = next(hf_model.parameters()).dtype
    with torch.device("meta"):
        ref = AutoModelForCausalLM.from_config(hf_model.config, dtype=param_dtype)
    cast_linear_weights(ref, linear_dtype)
    ref.to_empty(device=device)
    reset_rotary_buffers(ref, device)
    with torch.no_grad():
        ref.load_state_dict(hf_model.state_dict())  # copy_ casts where the dtypes differ
    ref.tie_weights()
    return freeze(ref)


def load(
    path: str | Path,
    *,
    param_dtype: torch.dtype,
    linear_dtype: torch.dtype | None,
    device: torch.device,
    policy: torch.nn.Module,
) -> torch.nn.Module:
    """A frozen reference from an HF folder (read on the CPU, cast, then moved), checked against `policy`."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ReferencePolicyError(
            f"reference_path {str(path)!r} is not a Hugging Face model folder (no config.json)"
        )
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=param_dtype)
    check_same_parameters(policy, ref, f"at {path}")
    return freeze(cast_linear_weights(ref, linear_dtype).to(device))
