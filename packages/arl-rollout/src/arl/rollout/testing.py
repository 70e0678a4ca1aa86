"""Test doubles for arl-rollout that ship with the package (no vLLM needed).

`SimEngine` implements the `Engine` protocol with deterministic tokens at a configurable pace, so
pause/abort/resume and partial rollout can be exercised exactly; it receives weights through a real
arl-sync receiver and keeps them in `weights`. `TokenAgentLoop` needs no tokenizer.
`save_random_qwen3` and `hf_logprobs` build a small random model and give reference log probs, for
checking engines exactly.

For simulation at scale (apps/bench): `VirtualClockLoop` runs asyncio on virtual time,
`virtual_time` points modules' clocks at it, and `CostModelEngine` is a SimEngine whose generation
takes the time a calibrated replica would (`DecodeCost`: decode tokens/s vs batch, prefill).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import types
from collections.abc import Iterator
from typing import Any

import msgspec
from arl.proxy.types import SamplingParams, TokenOutput
from arl.rollout.aio import cancel_and_wait
from arl.rollout.engine import PauseMode


class SimEngine:
    """A scripted engine: token i of a request is `(last prompt token + i + 1) % vocab_size`."""

    def __init__(self, *, vocab_size: int = 1000, token_delay_s: float = 0.0, eos_token_id: int | None = None,
                 stall_first_calls: int = 0) -> None:
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

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams) -> TokenOutput:
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
            self._receiver = WeightReceiver(sync_address, msgspec.json.decode(sync_config_json, type=SyncConfig))
        staged: dict[str, Any] = {}

        def apply(named: Any) -> None:
            staged.update({name: t.clone() for name, t in named})

        applied = await asyncio.to_thread(self._receiver.receive, apply=apply)
        self.weights = staged
        self._version = applied


class TokenAgentLoop:
    """An agent loop without a tokenizer: the task's `metadata["prompt_ids"]` go straight to the
    generator; the reward is the fraction of even tokens (deterministic, so tests can check it)."""

    async def run(self, task: Any, generator: Any, sampling_params: SamplingParams, request_id: str) -> Any:
        from arl.rollout.types import AgentResult

        prompt_ids = list(task.metadata["prompt_ids"])
        out = await generator.generate(request_id, prompt_ids, sampling_params)
        n = len(out.token_ids)
        return AgentResult(
            prompt_ids=prompt_ids,
            response_ids=out.token_ids,
            response_mask=[1] * n,
            response_logprobs=out.log_probs,
            weight_versions=out.weight_versions or [-1] * n,
            reward=sum(t % 2 == 0 for t in out.token_ids) / max(1, n),
            finish_reason=out.stop_reason,
            routed_experts=out.routed_experts,
        )


class SegmentedAgentLoop:
    """A `TokenAgentLoop` over several turns whose history is rewritten every turn (each next prompt
    replaces the last token sampled before it by a template token, as a chat template dropping part of
    an earlier turn would): one segment per turn, as arl-proxy records them. Reward as `TokenAgentLoop`."""

    def __init__(self, turns: int = 3) -> None:
        self.turns = turns

    async def run(self, task: Any, generator: Any, sampling_params: SamplingParams, request_id: str) -> Any:
        from arl.proxy.types import Segment
        from arl.rollout.types import AgentResult

        prompt = list(task.metadata["prompt_ids"])
        segments: list[Segment] = []
        for _ in range(self.turns):
            out = await generator.generate(request_id, prompt, sampling_params)
            n = len(out.token_ids)
            segments.append(Segment(prompt_ids=prompt, response_ids=list(out.token_ids), response_mask=[1] * n,
                                    response_logprobs=list(out.log_probs),
                                    weight_versions=list(out.weight_versions or [-1] * n)))
            prompt = [*prompt, *out.token_ids[:-1], 7]
        first = segments[0]
        sampled = [t for s in segments for t in s.response_ids]
        return AgentResult(
            prompt_ids=first.prompt_ids,
            response_ids=first.response_ids,
            response_mask=first.response_mask,
            response_logprobs=first.response_logprobs,
            weight_versions=list(first.weight_versions or []),
            reward=sum(t % 2 == 0 for t in sampled) / max(1, len(sampled)),
            segments=segments,
            sampled_tokens=len(sampled),
        )


def save_random_qwen3(path: Any, *, vocab: int, hidden: int, head_dim: int, max_positions: int) -> Any:
    """A random 2-layer Qwen3 (tied embeddings, seed 0) saved as an HF folder, without a tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim,
                      max_position_embeddings=max_positions, tie_word_embeddings=True)
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


