"""The engine seam: a `Generator` that can also be paused, aborted and given new weights.

Implemented by `engines.vllm_engine.VllmEngine` (vLLM's AsyncLLM), `engines.torch_engine.TorchEngine`
(in-tree, transformers on any torch device) and `testing.SimEngine` (a scripted double for tests).
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from arl.proxy.types import SamplingParams, TokenOutput

PauseMode = Literal["abort", "wait", "keep"]


@runtime_checkable
class Engine(Protocol):
    """One inference-engine replica.

    `pause("abort")` ends every in-flight request at once with `stop_reason="abort"` and its partial
    tokens; the server manager resubmits them after `resume()`. `load_weights` joins an arl-sync
    sender at `sync_address` and applies the transfer atomically (old weights stay on failure).
    """

    @property
    def weight_version(self) -> int: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams
    ) -> TokenOutput: ...

    async def abort_all(self) -> None: ...

    async def pause(self, mode: PauseMode) -> None: ...

    async def resume(self) -> None: ...

    async def load_weights(self, sync_address: str, sync_config_json: bytes, version: int) -> None: ...
