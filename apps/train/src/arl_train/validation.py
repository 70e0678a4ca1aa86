"""The one validation pass of a config, at load, before Ray or any actor starts.

`validate(config)` checks every value and returns the config with its layout resolved, or raises
`ConfigError` naming the dotted key of the first offending value: the packages' own checks of the
fields they declare (`package_checks`, each error mapped to the app's key), ranges, cross-field rules
and files that must exist of the app's own keys (this module), impossible layouts
(`placement.check_layout`). Each rule lives in one place: a package's check is not repeated here.
`load_config` calls it, so the CLI exits 2 on a bad value instead of failing (or hanging) inside an
actor. `check_machine` (the devices must exist here) is separate so that a config can be inspected on
any machine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from arl.queue.errors import QueueError
from arl.queue.persistence import read_snapshot, snapshot_path
from arl_train.errors import ConfigError
from arl_train.errors import require as _require
from arl_train.package_checks import check_borrowed, check_packages
from arl_train.placement import check_layout, layout_of, resolve
from arl_train.sections import AppConfig
from arl_train.storage import resolve_output_dir
from arl_train.tiny_model import MODEL_SHAPES

DTYPES = ("float32", "bfloat16", "float16")


def _at_least(config: Any, section: str, key: str, low: float) -> None:
    value = getattr(getattr(config, section), key)
    _require(value >= low, f"{section}.{key}", value, f"must be >= {low}")


def _positive(config: Any, section: str, key: str) -> None:
    value = getattr(getattr(config, section), key)
    _require(value > 0, f"{section}.{key}", value, "must be > 0")


def _device(key: str, value: str) -> None:
    kind, _, index = value.partition(":")
    _require(
        kind in ("cpu", "cuda") and (not index or index.isdigit()),
        key,
        value,
        "must be 'cpu', 'cuda' or 'cuda:N'",
    )


def _cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def validate(config: AppConfig) -> AppConfig:
    """`config` with its layout resolved (`placement.resolve`) if every value is usable; else raise
    `ConfigError` naming the key."""
    check_borrowed(config)  # first: the app's rules below read these values
    _check_values(config)
    check_layout(config)
    config = resolve(resolve_output_dir(config))
    check_packages(config)
    return config


def _check_values(config: AppConfig) -> None:
    """Ranges, files and cross-field rules of the app's own keys (the layout's: `check_layout`)."""
    _require(config.seed >= 0, "seed", config.seed, "must be >= 0")
    # model
    m = config.model
    _require(m.dtype in DTYPES, "model.dtype", m.dtype, f"must be one of {list(DTYPES)}")
    _require(m.seed >= 0, "model.seed", m.seed, "must be >= 0")
    if m.path.startswith("builtin:"):
        _require(
            m.path.removeprefix("builtin:") in MODEL_SHAPES,
            "model.path",
            m.path,
            f"unknown built-in model; available: {['builtin:' + name for name in MODEL_SHAPES]}",
        )
    elif config.ray.address is None:
        _require(
            (Path(m.path) / "config.json").is_file(),
            "model.path",
            m.path,
            "must be builtin:<shape> or a Hugging Face model folder (no config.json there)",
        )
    # data
    d = config.data
    _at_least(config, "data", "size", 1)
    if not d.source.startswith(("builtin:", "harbor:", "swebench:")):  # Harbor's: arl.harbor.tasks checks
        _require(
            d.source.endswith((".jsonl", ".parquet")),
            "data.source",
            d.source,
            "must be builtin:NAME or a .jsonl/.parquet file",
        )
        _require(Path(d.source).is_file(), "data.source", d.source, "file does not exist")
    # rollout
    r = config.rollout
    for key in ("max_concurrent_per_replica", "n", "max_tokens"):
        _at_least(config, "rollout", key, 1)
    _require(
        r.max_tokens < r.max_model_len,
        "rollout.max_tokens",
        r.max_tokens,
        f"must be < rollout.max_model_len ({r.max_model_len}) to leave room for the prompt",
    )
    _positive(config, "rollout", "temperature")  # log probs are taken at this temperature: 0 is undefined
    _require(0 < r.top_p <= 1, "rollout.top_p", r.top_p, "must be in (0, 1]")
    # The engine's own check allows vLLM's "auto"; the app casts the weights it syncs to this dtype.
    _require(r.dtype != "auto", "rollout.dtype", r.dtype, f"must be named, one of {list(DTYPES)}")
    _positive(config, "rollout", "generate_timeout_s")
    _device("rollout.device", r.device)
    # actor (its TrainerConfig fields' own ranges: package_checks; actor.optim's and actor.algorithm's:
    # at conversion)
    a = config.actor
    if a.reference_path:
        _require(
            a.algorithm.kl_coef > 0,
            "actor.reference_path",
            a.reference_path,
            "is the KL's reference policy: it needs actor.algorithm.kl_coef > 0",
        )
        if config.ray.address is None:
            _require(
                (Path(a.reference_path) / "config.json").is_file(),
                "actor.reference_path",
                a.reference_path,
                "must be a Hugging Face model folder (no config.json there)",
            )
    _device("actor.device", a.device)
    _require(
        a.router_replay == "off" or r.return_routed_experts,
        "actor.router_replay",
        a.router_replay,
        "needs rollout.return_routed_experts = true (the engine must report the experts it chose)",
    )
    # async_training (require_batches, trigger_parameter_sync_step, max_version_lag: arl-trainer's)
    at = config.async_training
    _require(
        at.staleness_threshold >= 0,
        "async_training.staleness_threshold",
        at.staleness_threshold,
        "must be >= 0 (0 = on-policy / stream off-policy; > 0 = async, see the mode table)",
    )
    required = at.require_batches * a.ppo_mini_batch_size
    max_required = int(required * (at.staleness_threshold + 1) * at.trigger_parameter_sync_step)
    _require(
        max_required >= required,
        "async_training.staleness_threshold",
        at.staleness_threshold,
        f"gives max_required={max_required} < required={required}",
    )
    # trainer
    t = config.trainer
    _at_least(config, "trainer", "total_steps", 1)
    _at_least(config, "trainer", "save_every", 0)
    _at_least(config, "trainer", "profile_step", 0)
    if t.resume_from:
        _check_resume(config)
    # sync: its timeout is arl-sync's; transport and bucket size against the layout: check_layout
    # ray
    if config.ray.num_cpus is not None:
        _require(config.ray.num_cpus >= 1, "ray.num_cpus", config.ray.num_cpus, "must be >= 1 (or unset)")
    # output
    _require(bool(config.output.dir), "output.dir", config.output.dir, "must not be empty")
    _require(
        not Path(config.output.dir).is_file(), "output.dir", config.output.dir, "is a file, not a folder"
    )
    _check_cluster(config)


def _check_cluster(config: AppConfig) -> None:
    """The `cluster` and `storage` sections: node resource names, the shared folder, the run folder in it."""
    for role in ("trainer", "rollout", "sandbox"):
        key = f"{role}_resource"
        name = getattr(config.cluster, key)
        _require(
            bool(name) and name.replace("_", "").replace("-", "").isalnum(),
            f"cluster.{key}",
            name,
            "must be a Ray resource name (letters, digits, '_' or '-')",
        )
    s = config.storage
    _positive(config, "storage", "probe_timeout_s")
    if not s.shared_dir:
        return
    _require(
        Path(s.shared_dir).is_absolute(),
        "storage.shared_dir",
        s.shared_dir,
        "must be an absolute path (the same on every node)",
    )
    _require(
        Path(s.shared_dir).is_dir(),
        "storage.shared_dir",
        s.shared_dir,
        "is not a folder on the driver's node (mount the shared folder here too)",
    )
    out = Path(config.output.dir)
    if out.is_absolute():
        _require(
            out.resolve().is_relative_to(Path(s.shared_dir).resolve()),
            "output.dir",
            config.output.dir,
            f"must be inside storage.shared_dir ({s.shared_dir}), or relative to it, so every node sees the "
            "run folder",
        )


def _check_resume(config: AppConfig) -> None:
    t, a = config.trainer, config.actor
    state_file = Path(t.resume_from) / "trainer_state.json"
    _require(
        state_file.is_file(),
        "trainer.resume_from",
        t.resume_from,
        "is not an arl checkpoint (no trainer_state.json)",
    )
    try:
        state = json.loads(state_file.read_text())
        step = int(state["step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"invalid config: trainer.resume_from = {t.resume_from!r}: unreadable trainer_state.json ({exc})",
            "trainer.resume_from",
        ) from None
    _require(
        step < t.total_steps,
        "trainer.total_steps",
        t.total_steps,
        f"must exceed the checkpoint's step ({step}) to train further",
    )
    if a.algorithm.kl_coef > 0 and not a.reference_path:
        _check_recorded_reference(t.resume_from, state.get("reference_path"), config.ray.address is None)
    _check_snapshot(t.resume_from)


def check_machine(config: AppConfig) -> None:
    """The devices the config names or its layout needs must exist on this machine (in-process Ray
    only). Separate from `validate` so a layout can be loaded and inspected on any machine; the CLI
    calls both before anything starts."""
    _check_devices(config)
    if config.resources.mps == "start":
        from arl_train.mps import CONTROL

        _require(
            shutil.which(CONTROL) is not None,
            "resources.mps",
            "start",
            f"needs {CONTROL} on PATH (it ships with the NVIDIA driver); or set resources.mps='off'",
        )


def _check_recorded_reference(checkpoint: str, recorded: Any, local: bool) -> None:
    """A resumed KL run keeps the reference of its first run (the checkpoint's `reference_path`)."""
    _require(
        isinstance(recorded, str) and bool(recorded),
        "trainer.resume_from",
        checkpoint,
        "records no reference_path (a checkpoint from before KL support): set actor.reference_path to the "
        "run's original base model (the checkpoint itself is not the reference)",
    )
    if local:
        _require(
            (Path(recorded) / "config.json").is_file(),
            "trainer.resume_from",
            checkpoint,
            f"its reference model {recorded!r} (trainer_state.json reference_path) is not a model folder "
            "any more: set actor.reference_path",
        )


def _check_snapshot(checkpoint: str) -> None:
    """The checkpoint's queued samples must load whole (checksum, schema); never half-restore them."""
    # checkpointing.save_checkpoint copies the snapshot in after the weights: without it the checkpoint was
    # cut short, and resuming would silently lose the samples it had queued.
    _require(
        snapshot_path(checkpoint).is_file(),
        "trainer.resume_from",
        checkpoint,
        f"is incomplete: no {snapshot_path(checkpoint).name} (the run ended while saving it); "
        "use an earlier checkpoint",
    )
    try:
        read_snapshot(checkpoint)
    except QueueError as exc:
        raise ConfigError(
            f"invalid config: trainer.resume_from = {checkpoint!r}: refusing its queue snapshot: {exc}",
            "trainer.resume_from",
        ) from None


def _check_devices(config: AppConfig) -> None:
    """GPUs named or requested must exist, where this process can see them (in-process Ray only)."""
    if config.ray.address is not None:
        return  # a remote cluster's devices are not visible from here
    named = [
        (k, v)
        for k, v in (("actor.device", config.actor.device), ("rollout.device", config.rollout.device))
        if v.startswith("cuda")
    ]
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
    total = layout_of(config).total_gpus
    return [("resources", total)] if total else []
