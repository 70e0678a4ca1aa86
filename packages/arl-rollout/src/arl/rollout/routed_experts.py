"""MoE routing on the rollout side: reading it off engines and keeping it aligned with the tokens.

arl's convention (what `arl.trainer.router_replay` replays): routed expert row j of a generation is,
for every decoder layer, the top-k experts chosen in the forward step that *sampled* token j, i.e. at
input position `len(prompt) + j - 1`. Rows are `layers x top_k` ints; `[]` marks a token without
engine routing (the trainer routes it). The layer axis is the decoder-layer index (vLLM's layout);
rows of dense layers (and of layers an engine did not report) hold -1.

- vLLM (`enable_return_routed_experts`): `CompletionOutput.routed_experts` is a numpy array
  (rows, layers, top_k) covering input positions `[routed_experts_prompt_start, prompt + n - 1)`;
  `vllm_prompt_start` asks for exactly the n rows arl keeps, `rows_from_vllm` aligns what came back.
- The in-tree engine records its Hugging Face model's routers with `RouteRecorder`.
- `extend_routes` concatenates routing across a partial-rollout resume, in token order.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from arl.rollout.errors import EngineError

Rows = list[list[list[int]]]

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def vllm_prompt_start(prompt_len: int) -> int:
    """`SamplingParams.routed_experts_prompt_start` that makes vLLM return one row per sampled token."""
    return max(prompt_len - 1, 0)


def rows_from_vllm(routed: Any, *, prompt_len: int, num_tokens: int, prompt_start: int) -> Rows | None:
    """Per sampled token, its routing row out of vLLM's array that starts at input position
    `prompt_start`. A token whose row vLLM did not deliver gets `[]` (the trainer routes it)."""
    if routed is None:
        return None
    if getattr(routed, "ndim", 3) != 3:
        raise EngineError(
            f"vLLM routed_experts must be (tokens, layers, top_k), got shape {getattr(routed, 'shape', None)}"
        )
    rows: Rows = []
    as_lists = routed.tolist()
    for j in range(num_tokens):
        i = prompt_len + j - 1 - prompt_start
        rows.append(as_lists[i] if 0 <= i < len(as_lists) else [])
    return rows


def extend_routes(acc: Rows | None, new: Rows | None, *, before: int, added: int) -> Rows | None:
    """Routing of `before` tokens followed by a segment of `added` tokens (a resumed generation).
    A side without routing contributes `[]` rows, so the result stays aligned with the tokens."""
    if acc is None and new is None:
        return None
    head = acc if acc is not None else [[] for _ in range(before)]
    tail = new if new is not None else [[] for _ in range(added)]
    if len(head) != before or len(tail) != added:
        raise EngineError(
            f"routing rows ({len(head)} + {len(tail)}) do not match the tokens ({before} + {added})"
        )
    return head + tail


def hf_routers(model: Any) -> dict[int, Any]:
    """{decoder layer index: MoE router module} of a Hugging Face model (transformers >= 5 routers:
    modules with `top_k`, `num_experts` and `weight`, returning (logits, scores, indices))."""
    routers: dict[int, Any] = {}
    for name, module in model.named_modules():
        if hasattr(module, "top_k") and hasattr(module, "num_experts") and hasattr(module, "weight"):
            match = _LAYER.search(name + ".")
            if match is not None:
                routers[int(match.group(1))] = module
    return routers


class RouteRecorder:
    """Records, per forward of a Hugging Face MoE model, every router's top-k at the last position.

    `with recorder.recording() as rec: model(...)`; then `rec.last_rows()` is, per batch row, the
    `layers x top_k` expert ids of the last input position (the step that samples the next token).
    """

    def __init__(self, model: Any) -> None:
        self.routers = hf_routers(model)
        if not self.routers:
            raise ValueError(f"{type(model).__name__} has no MoE router to record")
        self.num_layers = max(self.routers) + 1
        self.top_k = int(next(iter(self.routers.values())).top_k)
        self._seen: dict[int, Any] = {}

    @contextmanager
    def recording(self) -> Iterator[RouteRecorder]:
        self._seen = {}

        def make_hook(layer: int) -> Any:
            def hook(_module: Any, _args: Any, output: Any) -> None:
                self._seen[layer] = output[2]

            return hook

        handles = [r.register_forward_hook(make_hook(i)) for i, r in self.routers.items()]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def last_rows(self, batch: int) -> Rows:
        """The recorded last-position routing of each of `batch` rows (-1 rows for dense layers)."""
        per_layer: list[list[list[int]] | None] = []
        for layer in range(self.num_layers):
            ids = self._seen.get(layer)
            per_layer.append(None if ids is None else ids.reshape(batch, -1, self.top_k)[:, -1].tolist())
        dense = [-1] * self.top_k
        return [
            [
                (per_layer[layer][b] if per_layer[layer] is not None else dense)  # type: ignore[index]
                for layer in range(self.num_layers)
            ]
            for b in range(batch)
        ]
