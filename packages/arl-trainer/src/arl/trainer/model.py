"""The policy network as the trainer runs it: a transformers causal LM fed packed micro-batches.

`PackedCausalLM` wraps the Hugging Face model (kept intact, so parameter names stay the checkpoint's
names vLLM loads): the decoder runs with varlen attention over one packed row, the hidden states of
the loss positions go through the chunked log-prob/entropy head with the LM head's weight. Both
backends (single device, FSDP2) run this module; under FSDP2 it is the root that owns the embedding,
final norm and LM head, so their weights are unsharded while its forward runs.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import torch
import torch.utils.checkpoint

from arl.trainer.attention import register as register_varlen
from arl.trainer.head import DEFAULT_CHUNK_ELEMENTS, chunked_log_probs
from arl.trainer.packed import PackedMicroBatch

Checkpointing = Literal["none", "selective", "full"]


def decoder_layers(hf_model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks (FSDP units and checkpointing units)."""
    base = getattr(hf_model, hf_model.base_model_prefix)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(
            f"{type(hf_model).__name__}: no `.layers` on its base model; cannot shard or checkpoint it"
        )
    return list(layers)


def apply_activation_checkpointing(hf_model: torch.nn.Module, mode: Checkpointing) -> None:
    """Recompute decoder layers in backward: every layer ("full") or every second one ("selective").

    The layer's `forward` is wrapped in place (non-reentrant checkpoint), so parameter names do not change.
    """
    if mode == "none":
        return
    if mode not in ("selective", "full"):
        raise ValueError(f"activation_checkpointing must be none | selective | full, got {mode!r}")
    every = 1 if mode == "full" else 2
    for i, layer in enumerate(decoder_layers(hf_model)):
        if i % every:
            continue
        inner = layer.forward

        @functools.wraps(inner)
        def forward(*args: Any, __inner=inner, **kwargs: Any) -> Any:
            return torch.utils.checkpoint.checkpoint(__inner, *args, use_reentrant=False, **kwargs)

        layer.forward = forward


def compile_decoder_layers(hf_model: torch.nn.Module) -> None:
    """torch.compile every decoder layer's `forward` in place (after checkpointing wrapped it; names
    unchanged). The method, not the module: hooks registered on the layer (FSDP2's all-gather before
    the forward, its reshard after) stay outside the graph, so the same call serves both backends.
    Dynamic shapes: packed micro-batches differ in length, and each new length must not recompile."""
    for layer in decoder_layers(hf_model):
        layer.forward = torch.compile(layer.forward, dynamic=True)


def reset_rotary_buffers(model: torch.nn.Module, device: torch.device) -> None:
    """Non-persistent buffers (RoPE inverse frequencies) are garbage after `to_empty`: recompute them."""
    for module in model.modules():
        if hasattr(module, "inv_freq") and hasattr(module, "config"):
            fresh = type(module)(module.config)
            for name, buf in fresh.named_buffers(recurse=False):
                setattr(module, name, buf.to(device))
            if hasattr(fresh, "attention_scaling"):
                module.attention_scaling = fresh.attention_scaling


class PackedCausalLM(torch.nn.Module):
    def __init__(
        self,
        hf_model: torch.nn.Module,
        *,
        temperature: float = 1.0,
        chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    ) -> None:
        super().__init__()
        self.hf = hf_model
        self.temperature = temperature
        self.chunk_elements = chunk_elements
        hf_model.config._attn_implementation = register_varlen()

    def forward(self, mb: PackedMicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(log π(target), entropy) per loss token of `mb`, both fp32 (N,)."""
        base = getattr(self.hf, self.hf.base_model_prefix)
        cu = mb.cu_seqlens
        out = base(
            input_ids=mb.input_ids[None],
            position_ids=mb.position_ids[None],
            cu_seq_lens_q=cu,
            cu_seq_lens_k=cu,
            max_length_q=mb.max_seqlen,
            max_length_k=mb.max_seqlen,
            use_cache=False,
        )
        hidden = out.last_hidden_state[0].index_select(0, mb.hidden_index)
        weight = self.hf.get_output_embeddings().weight
        return chunked_log_probs(
            hidden, weight, mb.targets, temperature=self.temperature, chunk_elements=self.chunk_elements
        )
