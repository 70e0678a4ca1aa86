"""`SimEngine`: a scripted engine for tests (no model, no vLLM).

It implements the `Engine` protocol with deterministic tokens at a configurable pace, so pause, abort,
resume and partial rollout can be exercised exactly; it receives weights through a real arl-sync
receiver and keeps them in `weights`, and `kill()` makes it fail like a crashed replica.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from arl.proxy.types import SamplingParams, TokenOutput
from arl.rollout.engine import PauseMode


class SimEngine:
    """A scripted engine: token i of a request is `(last prompt token + i + 1) % vocab_size`."""

    def __init__(
        self,
        *,
        vocab_size: int = 1000,
        token_delay_s: float = 0.0,
        eos_token_id: int | None = None,
        stall_first_calls: int = 0,
    ) -> None:
        self.vocab_size = vocab_size
        #: The first this many generate calls hang until cancelled (a stalled replica).
        self.stall_first_calls = stall_first_calls
        self.token_delay_s = token_delay_s
        self.eos_token_id = eos_token_id
        self.weights: dict[str, Any] = {}
        self.calls: list[tuple[str, list[int], SamplingParams]] = []
        self._version = 0
        self._running = asyncio.Event()
        self._running.set()
        self._abort = asyncio.Event()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._receiver: Any = None
        self.dead = False

    def kill(self) -> None:
        """Die like a crashed replica: in-flight and later calls raise `EngineDeadError`."""
        self.dead = True
        self._abort.set()

    def _check_dead(self) -> None:
        if self.dead:
            from arl.rollout.errors import EngineDeadError

            raise EngineDeadError("SimEngine was killed")

    @property
    def weight_version(self) -> int:
        return self._version

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.close()

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams
    ) -> TokenOutput:
        self._check_dead()
        self.calls.append((request_id, list(prompt_ids), sampling_params))
        if len(self.calls) <= self.stall_first_calls:
            await asyncio.Event().wait()  # never set: only the caller's timeout (a cancel) ends it
        await self._running.wait()
        self._in_flight += 1
        self._idle.clear()
        tokens: list[int] = []
        reason = "length"
        try:
            last = prompt_ids[-1] if prompt_ids else 0
            for i in range(sampling_params.max_tokens):
                if self._abort.is_set():
                    reason = "abort"
                    break
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                    if self._abort.is_set():
                        reason = "abort"
                        break
                token = (last + i + 1) % self.vocab_size
                tokens.append(token)
                if token in sampling_params.stop_token_ids or token == self.eos_token_id:
                    reason = "stop"
                    break
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
        self._check_dead()
        version = self._version
        return TokenOutput(
            token_ids=tokens,
            log_probs=[-0.5 - 0.01 * (t % 7) for t in tokens],
            stop_reason=reason,  # type: ignore[arg-type]
            weight_versions=[version] * len(tokens),
        )

    async def abort_all(self) -> None:
        self._abort.set()
        await self._idle.wait()
        self._abort.clear()

    async def pause(self, mode: PauseMode) -> None:
        self._check_dead()
        self._running.clear()
        if mode == "abort":
            await self.abort_all()
        elif mode == "wait":
            await self._idle.wait()

    async def resume(self) -> None:
        self._check_dead()
        self._running.set()

    async def load_weights(self, sync_address: str, sync_config_json: bytes, version: int) -> None:
        from arl.sync import SyncConfig, WeightReceiver

        if self._receiver is None:
            self._receiver = WeightReceiver(
                sync_address, msgspec.json.decode(sync_config_json, type=SyncConfig)
            )
        staged: dict[str, Any] = {}

        def apply(named: Any) -> None:
            staged.update({name: t.clone() for name, t in named})

        applied = await asyncio.to_thread(self._receiver.receive, apply=apply)
        self.weights = staged
        self._version = applied
