"""The `Generator` seam: anything that turns prompt token ids into sampled token ids.

The proxy forwards to a Generator; arl-rollout's server manager is one, so are engine adapters and the
test double `arl.proxy.testing.ScriptedGenerator`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from arl.proxy.types import SamplingParams, TokenOutput


@runtime_checkable
class Generator(Protocol):
    """Generates a continuation of `prompt_ids`.

    `request_id` is stable for a whole agent session (every turn of one trajectory), so a load balancer
    can keep the session on one replica and reuse its prefix cache.

    Cancelling a `generate` call aborts it: the engine must stop decoding that request (the proxy cancels
    the call when the agent disconnects before the reply is delivered, and waits for it to end).
    """

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams
    ) -> TokenOutput: ...
