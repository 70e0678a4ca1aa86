"""vLLM as an arl engine replica: token ids in, sampled tokens with log probs out.

Wraps `vllm.v1.engine.async_llm.AsyncLLM`. New weights arrive through arl-sync straight into the
engine's worker process (`vllm_worker.WeightSyncExtension`), while generation is paused, so no request
ever samples from half-old, half-new weights.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import msgspec

from arl.proxy.types import SamplingParams, TokenOutput
from arl.rollout.engine import PauseMode
from arl.rollout.errors import EngineError, WeightSyncError

_EXTENSION = "arl.rollout.engines.vllm_worker.WeightSyncExtension"


class VllmEngineConfig(msgspec.Struct, kw_only=True):
    """How to start one vLLM replica."""

    model_path: str
    dtype: str = "auto"
    max_model_len: int = 2048
    enforce_eager: bool = False
    seed: int = 0
    gpu_memory_utilization: float = 0.85
    # KV-cache size on CPU builds (VLLM_CPU_KVCACHE_SPACE); vLLM's own default asks for most of RAM.
    cpu_kv_cache_gib: int = 1
    # Seconds to wait for start-up, one RPC (e.g. a weight load), or a pause.
    start_timeout_s: float = 300.0
    rpc_timeout_s: float = 300.0
    # Weight version of the weights at `model_path` (non-zero when resuming from a checkpoint).
    initial_version: int = 0
    # Extra keyword arguments for vLLM's AsyncEngineArgs (e.g. tensor_parallel_size).
    engine_args: dict[str, Any] = msgspec.field(default_factory=dict)


def _set_cpu_defaults(config: VllmEngineConfig) -> None:
    """Settings vLLM's CPU build needs to start on a small machine (see notes/vllm-and-env.md)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.cpu_kv_cache_gib))
    # Without this the CPU build forces a separate worker process ("mp" executor): one more process to
    # start (~20 s of imports on 2 cores) and to feed every step.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


class VllmEngine:
    """One vLLM AsyncLLM replica implementing the `Engine` protocol."""

    def __init__(self, config: VllmEngineConfig) -> None:
        self.config = config
        self._llm: Any = None
        self._version = config.initial_version

    @property
    def weight_version(self) -> int:
        return self._version

    async def start(self) -> None:
        import torch

        if not torch.cuda.is_available():
            _set_cpu_defaults(self.config)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=str(Path(self.config.model_path)),
            dtype=self.config.dtype,
            max_model_len=self.config.max_model_len,
            enforce_eager=self.config.enforce_eager,
            seed=self.config.seed,
            gpu_memory_utilization=self.config.gpu_memory_utilization,
            worker_extension_cls=_EXTENSION,
            # One worker inside the engine-core process: no extra process to start or to feed.
            distributed_executor_backend="uni",
            disable_log_stats=True,
            # Log probs after temperature (and top-k/top-p): the distribution the token was sampled
            # from, which is what the trainer's importance weights need.
            logprobs_mode="processed_logprobs",
            **self.config.engine_args,
        )
        loop = asyncio.get_running_loop()
        try:
            self._llm = await asyncio.wait_for(
                loop.run_in_executor(None, lambda: AsyncLLM.from_engine_args(args)),
                self.config.start_timeout_s,
            )
        except TimeoutError:
            raise EngineError(f"vLLM did not start within {self.config.start_timeout_s}s") from None

    async def stop(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None

    def _require_started(self) -> Any:
        if self._llm is None:
            raise EngineError("VllmEngine is not started (call start() first)")
        return self._llm

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams
    ) -> TokenOutput:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        llm = self._require_started()
        version = self._version
        params = VllmSamplingParams(
            max_tokens=sampling_params.max_tokens,
            temperature=sampling_params.temperature,
            top_p=sampling_params.top_p,
            top_k=sampling_params.top_k,
            seed=sampling_params.seed,
            stop=sampling_params.stop or None,
            stop_token_ids=sampling_params.stop_token_ids or None,
            logprobs=sampling_params.top_logprobs,
            ignore_eos=sampling_params.ignore_eos,
            # arl works on token ids; text is only needed to match stop strings.
            detokenize=bool(sampling_params.stop),
            # One output per request, not the whole token list re-sent at every step (O(n²) on long
            # generations); an aborted request still delivers its partial tokens in that output.
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        final = None
        async for output in llm.generate(TokensPrompt(prompt_token_ids=prompt_ids), params, request_id):
            final = output
        if final is None or not final.outputs:
            raise EngineError(f"vLLM returned no output for request {request_id}")
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        sampled_logprobs, top = _logprobs_of(completion.logprobs, token_ids, sampling_params.top_logprobs)
        reason = completion.finish_reason or "abort"
        return TokenOutput(
            token_ids=token_ids,
            log_probs=sampled_logprobs,
            stop_reason=reason if reason in ("stop", "length", "abort") else "stop",
            weight_versions=[version] * len(token_ids),
            top_logprobs=top,
        )

    async def abort_all(self) -> None:
        await self.pause("abort")
        await self.resume()

    async def pause(self, mode: PauseMode) -> None:
        llm = self._require_started()
        await asyncio.wait_for(llm.pause_generation(mode=mode, clear_cache=mode != "keep"), self.config.rpc_timeout_s)

    async def resume(self) -> None:
        await asyncio.wait_for(self._require_started().resume_generation(), self.config.rpc_timeout_s)

    async def load_weights(self, sync_address: str, sync_config_json: bytes, version: int) -> None:
        llm = self._require_started()
        try:
            results = await llm.collective_rpc(
                "arl_receive_weights",
                timeout=self.config.rpc_timeout_s,
                args=(sync_address, sync_config_json),
            )
        except Exception as exc:  # the worker raised: its old weights are intact (staged transfer)
            raise WeightSyncError(f"vLLM replica failed to load weights version {version}: {exc}") from exc
        received = set(results)
        if received != {version}:
            raise WeightSyncError(f"vLLM workers applied versions {sorted(received)}, expected {version}")
        await llm.reset_prefix_cache()  # cached KV was computed with the old weights
        self._version = version

    async def worker_weights(self) -> dict[str, Any]:
        """The worker's current parameters in vLLM's naming (name -> CPU tensor), to check a sync."""
        from safetensors.torch import load

        results = await self._require_started().collective_rpc(
            "arl_named_parameters", timeout=self.config.rpc_timeout_s
        )
        return load(results[0])


def _logprobs_of(
    logprobs: Any, token_ids: list[int], top_k: int
) -> tuple[list[float], list[list[tuple[int, float]]] | None]:
    """Pull the sampled token's log prob (and top-k alternatives) out of vLLM's per-position dicts."""
    if logprobs is None:
        raise EngineError("vLLM returned no log probs; SamplingParams.logprobs must be set")
    sampled = [entry[tok].logprob for entry, tok in zip(logprobs, token_ids, strict=True)]
    if top_k <= 0:
        return sampled, None
    top = [
        sorted(((t, lp.logprob) for t, lp in entry.items()), key=lambda kv: -kv[1])[:top_k] for entry in logprobs
    ]
    return sampled, top
