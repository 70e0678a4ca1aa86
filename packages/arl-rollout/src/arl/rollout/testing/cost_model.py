"""The simulator's cost model of an engine replica: `DecodeCost` (calibrated decode tokens/s against
the running batch, prefill tokens/s, max_num_seqs) and `CostModelEngine`, a `SimEngine` whose
generation takes the time such a replica would (a fluid model of continuous batching), on any event
loop clock: on a `VirtualClockLoop` hours of engine time simulate in milliseconds.
"""

from __future__ import annotations

import asyncio
import itertools

import msgspec

from arl.proxy.types import SamplingParams, TokenOutput
from arl.rollout.aio import cancel_and_wait
from arl.rollout.engine import PauseMode

from .engines import SimEngine


class DecodeCost(msgspec.Struct, kw_only=True):
    """What a simulated replica costs: aggregate decode tokens/s as a function of the running batch
    (piecewise linear through `batch_sizes` / `tokens_per_s`, flat beyond the last point), and
    prefill tokens/s (a new request's prompt stalls the whole batch for prompt_len / prefill)."""

    batch_sizes: list[int]
    tokens_per_s: list[float]
    prefill_tokens_per_s: float = 1e9
    # Most sequences decoded at once; more wait in the engine's queue (vLLM's max_num_seqs).
    max_num_seqs: int = 1 << 30

    def rate(self, batch: int) -> float:
        """Aggregate decode tokens/s of `batch` running sequences."""
        xs, ys = self.batch_sizes, self.tokens_per_s
        if batch <= 0:
            return 0.0
        if batch <= xs[0]:
            return ys[0] * batch / xs[0]
        for (x0, y0), (x1, y1) in itertools.pairwise(zip(xs, ys, strict=True)):
            if batch <= x1:
                return y0 + (y1 - y0) * (batch - x0) / (x1 - x0)
        return ys[-1]


class _FluidRequest:
    __slots__ = ("done_tokens", "future", "prefill_left", "prompt_len", "target", "version_marks")

    def __init__(self, prompt_len: int, target: int, future: asyncio.Future[str], version: int) -> None:
        self.prompt_len = prompt_len
        self.target = target
        self.done_tokens = 0.0
        self.prefill_left = 0.0
        self.future = future
        self.version_marks = [(0, version)]  # (token index, weight version from there on)


