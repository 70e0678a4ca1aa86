"""The server manager: one `Generator` over many engine replicas, which survives weight syncs.

Agents (and the proxy) call `generate` as if there were a single engine. Behind it the load balancer
picks a replica, and when a weight sync aborts an in-flight request (partial rollout, mode d) the
manager waits for the sync to finish and resubmits `prompt + tokens so far` with the remaining token
budget, so the caller receives one uninterrupted completion whose tokens each carry the weight
version that sampled them.

Failover: a replica whose generate (or pause/resume/load) raises `EngineDeadError` is marked unhealthy,
the load balancer leaves it out, and each of its in-flight requests resumes on a live replica with the
tokens sampled so far (the same resume as after a sync abort), counted in `failovers`. Pauses, resumes
and weight loads skip dead replicas, so a run goes on while one replica is left.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from arl.proxy.types import SamplingParams, TokenOutput
from arl.rollout.engine import Engine, PauseMode
from arl.rollout.errors import EngineDeadError, GenerateTimeoutError, WeightSyncError
from arl.rollout.load_balancer import LoadBalancer
from arl.rollout.routed_experts import extend_routes

log = logging.getLogger(__name__)


class ServerManager:
    """Load-balanced, pausable front of a set of engine replicas (itself a `Generator`)."""

    def __init__(
        self,
        engines: Sequence[Engine],
        *,
        generate_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engines = list(engines)
        self.balancer = LoadBalancer(len(self.engines))
        self._generate_timeout_s = generate_timeout_s
        self._running = asyncio.Event()
        self._running.set()
        self._call_ids = itertools.count()
        self._sync_epoch = 0  # bumped by every pause, so a late abort is still known to be a sync's
        self.resumed_requests = 0  # requests continued after a sync abort (partial rollout)
        self.failovers = 0  # requests moved to another replica after theirs died
        self.sync_sources: list[str] = []  # the sender each replica was told to load the last sync from
        self.lost_replicas: list[int] = []
        # Utilization: per replica, seconds during which at least one generation call was running
        # (an engine with no call is idle: starved, paused for a sync, or asleep while colocated).
        self._clock = clock
        self._created_at = clock()
        self._calls = [0] * len(self.engines)
        self._busy_since: list[float | None] = [None] * len(self.engines)
        self._busy_s = [0.0] * len(self.engines)
        self.generated_tokens = 0

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams
    ) -> TokenOutput:
        tokens: list[int] = []
        log_probs: list[float] = []
        versions: list[int] = []
        experts: list[list[list[int]]] | None = None  # MoE routing per token, kept in step with the tokens
        replica = self.balancer.acquire(request_id)
        try:
            while True:
                await self._running.wait()
                engine = self.engines[replica]
                params = msgspec.structs.replace(
                    sampling_params, max_tokens=sampling_params.max_tokens - len(tokens)
                )
                call_id = f"{request_id}-{next(self._call_ids)}"
                epoch = self._sync_epoch
                self._call_started(called := replica)
                try:
                    out = await asyncio.wait_for(
                        engine.generate(call_id, prompt_ids + tokens, params), self._generate_timeout_s
                    )
                except TimeoutError:
                    raise GenerateTimeoutError(
                        f"replica {replica} did not finish request {request_id} in {self._generate_timeout_s}s"
                    ) from None
                except EngineDeadError as e:
                    self.mark_dead(replica, e)
                    self.balancer.release(replica)
                    # nothing held while acquiring (it raises NoHealthyReplicaError if none is left)
                    replica = -1
                    replica = self.balancer.acquire(request_id)
                    self.failovers += 1
                    continue  # resume on a live replica from the tokens sampled so far
                finally:
                    self._call_ended(called)
                self.generated_tokens += len(out.token_ids)
                experts = extend_routes(
                    experts, out.routed_experts, before=len(tokens), added=len(out.token_ids)
                )
                tokens += out.token_ids
                log_probs += out.log_probs
                versions += out.weight_versions or [engine.weight_version] * len(out.token_ids)
                sync_abort = out.stop_reason == "abort" and (self.paused or epoch != self._sync_epoch)
                if sync_abort and len(tokens) < sampling_params.max_tokens:
                    self.resumed_requests += 1
                    continue  # wait for resume, then continue from where the engine stopped
                reason = out.stop_reason
                if sync_abort:  # aborted exactly at the budget: the tokens are complete
                    reason = "length"
                return TokenOutput(
                    token_ids=tokens,
                    log_probs=log_probs,
                    stop_reason=reason,
                    weight_versions=versions,
                    routed_experts=experts,
                )
        finally:
            if replica >= 0:
                self.balancer.release(replica)

    def mark_dead(self, replica: int, reason: BaseException | str) -> None:
        """Leave `replica` out from now on (its in-flight requests fail over as they notice)."""
        if self.balancer.mark_unhealthy(replica):
            self.lost_replicas.append(replica)
            log.warning(
                "engine replica %d is dead (%s); %d replica(s) left",
                replica,
                reason,
                len(self.balancer.healthy),
            )

    @property
    def healthy_replicas(self) -> list[int]:
        return self.balancer.healthy

    async def each_healthy(self, call: Callable[[int, Engine], Any]) -> None:
        """`call(index, engine)` on every healthy replica concurrently; one that turns out dead is
        marked, not raised."""
        live = self.balancer.healthy
        results = await asyncio.gather(*(call(i, self.engines[i]) for i in live), return_exceptions=True)
        for i, r in zip(live, results, strict=True):
            if isinstance(r, EngineDeadError):
                self.mark_dead(i, r)
            elif isinstance(r, BaseException):
                raise r

    def _call_started(self, replica: int) -> None:
        if self._calls[replica] == 0:
            self._busy_since[replica] = self._clock()
        self._calls[replica] += 1

    def _call_ended(self, replica: int) -> None:
        self._calls[replica] -= 1
        if self._calls[replica] == 0:
            self._busy_s[replica] += self._clock() - self._busy_since[replica]  # type: ignore[operator]
            self._busy_since[replica] = None

    def utilization(self) -> dict[str, float]:
        """Cumulative: seconds since creation, busy seconds summed over replicas, generated tokens.

        Idle fraction over a window = 1 - Δengine_busy_s / (replicas × Δmanager_elapsed_s).
        """
        now = self._clock()
        busy = sum(
            b + (now - since if since is not None else 0.0)
            for b, since in zip(self._busy_s, self._busy_since, strict=True)
        )
        elapsed = now - self._created_at
        return {
            "manager_elapsed_s": elapsed,
            "engine_busy_s": busy,
            "engine_replicas": float(len(self.balancer.healthy)),  # the live ones (a dead one is not idle)
            "engine_idle_fraction": 1.0 - busy / max(1e-9, elapsed * len(self.engines)),
            "engine_generated_tokens": float(self.generated_tokens),
        }

    def forget(self, request_id: str) -> None:
        """The trajectory `request_id` is over: release its replica stickiness."""
        self.balancer.forget(request_id)

    async def pause(self, mode: PauseMode) -> None:
        """Stop new generation calls; `mode` says what engines do with in-flight ones (see Engine)."""
        self._running.clear()
        self._sync_epoch += 1
        await self.each_healthy(lambda _, e: e.pause(mode))

    async def resume(self) -> None:
        await self.each_healthy(lambda _, e: e.resume())
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    async def load_weights(
        self, sync_address: str | Sequence[str], sync_config_json: bytes, version: int
    ) -> None:
        """Every healthy replica joins the arl-sync sender and applies the new weights (concurrently).

        `sync_address` is one sender for every replica, or one per replica (replica i joins
        `sync_address[i]`: e.g. colocated trainer ranks, each sending to the replica on its own GPU).
        A replica found dead during the load fails the sync (WeightSyncError): the sender was told to
        expect it, so the caller must stop the sender rather than wait for it (the publisher cancels)."""
        if isinstance(sync_address, str):
            addresses = [sync_address] * len(self.engines)
        else:
            addresses = list(sync_address)
            if len(addresses) != len(self.engines):
                raise ValueError(
                    f"load_weights got {len(addresses)} sender addresses for {len(self.engines)} "
                    "replicas: give one address, or one per replica"
                )
        before = set(self.balancer.healthy)
        self.sync_sources = addresses
        await self.each_healthy(lambda i, e: e.load_weights(addresses[i], sync_config_json, version))
        lost = sorted(before - set(self.balancer.healthy))
        if lost:
            raise WeightSyncError(f"replica(s) {lost} died during the weight sync of version {version}")

    @property
    def weight_versions(self) -> list[int]:
        """The weight version of each healthy replica."""
        return [self.engines[i].weight_version for i in self.balancer.healthy]
