"""arl's in-tree engine: a transformers causal LM sampling on any torch device.

Not a vLLM replacement: it recomputes the whole (left-padded) batch every token instead of keeping a
KV cache, which is fine for small models and short sequences and needs nothing but torch. It serves
where vLLM is not installed (tests, machines without a vLLM build) behind the same `Engine` seam:
batched sampling over every in-flight request, abort/pause between tokens, staged weight loads from
an arl-sync receiver.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import msgspec
import torch

from arl.proxy.types import SamplingParams, TokenOutput
from arl.rollout.aio import cancel_and_wait
from arl.rollout.engine import PauseMode
from arl.rollout.engines.torch_engine_config import TorchEngineConfig
from arl.rollout.errors import WeightSyncError
from arl.rollout.routed_experts import RouteRecorder


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    # Only for a request with its own seed; others share the engine's device generator.
    generator: torch.Generator | None
    done: asyncio.Future[str]
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    experts: list[list[list[int]]] = field(default_factory=list)


class TorchEngine:
    def __init__(self, config: TorchEngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.model: Any = None
        self._version = config.initial_version
        self._requests: dict[str, _Request] = {}
        self._wakeup = asyncio.Event()
        self._running = asyncio.Event()
        self._running.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop_task: asyncio.Task[None] | None = None
        self._step_lock = asyncio.Lock()  # held while a token step runs, so pause can wait it out
        self._receiver: Any = None
        self._recorder: RouteRecorder | None = None
        self._generator = torch.Generator(device=self.device).manual_seed(config.seed)

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def in_flight(self) -> int:
        """Requests being decoded now."""
        return len(self._requests)

    async def start(self) -> None:
        from transformers import AutoModelForCausalLM

        self.model = await asyncio.to_thread(
            lambda: (
                AutoModelForCausalLM.from_pretrained(
                    self.config.model_path, dtype=getattr(torch, self.config.dtype)
                )
                .to(self.device)
                .eval()
            )
        )
        self._recorder = RouteRecorder(self.model) if self.config.return_routed_experts else None
        self._loop_task = asyncio.create_task(self._decode_loop())

    async def stop(self) -> None:
        await cancel_and_wait(self._loop_task)
        self._finish_all("abort")
        if self._receiver is not None:
            self._receiver.close()

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams
    ) -> TokenOutput:
        if self._loop_task is None or self._loop_task.done():
            raise RuntimeError("TorchEngine is not running (call start() first)")
        gen = None
        if sampling_params.seed is not None:
            gen = torch.Generator(device="cpu").manual_seed(sampling_params.seed)
        req = _Request(list(prompt_ids), sampling_params, gen, asyncio.get_running_loop().create_future())
        self._requests[request_id] = req
        self._idle.clear()
        self._wakeup.set()
        try:
            reason = await req.done
        except asyncio.CancelledError:  # the caller gave up (a timeout): stop decoding it for nobody
            if self._requests.get(request_id) is req:
                self._finish(request_id, "abort")
            raise
        version = self._version
        return TokenOutput(
            token_ids=req.tokens,
            log_probs=req.log_probs,
            stop_reason=reason,  # type: ignore[arg-type]
            weight_versions=[version] * len(req.tokens),
            routed_experts=req.experts if self._recorder is not None else None,
        )

    def _finish(self, request_id: str, reason: str) -> None:
        req = self._requests.pop(request_id)
        if not req.done.done():
            req.done.set_result(reason)
        if not self._requests:
            self._idle.set()

    def _finish_all(self, reason: str) -> None:
        for rid in list(self._requests):
            self._finish(rid, reason)

    async def _decode_loop(self) -> None:
        while True:
            if not self._requests:
                self._wakeup.clear()
                await self._wakeup.wait()
            await self._running.wait()
            async with self._step_lock:
                if not self._running.is_set():
                    continue
                batch = list(self._requests.items())[: self.config.max_batch]
                if batch:
                    await asyncio.to_thread(self._step, batch)
                for rid, req in batch:
                    if rid in self._requests:
                        self._maybe_finish(rid, req)

    @torch.no_grad()
    def _step(self, batch: list[tuple[str, _Request]]) -> None:
        seqs = [req.prompt_ids + req.tokens for _, req in batch]
        width = max(len(s) for s in seqs)
        # Left padding: the next token is always at position -1.
        ids = torch.tensor([[0] * (width - len(s)) + s for s in seqs], dtype=torch.long)
        attn = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], dtype=torch.long)
        position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
        with self._recorder.recording() if self._recorder is not None else contextlib.nullcontext():
            logits = (
                self.model(
                    input_ids=ids.to(self.device),
                    attention_mask=attn.to(self.device),
                    position_ids=position_ids.to(self.device),
                )
                .logits[:, -1]
                .float()
            )
        if self._recorder is not None:  # the routing of the step that samples each row's next token
            for (_, req), row in zip(batch, self._recorder.last_rows(len(batch)), strict=True):
                req.experts.append(row)
        # Rows that share sampling settings are sampled together on the device, from the engine's
        # generator; a request with its own seed is sampled alone from its own generator.
        groups: dict[tuple[float, float, int] | int, list[int]] = {}
        for i, (_, req) in enumerate(batch):
            p = req.params
            key = i if req.generator is not None else (p.temperature, p.top_p, p.top_k)
            groups.setdefault(key, []).append(i)
        for rows in groups.values():
            req = batch[rows[0]][1]
            p = req.params
            if req.generator is not None:
                tokens, logps = sample(logits[rows].cpu(), p.temperature, p.top_p, p.top_k, req.generator)
            else:
                tokens, logps = sample(logits[rows], p.temperature, p.top_p, p.top_k, self._generator)
            for i, token, logp in zip(rows, tokens.tolist(), logps.tolist(), strict=True):
                batch[i][1].tokens.append(token)
                batch[i][1].log_probs.append(logp)

    def _maybe_finish(self, rid: str, req: _Request) -> None:
        p = req.params
        # Only explicit stop ids end a request (no implicit model EOS), so `p.ignore_eos` holds as is.
        if req.tokens and req.tokens[-1] in p.stop_token_ids:
            self._finish(rid, "stop")
        elif len(req.tokens) >= p.max_tokens:
            self._finish(rid, "length")

    async def abort_all(self) -> None:
        self._finish_all("abort")

    async def pause(self, mode: PauseMode) -> None:
        if mode == "wait":
            await self._idle.wait()
        self._running.clear()
        async with self._step_lock:  # the token step in progress completes first
            pass
        if mode == "abort":
            self._finish_all("abort")

    async def resume(self) -> None:
        self._running.set()

    async def load_weights(self, sync_address: str, sync_config_json: bytes, version: int) -> None:
        from arl.sync import SyncConfig, WeightReceiver

        if self._receiver is None:
            self._receiver = WeightReceiver(
                sync_address, msgspec.json.decode(sync_config_json, type=SyncConfig)
            )
        params = dict(self.model.named_parameters())

        def apply(named: Any) -> None:
            with torch.no_grad():
                for name, tensor in named:
                    if name not in params:
                        raise WeightSyncError(f"TorchEngine got unknown parameter {name!r}")
                    params[name].copy_(tensor.to(params[name].device, params[name].dtype))

        applied = await asyncio.to_thread(self._receiver.receive, apply=apply)
        if applied != version:
            raise WeightSyncError(f"TorchEngine received version {applied}, expected {version}")
        self._version = applied

    async def worker_weights(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().cpu().clone() for name, p in self.model.named_parameters()}

    async def worker_digests_per_rank(self) -> list[dict[str, Any]]:
        """The parameters' fingerprints (`weights_digest`), one rank: the same check as vLLM's workers."""
        from arl.rollout.engines.weights_digest import engine_digests

        with torch.no_grad():
            return [engine_digests(self.model.named_parameters())]


def sample(
    logits: torch.Tensor, temperature: float, top_p: float, top_k: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of `logits` (R, V); returns the tokens and their log probs under the
    processed distribution (as vLLM's `processed_logprobs`: after temperature, top-k and top-p)."""
    if temperature <= 0:
        tokens = logits.argmax(-1)
        return tokens, torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)
    scaled = logits / temperature
    if top_k > 0:
        kth = torch.topk(scaled, min(top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, -1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix whose mass reaches top_p
        scaled = torch.full_like(scaled, float("-inf")).scatter(
            -1, order, sorted_logits.masked_fill(drop, float("-inf"))
        )
    logp = torch.log_softmax(scaled, -1)
    tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
