"""Trainer configuration (msgspec; loaded from TOML by the app, each field documented).

Torch-free at import, like `algorithm_config`: a run's configuration is read and checked without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import msgspec

from arl.trainer.algorithm_config import AlgorithmConfig
from arl.trainer.errors import TrainerConfigError

if TYPE_CHECKING:
    import torch


class OptimConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """AdamW and gradient clipping for the policy's updates."""

    # AdamW's learning rate (peak, after AlgorithmConfig.lr_warmup_steps).
    lr: float = 1e-3
    # AdamW's decoupled weight decay.
    weight_decay: float = 0.0
    # AdamW's (beta1, beta2).
    betas: tuple[float, float] = (0.9, 0.999)
    # Clip the global gradient norm to this before each update.
    grad_clip: float = 1.0
    # CUDA: AdamW's fused single-kernel step (torch's `fused=True`): no full-size temporaries, unlike
    # the default multi-tensor step, whose square-root list alone is the size of the parameters.
    fused: bool = False
    # An update whose gradient norm is NaN or inf is skipped (weights and optimizer state untouched; the
    # step reports `nonfinite_skipped`); one more than this many in a row raises NonFiniteGradientError.
    max_nonfinite_skips: int = 3

    def __post_init__(self) -> None:
        _check(self.lr > 0, "lr", self.lr, "must be > 0")
        _check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")
        _check(all(0 <= b < 1 for b in self.betas), "betas", self.betas, "must each be in [0, 1)")
        _check(self.grad_clip > 0, "grad_clip", self.grad_clip, "must be > 0")
        _check(self.max_nonfinite_skips >= 0, "max_nonfinite_skips", self.max_nonfinite_skips, "must be >= 0")


class TrainerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How the trainer turns samples into updates."""

    # Prompts (samples) per optimizer step; a step of `required` samples makes required/ppo_mini_batch_size updates.
    ppo_mini_batch_size: int = 8
    # Mini-batches per trainer step (reference: async_training.require_batches).
    require_batches: int = 1
    # Updates between weight syncs to the rollout side.
    trigger_parameter_sync_step: int = 1
    # Sampling temperature of the rollout (logits are divided by it before log probs).
    temperature: float = 1.0
    # Hard bound on (current version − oldest token version) per sample; None = no bound.
    max_version_lag: int | None = None
    # What to do with a sample over the bound: drop it (counted in metrics) or train on it anyway (counted).
    on_version_lag: Literal["drop", "keep"] = "drop"
    # Seconds to wait for a batch before declaring the rollout side stuck.
    batch_timeout_s: float = 600.0
    # MoE models: "rollout" replays the experts the engine chose for each sampled token
    # (arl.trainer.router_replay); "off" routes again (the mismatch is still measured when routes exist).
    router_replay: Literal["off", "rollout"] = "off"
    # MoE models: weight of the Switch load-balancing loss (counting the experts actually used, the
    # replayed ones under "rollout"), added to each update's loss; 0 = not computed.
    router_aux_loss_coef: float = 0.0
    # Every N steps, two extra no-grad forwards measure the train/rollout log-prob gap of the sampled
    # tokens with replay off and on (router_replay/logp_gap_*); 0 = never. Needs engine routes.
    router_replay_gap_every: int = 0
    optim: OptimConfig = msgspec.field(default_factory=OptimConfig)
    # The RL algorithm: policy loss, clipping, IS corrections, KL, entropy bonus, advantages, dynamic
    # sampling, LR schedule, proximal mode (every field documented in arl.trainer.algorithm_config).
    algorithm: AlgorithmConfig = msgspec.field(default_factory=AlgorithmConfig)
    # Token budget of one packed micro-batch (sequences are never split; a longer one is an error).
    max_tokens_per_microbatch: int = 16384
    # token-mean | seq-mean-token-mean | seq-mean-token-sum-norm (see arl.trainer.loss_agg).
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    # The constant length of seq-mean-token-sum-norm; None = the longest response in the mini-batch.
    loss_agg_norm_len: int | None = None
    # bf16 compute with fp32 master weights and optimizer state; "auto" = bf16 on CUDA, none elsewhere.
    mixed_precision: Literal["auto", "bf16", "none"] = "auto"
    # Recompute decoder layers in backward: none | selective (every second layer) | full (every layer).
    activation_checkpointing: Literal["none", "selective", "full"] = "none"
    # CUDA: tensors the training forward saves for backward go to pinned host memory until backward
    # (arl.trainer.offload): less GPU memory, slower by the PCIe time of moving them out and back.
    # With checkpointing only the checkpointed layers' inputs are saved (and offloaded). No-op off CUDA.
    activation_offload: bool = False
    # CUDA: AdamW's state in pinned host memory between trainer steps (arl.trainer.optimizer), loaded
    # before the step's first update and written back after its last, gradients dropped after the step:
    # between steps the trainer holds only its parameters, so a colocated vLLM replica gets the memory
    # for its KV cache. Costs the state's bytes over PCIe twice per step; updates are bit-identical.
    optimizer_offload: bool = False
    # With optimizer_offload: the state starts back to the GPU when the step's first forward begins, on
    # a copy stream beside the forward and backward passes, so the update waits for little or none of it
    # (those passes' peak then includes the state, as without the offload). False: copied back right
    # before the update (the lower peak, the copy time exposed).
    optimizer_prefetch: bool = True
    # The prefetch's pace: at most this many MiB of its copies queued at once (a thread queues the next
    # as earlier ones land), so a device-wide synchronization mid-step (a matmul kernel's first launch
    # for a new shape, cudaFree) waits for that much copying instead of the whole state. 0: all queued
    # at once.
    optimizer_prefetch_inflight_mb: int = 256
    # With optimizer_offload on CUDA: the step's way out is only queued (paced like the prefetch) and
    # the step returns before it lands; `settle_optimizer_offload()` frees the state's GPU memory once
    # the caller needs it (the colocated app: before the replica's KV cache wakes, so the copies run
    # beside the replica's weight wake and the sync). Anything touching the state next settles first.
    optimizer_offload_overlap: bool = False
    # CUDA, both backends: compile each decoder layer's forward (torch.compile, dynamic shapes), fusing
    # the norms, RoPE, SwiGLU and residual adds that run as separate memory-bound kernels eagerly (under
    # FSDP2 its gather/reshard hooks stay eager). The first micro-batch pays the compile. No-op off CUDA.
    compile_layers: bool = False
    # CUDA: at startup, check the GEMMs of the model's layer shapes against a CPU reference and, if they
    # are wrong (seen under an MPS SM cap), plan cuBLASLt for fewer SMs until they are right, or raise
    # GemmCorrectnessError (arl.trainer.gemm_check): a few GEMMs and their CPU reference. No-op off CUDA.
    check_gemms: bool = True
    # An MPS client capped below 100% of the SMs checks its GEMMs again every this many steps, under the
    # GPU's load of the moment, and plans for fewer SMs if they went wrong (0: at startup only). Which
    # plans are right moved with a neighbour's load: 78 SMs alone, 70 beside a busy replica (an H100 at 75%).
    gemm_recheck_every: int = 10
    # Logit elements (tokens × vocabulary) the chunked log-prob head holds at once.
    logprob_chunk_elements: int = 1 << 27
    # The accelerator's dense bf16 peak in TFLOP/s for the `mfu` metric (0 = do not report MFU).
    peak_tflops: float = 0.0

    def __post_init__(self) -> None:
        _check(self.ppo_mini_batch_size >= 1, "ppo_mini_batch_size", self.ppo_mini_batch_size, "must be >= 1")
        _check(self.require_batches >= 1, "require_batches", self.require_batches, "must be >= 1")
        _check(
            self.trigger_parameter_sync_step >= 1,
            "trigger_parameter_sync_step",
            self.trigger_parameter_sync_step,
            "must be >= 1",
        )
        _check(
            self.temperature > 0,
            "temperature",
            self.temperature,
            "must be > 0 (log probs at temperature 0 are undefined)",
        )
        _check(
            self.max_version_lag is None or self.max_version_lag >= 0,
            "max_version_lag",
            self.max_version_lag,
            "must be >= 0 (None: no bound)",
        )
        _check(self.batch_timeout_s > 0, "batch_timeout_s", self.batch_timeout_s, "must be > 0")
        _check(
            self.gemm_recheck_every >= 0,
            "gemm_recheck_every",
            self.gemm_recheck_every,
            "must be >= 0 (0: check the GEMMs at startup only)",
        )
        _check(
            self.max_tokens_per_microbatch >= 1,
            "max_tokens_per_microbatch",
            self.max_tokens_per_microbatch,
            "must be >= 1",
        )
        _check(
            self.loss_agg_norm_len is None or self.loss_agg_norm_len >= 1,
            "loss_agg_norm_len",
            self.loss_agg_norm_len,
            "must be >= 1 (None: the longest response in the mini-batch)",
        )
        _check(
            self.logprob_chunk_elements >= 1,
            "logprob_chunk_elements",
            self.logprob_chunk_elements,
            "must be >= 1",
        )
        _check(
            self.optimizer_prefetch_inflight_mb >= 0,
            "optimizer_prefetch_inflight_mb",
            self.optimizer_prefetch_inflight_mb,
            "must be >= 0",
        )
        _check(
            self.router_aux_loss_coef >= 0, "router_aux_loss_coef", self.router_aux_loss_coef, "must be >= 0"
        )
        _check(
            self.router_replay_gap_every >= 0,
            "router_replay_gap_every",
            self.router_replay_gap_every,
            "must be >= 0",
        )
        _check(self.peak_tflops >= 0, "peak_tflops", self.peak_tflops, "must be >= 0 (0: no MFU)")


def _check(ok: bool, name: str, value: object, rule: str) -> None:
    """Refuse field `name` = `value` unless `ok`; the message starts with the field's name, so that a
    caller can tell which field (the app names its dotted key)."""
    if not ok:
        raise TrainerConfigError(f"{name} {rule}, got {value!r}")


def compute_dtype(config: TrainerConfig, device: torch.device) -> torch.dtype | None:
    """The mixed-precision compute dtype (bf16), or None for none; "auto" = bf16 on CUDA only."""
    import torch

    mp = config.mixed_precision
    if mp == "auto":
        mp = "bf16" if device.type == "cuda" else "none"
    return torch.bfloat16 if mp == "bf16" else None
