"""Optional activation offload (`activation_offload = true`): what autograd saves for backward
during a training forward is kept in pinned host memory until backward needs it.

It trades PCIe time for GPU memory: every saved activation crosses PCIe twice (device → host in the
forward, host → device in the backward, ~25–50 GB/s each way), on the compute stream, so a step gets
slower by roughly (saved bytes × 2) / PCIe bandwidth; in exchange the activations of a micro-batch
no longer occupy GPU memory between its forward and its backward, which allows longer packed
micro-batches (`max_tokens_per_microbatch`) or a larger model per GPU. Host memory must hold one
micro-batch's saved tensors (pinned).

With activation checkpointing: inside a checkpointed decoder layer nothing is saved (torch's
non-reentrant checkpoint keeps its own hooks there and recomputes in backward); what remains saved
is each checkpointed layer's *inputs* (the residual stream), and those are offloaded. So "full"
checkpointing + offload leaves almost no activation memory on the GPU; "selective" offloads the
non-checkpointed layers' activations and the checkpointed layers' inputs.

Modelled on `torch.autograd.graph.save_on_cpu(pin_memory=True)` (same pinned, non-blocking copies),
with two differences that matter for an LLM trainer: parameters, and a parameter's direct cast or
view (autocast's bf16 weight copies, FSDP2's unsharded parameters) stay where they are — they are
weights, resident anyway; copying them out would spend PCIe per micro-batch and, on the way back, put
a second copy on the GPU (the LM head alone is GBs) — and a tensor saved by several ops (RoPE
cos/sin, given to every layer) crosses once. On a device that is not CUDA the backends do not install
it (a no-op; the hooks themselves also work on the CPU, which is how they are tested).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

_WEIGHT_DERIVED = frozenset(
    {
        "ToCopyBackward0",
        "TBackward0",
        "ViewBackward0",
        "TransposeBackward0",
        "PermuteBackward0",
        "AliasBackward0",
    }
)


def _is_weight(t: torch.Tensor) -> bool:
    """A parameter (leaf with grad), or one op away from one (a cast or view of it)."""
    if t.is_leaf:
        return t.requires_grad
    fn = t.grad_fn
    if fn is None or type(fn).__name__ not in _WEIGHT_DERIVED:
        return False
    nexts = [f for f, _ in fn.next_functions if f is not None]
    return bool(nexts) and all(type(f).__name__ == "AccumulateGrad" for f in nexts)


class HostActivationOffload(torch.autograd.graph.saved_tensors_hooks):
    """Saved tensors of the forward run under this context go to host memory (pinned when
    `pin_memory`), and come back to their device when backward unpacks them.

    `offloaded` / `offloaded_bytes` count what crossed (deduplicated), `kept` what stayed (weights).
    """

    def __init__(self, *, pin_memory: bool = True) -> None:
        self.pin_memory = pin_memory
        self.offloaded = 0
        self.offloaded_bytes = 0
        self.kept = 0
        # id(tensor) -> (weak reference, packed): a tensor saved again in this forward crosses once.
        self._seen: dict[int, tuple[weakref.ref[torch.Tensor], tuple[torch.device, torch.Tensor]]] = {}
        super().__init__(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor) -> Any:
        if _is_weight(t) or t.is_sparse:
            self.kept += 1
            return t
        hit = self._seen.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        pinned = self.pin_memory and t.device.type == "cuda"
        host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=pinned)
        host.copy_(t, non_blocking=pinned)  # same stream as the kernels that reuse t's memory: ordered
        packed = (t.device, host)
        try:
            self._seen[id(t)] = (weakref.ref(t), packed)
        except TypeError:  # a tensor subclass without weak references: no dedup for it
            pass
        self.offloaded += 1
        self.offloaded_bytes += t.numel() * t.element_size()
        return packed

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        device, host = packed
        return host.to(device, non_blocking=self.pin_memory)

    def __enter__(self) -> HostActivationOffload:
        super().__enter__()
        return self

    def __exit__(self, *args: object) -> None:
        super().__exit__(*args)
        self._seen.clear()  # the autograd graph holds what it needs; drop the dedup table