def hf_logprobs(model, prompt: list[int], tokens: list[int], temperature: float = 1.0) -> list[float]:
    """Log probs of `tokens` after `prompt` under a transformers model (the reference for engines)."""
    import torch

    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float() / temperature, -1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


def save_random_qwen3_moe(path: Any, *, vocab: int = 256, hidden: int = 64, head_dim: int = 32, layers: int = 2,
                          experts: int = 8, top_k: int = 2, max_positions: int = 512, router_std: float = 0.02,
                          seed: int = 0) -> Any:
    """A random Qwen3-MoE (every layer sparse, tied embeddings) saved as an HF folder, without a tokenizer.
    `router_std` sets the router weights' spread: larger means fewer near-ties between experts."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         moe_intermediate_size=hidden // 2, num_hidden_layers=layers, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=head_dim, num_experts=experts, num_experts_per_tok=top_k,
                         norm_topk_prob=True, max_position_embeddings=max_positions, tie_word_embeddings=True)
    model = Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, router_std)
    model.save_pretrained(path)
    return path


class MixedGroupAgentLoop(TokenAgentLoop):
    """A `TokenAgentLoop` whose group members end differently, by the request id's index suffix:
    `-0` fails (failure_kind "sandbox", not trainable); `-1` renders a longer first prompt (as a
    first-turn context overflow or a hostname in the prompt would) and ends "length" with failure_kind
    "context_length"; the others are normal. For tests of groups with failed and odd members."""

    async def run(self, task: Any, generator: Any, sampling_params: SamplingParams, request_id: str) -> Any:
        from arl.rollout.types import AgentResult

        index = request_id.rsplit("-", 1)[-1]
        if index == "0":
            return AgentResult(prompt_ids=[], response_ids=[], response_mask=[], response_logprobs=[],
                               weight_versions=[], reward=0.0, failed=True, failure_kind="sandbox",
                               error="sandbox did not start", timings={"environment_setup": 0.5})
        result = await super().run(task, generator, sampling_params, request_id)
        result.timings = {"agent_execution": 1.0}
        if index == "1":
            prompt_ids = [*task.metadata["prompt_ids"], 99, 98]
            out = await generator.generate(request_id + "-long", prompt_ids, sampling_params)
            result.prompt_ids = prompt_ids
            result.response_ids = out.token_ids
            result.response_mask = [1] * len(out.token_ids)
            result.response_logprobs = out.log_probs
            result.weight_versions = out.weight_versions or [-1] * len(out.token_ids)
            result.reward = 0.0
            result.finish_reason = "length"
            result.failure_kind = "context_length"
        return result


# ----- simulation at scale: a virtual clock and an engine with a decode cost model ----------------


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: whenever nothing is ready, time jumps to the next timer.

    `asyncio.sleep`, `wait_for` timeouts and `loop.time()` all run on it, so a simulation of hours
    of engine time takes as long as its Python work. Threads and real I/O do not fit (nothing wakes
    the loop but timers): simulated parts must only await timers and each other. When every task is
    blocked with no timer pending, the simulation is deadlocked and `run_until_complete` raises.
    """

    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(selector=_InstantSelector(self))

    def time(self) -> float:
        return self._virtual_now


@contextlib.contextmanager
def virtual_time(loop: asyncio.AbstractEventLoop, *modules: Any) -> Iterator[None]:
    """Within the block, `modules`' `time.perf_counter/monotonic/time` read `loop.time()`.

    The rollouter and trainer stamp metrics with the `time` module; a simulation on a
    `VirtualClockLoop` points those modules' `time` at the virtual clock so their figures
    (step_s, samples_per_s, wait_s) are in virtual seconds.
    """
    fake = types.SimpleNamespace(perf_counter=loop.time, monotonic=loop.time, time=loop.time, sleep=None)
    saved = [(m, m.time) for m in modules]
    for m in modules:
        m.time = fake
    try:
        yield
    finally:
        for m, original in saved:
            m.time = original


class SimulationDeadlock(RuntimeError):
    """Every simulated task waits on another and no timer is pending."""


class _InstantSelector:
    """Selector whose `select(timeout)` advances the virtual clock by `timeout` instead of waiting."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        import selectors

        self._loop = loop
        self._real = selectors.DefaultSelector()  # only holds the loop's self-pipe registration

    def register(self, fileobj: Any, events: int, data: Any = None) -> Any:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> Any:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> Any:
        return self._real.modify(fileobj, events, data)

    def get_key(self, fileobj: Any) -> Any:
        return self._real.get_key(fileobj)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise SimulationDeadlock("every simulated task is blocked and no timer is pending")
        self._loop._virtual_now += max(0.0, timeout)
        return []


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

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams) -> TokenOutput:
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
