"""Every config value checked when the config is loaded, before Ray or any actor starts.

`validate(config)` raises `ConfigError` naming the first offending key (ranges, cross-field rules,
files that must exist, devices that must be present). `load_config` calls it, so the CLI exits 2 on
a bad value instead of failing (or hanging) inside an actor. Checks that need torch (CUDA devices)
import it only when a CUDA device is named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from arl_train.config import AppConfig, ConfigError

DTYPES = ("float32", "bfloat16", "float16")
GPU_TRANSPORTS = ("nccl", "cuda_ipc")


def _require(ok: bool, key: str, value: Any, rule: str) -> None:
    if not ok:
        raise ConfigError(f"invalid config: {key} = {value!r}: {rule}")


def _at_least(config: Any, section: str, key: str, low: float) -> None:
    value = getattr(getattr(config, section), key)
    _require(value >= low, f"{section}.{key}", value, f"must be >= {low}")


def _positive(config: Any, section: str, key: str) -> None:
    value = getattr(getattr(config, section), key)
    _require(value > 0, f"{section}.{key}", value, "must be > 0")


def _device(key: str, value: str) -> None:
    kind, _, index = value.partition(":")
    _require(kind in ("cpu", "cuda") and (not index or index.isdigit()), key, value, "must be 'cpu', 'cuda' or 'cuda:N'")


def _cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def validate(config: AppConfig) -> AppConfig:
    """Return `config` unchanged if every value is usable; else raise `ConfigError` naming the key."""
    _require(config.seed >= 0, "seed", config.seed, "must be >= 0")
    # model
    m = config.model
    _require(m.dtype in DTYPES, "model.dtype", m.dtype, f"must be one of {list(DTYPES)}")
    _require(m.seed >= 0, "model.seed", m.seed, "must be >= 0")
    if m.path.startswith("builtin:"):
        from arl_train.tiny_model import MODEL_SHAPES

        _require(m.path.removeprefix("builtin:") in MODEL_SHAPES, "model.path", m.path,
                 f"unknown built-in model; available: {['builtin:' + name for name in MODEL_SHAPES]}")
    elif config.ray.address is None:
        _require((Path(m.path) / "config.json").is_file(), "model.path", m.path,
                 "must be builtin:<shape> or a Hugging Face model folder (no config.json there)")
    # data
    d = config.data
    _at_least(config, "data", "size", 1)
    if not d.source.startswith(("builtin:", "harbor:")):  # harbor: sets are checked by arl.harbor.tasks
        _require(d.source.endswith((".jsonl", ".parquet")), "data.source", d.source, "must be builtin:NAME or a .jsonl/.parquet file")
        _require(Path(d.source).is_file(), "data.source", d.source, "file does not exist")
    # rollout
    r = config.rollout
    for key in ("replicas", "max_concurrent_per_replica", "n", "max_tokens", "max_model_len"):
        _at_least(config, "rollout", key, 1)
    _require(r.max_tokens < r.max_model_len, "rollout.max_tokens", r.max_tokens,
             f"must be < rollout.max_model_len ({r.max_model_len}) to leave room for the prompt")
    _positive(config, "rollout", "temperature")  # log probs are taken at this temperature: 0 is undefined
    _require(0 < r.top_p <= 1, "rollout.top_p", r.top_p, "must be in (0, 1]")
    _require(r.dtype in DTYPES, "rollout.dtype", r.dtype, f"must be one of {list(DTYPES)}")
    _positive(config, "rollout", "generate_timeout_s")
    _device("rollout.device", r.device)
    # actor
    a = config.actor
    _at_least(config, "actor", "ppo_mini_batch_size", 1)
    for key in ("lr", "grad_clip"):
        _positive(config, "actor", key)
    _at_least(config, "actor", "max_tokens_per_microbatch", 1)
    _at_least(config, "actor", "optimizer_prefetch_inflight_mb", 0)
    # actor.algorithm validates its own ranges when it is built (AlgorithmConfig.__post_init__).
    if a.reference_path:
        _require(a.algorithm.kl_coef > 0, "actor.reference_path", a.reference_path,
                 "is the KL's reference policy: it needs actor.algorithm.kl_coef > 0")
        if config.ray.address is None:
            _require((Path(a.reference_path) / "config.json").is_file(), "actor.reference_path", a.reference_path,
                     "must be a Hugging Face model folder (no config.json there)")
    _device("actor.device", a.device)
    _require(a.router_replay == "off" or r.return_routed_experts, "actor.router_replay", a.router_replay,
             "needs rollout.return_routed_experts = true (the engine must report the experts it chose)")
    _at_least(config, "actor", "router_aux_loss_coef", 0)
    _at_least(config, "actor", "router_replay_gap_every", 0)
    # async_training: the budget formulas need these ranges (arl.rollout.budget)
    at = config.async_training
    _require(at.staleness_threshold >= 0, "async_training.staleness_threshold", at.staleness_threshold,
             "must be >= 0 (0 = on-policy / stream off-policy; > 0 = async, see the mode table)")
    _at_least(config, "async_training", "trigger_parameter_sync_step", 1)
    _at_least(config, "async_training", "require_batches", 1)
    _require(at.max_version_lag >= -1, "async_training.max_version_lag", at.max_version_lag, "must be >= 0, or -1 for no bound")
    required = at.require_batches * a.ppo_mini_batch_size
    max_required = int(required * (at.staleness_threshold + 1) * at.trigger_parameter_sync_step)
    _require(max_required >= required, "async_training.staleness_threshold", at.staleness_threshold,
             f"gives max_required={max_required} < required={required}")
    # trainer
    t = config.trainer
    _at_least(config, "trainer", "total_steps", 1)
    _at_least(config, "trainer", "save_every", 0)
    _at_least(config, "trainer", "profile_step", 0)
    _positive(config, "trainer", "batch_timeout_s")
    if t.resume_from:
        state_file = Path(t.resume_from) / "trainer_state.json"
        _require(state_file.is_file(), "trainer.resume_from", t.resume_from, "is not an arl checkpoint (no trainer_state.json)")
        try:
            state = json.loads(state_file.read_text())
            step = int(state["step"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"invalid config: trainer.resume_from = {t.resume_from!r}: unreadable trainer_state.json ({exc})") from None
        _require(step < t.total_steps, "trainer.total_steps", t.total_steps,
                 f"must exceed the checkpoint's step ({step}) to train further")
        if a.algorithm.kl_coef > 0 and not a.reference_path:
            _check_recorded_reference(t.resume_from, state.get("reference_path"), config.ray.address is None)
        _check_snapshot(t.resume_from)
    # sync: the GPU transports need the trainer and the engines on CUDA
    s = config.sync
    _at_least(config, "sync", "bucket_mb", 1)
    _positive(config, "sync", "timeout_s")
    if s.transport in GPU_TRANSPORTS:
        trainer_on_gpu = config.resources.trainer_gpus > 0 or a.device.startswith("cuda")
        _require(trainer_on_gpu, "sync.transport", s.transport,
                 f"needs the trainer on CUDA (resources.trainer_gpus > 0 or actor.device 'cuda'); use 'cpu' or 'auto'")
        if r.engine == "torch":
            _require(r.device.startswith("cuda"), "sync.transport", s.transport,
                     f"needs rollout.device on CUDA (is {r.device!r}); use 'cpu'")
    # ray
    if config.ray.num_cpus is not None:
        _require(config.ray.num_cpus >= 1, "ray.num_cpus", config.ray.num_cpus, "must be >= 1 (or unset)")
    # output
    _require(bool(config.output.dir), "output.dir", config.output.dir, "must not be empty")
    _require(not Path(config.output.dir).is_file(), "output.dir", config.output.dir, "is a file, not a folder")
    return config


def check_machine(config: AppConfig) -> None:
    """The devices the config names or its layout needs must exist on this machine (in-process Ray
    only). Separate from `validate` so a layout can be loaded and inspected on any machine; the CLI
    calls both before anything starts."""
    _check_devices(config)


def _check_recorded_reference(checkpoint: str, recorded: Any, local: bool) -> None:
    """A resumed KL run keeps the reference of its first run (the checkpoint's `reference_path`)."""
    _require(isinstance(recorded, str) and bool(recorded), "trainer.resume_from", checkpoint,
             "records no reference_path (a checkpoint from before KL support): set actor.reference_path to the "
             "run's original base model (the checkpoint itself is not the reference)")
    if local:
        _require((Path(recorded) / "config.json").is_file(), "trainer.resume_from", checkpoint,
                 f"its reference model {recorded!r} (trainer_state.json reference_path) is not a model folder "
                 "any more: set actor.reference_path")


def _check_snapshot(checkpoint: str) -> None:
    """The checkpoint's queued samples must load whole (checksum, schema); never half-restore them."""
    from arl.queue.errors import QueueError
    from arl.queue.persistence import read_snapshot, snapshot_path

    # run.py copies the snapshot in after the weights: without it the checkpoint was cut short, and
    # resuming would silently lose the samples it had queued.
    _require(snapshot_path(checkpoint).is_file(), "trainer.resume_from", checkpoint,
             f"is incomplete: no {snapshot_path(checkpoint).name} (the run ended while saving it); use an earlier checkpoint")
    try:
        read_snapshot(checkpoint)
    except QueueError as exc:
        raise ConfigError(f"invalid config: trainer.resume_from = {checkpoint!r}: refusing its queue snapshot: {exc}") from None


def _check_devices(config: AppConfig) -> None:
    """GPUs named or requested must exist, where this process can see them (in-process Ray only)."""
    if config.ray.address is not None:
        return  # a remote cluster's devices are not visible from here
    named = [(k, v) for k, v in (("actor.device", config.actor.device), ("rollout.device", config.rollout.device)) if v.startswith("cuda")]
    if config.rollout.engine != "torch":
        named = [(k, v) for k, v in named if k != "rollout.device"]  # vLLM picks its own device
    requested = _requested_gpus(config)
    if not named and not requested:
        return
    count = _cuda_count()
    for key, value in named:
        index = int(value.partition(":")[2] or 0)
        _require(index < count, key, value, f"this machine has {count} CUDA device(s)")
    for key, value in requested:
        _require(value <= count, key, value, f"asks for more GPUs than this machine has ({count})")


def _requested_gpus(config: AppConfig) -> list[tuple[str, float]]:
    """The GPUs the run's layout needs (trainer + rollout replicas × TP, shared when colocated)."""
    from arl_train.placement import layout_of

    total = layout_of(config).total_gpus
    return [("resources", total)] if total else []