class CostModelEngine(SimEngine):
    """A `SimEngine` whose generation takes the time a real replica would, on any event loop clock.

    A fluid model of continuous batching: the running sequences share the replica's aggregate rate
    `cost.rate(batch)` equally; a new sequence's prefill stalls the batch. Between two events (an
    arrival, a completion, an abort) nothing changes, so one timer per event suffices: hours of
    virtual engine time simulate in milliseconds on a `VirtualClockLoop`. Tokens are `SimEngine`'s
    scripted ones; each carries the weight version that was loaded when it was produced.
    Weights are loaded by `load_version` (no transfer), as a simulated trainer's publisher calls it.
    """

    def __init__(self, cost: DecodeCost, *, vocab_size: int = 1000, initial_version: int = 0) -> None:
        super().__init__(vocab_size=vocab_size)
        self.cost = cost
        self._version = initial_version
        self._requests: dict[str, _FluidRequest] = {}
        self._waiting: list[str] = []  # beyond max_num_seqs, in arrival order
        self._changed = asyncio.Event()
        self._last = 0.0
        self._loop_task: asyncio.Task[None] | None = None
        self.busy_s = 0.0
        # Share of `cost.rate` the replica gets (< 1 while a trainer runs on its GPU at the same time).
        self.speed = 1.0

    async def start(self) -> None:
        self._last = asyncio.get_running_loop().time()
        self._loop_task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._loop_task)
        self._finish_all("abort")

    def _running_ids(self) -> list[str]:
        return [rid for rid in self._requests if rid not in self._waiting]

    def _advance(self) -> None:
        """Move every running sequence forward to now."""
        now = asyncio.get_running_loop().time()
        dt, self._last = now - self._last, now
        running = self._running_ids()
        if dt <= 0 or not running or not self._running.is_set():
            return
        self.busy_s += dt
        stalled = [r for r in running if self._requests[r].prefill_left > 0]
        if stalled:  # prefill first (the whole batch waits), then decode with what is left of dt
            for rid in stalled:
                req = self._requests[rid]
                use = min(dt, req.prefill_left)
                req.prefill_left -= use
                dt -= use
                if dt <= 0:
                    return
        per_seq = self.cost.rate(len(running)) * self.speed / len(running) * dt
        for rid in running:
            req = self._requests[rid]
            req.done_tokens = min(float(req.target), req.done_tokens + per_seq)

    def _next_event_in(self) -> float | None:
        running = self._running_ids()
        if not running or not self._running.is_set():
            return None
        prefill = sum(self._requests[r].prefill_left for r in running)
        per_seq_rate = self.cost.rate(len(running)) * self.speed / len(running)
        left = min(self._requests[r].target - self._requests[r].done_tokens for r in running)
        return prefill + max(0.0, left) / per_seq_rate

    async def _run(self) -> None:
        while True:
            self._advance()
            for rid in self._running_ids():
                req = self._requests[rid]
                if req.done_tokens >= req.target - 1e-3:
                    self._finish(rid, "length")
            wait = self._next_event_in()
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), wait)
            except TimeoutError:
                pass

    def _finish(self, rid: str, reason: str) -> None:
        req = self._requests.pop(rid)
        if rid in self._waiting:
            self._waiting.remove(rid)
        while self._waiting and len(self._requests) - len(self._waiting) < self.cost.max_num_seqs:
            admitted = self._requests[self._waiting.pop(0)]
            admitted.prefill_left = admitted.prompt_len / self.cost.prefill_tokens_per_s
        if not req.future.done():
            req.future.set_result(reason)
        if not self._requests:
            self._idle.set()

    def _finish_all(self, reason: str) -> None:
        for rid in list(self._requests):
            self._finish(rid, reason)

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams
    ) -> TokenOutput:
        if self._loop_task is None or self._loop_task.done():
            raise RuntimeError("CostModelEngine is not running (call start() first)")
        await self._running.wait()
        self._advance()
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        req = _FluidRequest(len(prompt_ids), sampling_params.max_tokens, future, self._version)
        self._requests[request_id] = req
        if len(self._requests) - len(self._waiting) > self.cost.max_num_seqs:
            self._waiting.append(request_id)
        else:
            req.prefill_left = req.prompt_len / self.cost.prefill_tokens_per_s
        self._idle.clear()
        self._changed.set()
        reason = await future
        produced = req.target if reason == "length" else int(req.done_tokens)
        last = prompt_ids[-1] if prompt_ids else 0
        tokens = [(last + i + 1) % self.vocab_size for i in range(produced)]
        versions: list[int] = []
        marks = req.version_marks + [(produced, -1)]
        for (start, version), (end, _) in itertools.pairwise(marks):
            versions += [version] * max(0, min(end, produced) - start)
        return TokenOutput(
            token_ids=tokens,
            log_probs=[-0.5] * produced,
            stop_reason=reason,  # type: ignore[arg-type]
            weight_versions=versions[:produced],
        )

    def set_speed(self, speed: float) -> None:
        """From now on decode at `speed` × the cost curve (a GPU shared with a trainer at the same time)."""
        if speed <= 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self._advance()
        self.speed = speed
        self._changed.set()

    async def abort_all(self) -> None:
        self._advance()
        self._finish_all("abort")
        self._changed.set()

    async def pause(self, mode: PauseMode) -> None:
        self._advance()
        if mode == "abort":
            await self.abort_all()
        elif mode == "wait":
            await self._idle.wait()
        self._running.clear()
        self._changed.set()

    async def resume(self) -> None:
        self._last = asyncio.get_running_loop().time()
        self._running.set()
        self._changed.set()

    def load_version(self, version: int) -> None:
        """New weights (simulated: only the version changes; the transfer's time is the publisher's)."""
        self._advance()
        self._version = version
        for req in self._requests.values():  # tokens from here on are sampled by the new version
            req.version_marks.append((int(req.done_tokens), version))

    async def load_weights(self, sync_address: str, sync_config_json: bytes, version: int) -> None:
        self.load_version(version)
