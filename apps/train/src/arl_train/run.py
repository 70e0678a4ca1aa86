"""One training run: start Ray, build the actors, drive the steps, write metrics, plot, checkpoint.

The driver stays thin: it asks the trainer actor for one step at a time (so it can print progress and
stop cleanly on Ctrl-C), and everything it starts is torn down in `finally`, Ray included.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from arl.queue.persistence import SNAPSHOT_FILENAME
from arl_train import watchdog
from arl_train.config import AppConfig
from arl_train.metrics import MetricsLog, plot, progress_line

HEALTH_CHECK_S = 5.0
PROBE_PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
# float32 on both sides: kernels differ (vLLM's fused CPU ops vs torch), identical weights agree to ~1e-6.
PROBE_TOLERANCE = 1e-4
START_TIMEOUT_S = 600.0


class RunSummary(msgspec.Struct, kw_only=True):
    layout: dict[str, Any]
    steps: int
    syncs: int
    samples_consumed: int
    reward_first_tenth: float
    reward_last_tenth: float
    weights_equal_after_sync: bool
    # 0.0 when every engine tensor is bit-identical to the trainer's; NaN (null in JSON) when some
    # differ: the digest check names them (weights_problems) but cannot say by how much.
    weights_max_abs_diff: float
    # Engine tensors not readable as parameters (vLLM CPU prepacks linear layers); covered by the probe.
    weights_prepacked: int
    probe_logprob_max_abs_diff: float
    # Median milliseconds of each phase of the syncs after the first (see `SYNC_PHASES`).
    sync_phases_ms: dict[str, float]
    # Engine tensor names the check could not match or found different (empty when equal).
    weights_problems: list[str]
    wall_s: float
    output_dir: str
    checkpoint: str
    plot: str
    rollout: dict[str, Any]
    # Where trainer rank 0 ran: device, CUDA_VISIBLE_DEVICES, its sender's address, rank / world size.
    trainer: dict[str, Any] = {}


def _environment(out_dir: Path) -> dict[str, str]:
    """Environment for every process of the run: caches out of $HOME, no hub, quiet Ray."""
    cache = Path(os.environ.get("ARL_CACHE_DIR", "/tmp/arl-cache"))
    env = {
        "HF_HOME": str(cache / "hf"),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        # Keep the terminal for progress lines: engine/library chatter only when it is an error.
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
        "TRANSFORMERS_VERBOSITY": os.environ.get("TRANSFORMERS_VERBOSITY", "error"),
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", "ignore::DeprecationWarning,ignore::FutureWarning"),
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        # Under `uv run`, Ray would otherwise zip the working tree and start every worker through uv.
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        "TOKENIZERS_PARALLELISM": "false",
        # Harbor's terminus-2 imports LiteLLM, which would fetch its model cost map from the network.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "ARL_LEDGER_DIR": str(out_dir / "ledger"),  # sample uids produced / consumed (arl_train.ledger)
    }
    return env


def prepare_model(config: AppConfig, out_dir: Path) -> Path:
    """The model folder: built by the project for `builtin:<shape>` (tiny_model.MODEL_SHAPES), else the given path."""
    if config.model.path.startswith("builtin:"):
        from arl_train.tiny_model import build_builtin_model

        return build_builtin_model(config.model.path.removeprefix("builtin:"), out_dir / "model", seed=config.model.seed)
    path = Path(config.model.path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model.path {path} is not a Hugging Face model folder (no config.json)")
    return path


def _await_step(ray: Any, step_ref: Any, rollout: Any, timeout_s: float, followers: list[Any] = ()) -> dict[str, Any]:
    """Wait for a trainer step while checking every few seconds that the rollout side and the
    follower trainer ranks (their `follow` calls) are alive, so a dead engine, feed loop or rank
    fails the run at once instead of starving the trainer."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, _ = ray.wait([step_ref], timeout=HEALTH_CHECK_S)
        if done:
            return ray.get(step_ref)
        ray.get(rollout.stats.remote(), timeout=60)  # re-raises the rollout side's failure
        _check_followers(ray, followers)
        if time.monotonic() > deadline:
            raise TimeoutError(f"a trainer step took longer than {timeout_s:.0f}s (harbor.step_timeout_s)")


def _check_followers(ray: Any, followers: list[Any]) -> None:
    """A follower rank's `follow` only returns when rank 0 stops the group: earlier, it failed."""
    finished, _ = ray.wait(list(followers), num_returns=len(followers), timeout=0) if followers else ([], [])
    for ref in finished:
        ray.get(ref)  # re-raises the rank's failure
        raise RuntimeError("a follower trainer rank left the group before the run ended")


def _start_trainer(ray: Any, config: AppConfig, layout: Any, reservation: Any, model_path: Path, queue: Any,
                   rollout: Any, resume_state: dict[str, int] | None) -> tuple[Any, list[Any], list[Any]]:
    """The trainer ranks (one actor each, all constructed at once: they meet in one rendezvous);
    returns rank 0, the follower actors and their `follow` calls."""
    from arl_train.actors import TrainerActor
    from arl_train.allocator import trainer_allocator_env
    from arl_train.placement import trainer_ranks

    # Ray merges these variables into the run's own (`_environment`) for the trainer ranks alone.
    env = trainer_allocator_env(config.actor.expandable_segments) if layout.trainer_gpus else {}
    extra = {"runtime_env": {"env_vars": env}} if env else {}
    actors = [
        ray.remote(TrainerActor)
        .options(**reservation.trainer_options(r.rank), **extra)
        .remote(config, str(model_path), queue, rollout, resume_state, r)
        for r in trainer_ranks(layout)
    ]
    return actors[0], actors[1:], [a.follow.remote() for a in actors[1:]]


def _prepare_resume(config: AppConfig, out_dir: Path) -> dict[str, int]:
    """The trainer state of `trainer.resume_from` ({} for a fresh run); its queued samples are put
    where the new queue will restore them from."""
    queue_dir = out_dir / "queue"
    (queue_dir / SNAPSHOT_FILENAME).unlink(missing_ok=True)  # never restore an earlier run's samples
    if not config.trainer.resume_from:
        return {}
    checkpoint = Path(config.trainer.resume_from)
    state_file = checkpoint / "trainer_state.json"
    if not state_file.is_file():
        raise FileNotFoundError(f"trainer.resume_from {checkpoint} is not an arl checkpoint (no trainer_state.json)")
    state = json.loads(state_file.read_text())
    if state["step"] >= config.trainer.total_steps:
        raise ValueError(
            f"the checkpoint is at step {state['step']}: raise trainer.total_steps above it to train further"
        )
    queue_dir.mkdir(parents=True, exist_ok=True)
    if (checkpoint / SNAPSHOT_FILENAME).is_file():
        shutil.copy2(checkpoint / SNAPSHOT_FILENAME, queue_dir / SNAPSHOT_FILENAME)
    return state


def _verify_engine_weights(ray: Any, trainer: Any, rollout: Any, replicas: int, step_timeout_s: float) -> dict[str, Any]:
    """Sync the final weights if the last step did not, then check engine == trainer on every replica.

    Engine tensors (every TP rank's shard, fused as vLLM fuses them, in the engine's dtype) must be
    bit-identical to the trainer's. Each side fingerprints its tensors where they live and only the
    fingerprints travel (`arl.rollout.engines.weights_digest`): megabytes, not the model twice over,
    so a 7B model is checked like a tiny one. It names the tensors that differ, not by how much.
    Tensors the engine prepacks (vLLM's CPU build) are checked through its outputs: its log probs on
    a probe sequence must equal the trainer's. Where nothing is prepacked (GPU builds) the probe is
    reported, not required: a bf16 engine's kernels differ from the fp32 trainer's.
    """
    ray.get(trainer.final_sync.remote(), timeout=step_timeout_s)
    live = ray.get(rollout.stats.remote(), timeout=60)["replicas_healthy"]  # a dead replica is not checked
    checked = [i for i in range(replicas) if i in live]
    digests = [ray.get(rollout.engine_digests.remote(i), timeout=300) for i in checked]
    results = ray.get(trainer.check_engine_digests.remote(digests), timeout=step_timeout_s)
    tensors_equal = all(r["equal"] for r in results)
    prepacked = sum(len(r["prepacked"]) for r in results)
    problems = [f"replica{i}:{k}:{n}" for i, r in zip(checked, results, strict=True)
                for k in ("unmatched", "mismatched") for n in r[k]][:20]
    tokens, engine_logp, engine_version = ray.get(rollout.probe.remote(PROBE_PROMPT, 16), timeout=120)
    trainer_logp = ray.get(trainer.log_probs.remote(PROBE_PROMPT, tokens), timeout=120)
    probe_diff = max(abs(a - b) for a, b in zip(engine_logp, trainer_logp, strict=True))
    trainer_version = ray.get(trainer.version.remote(), timeout=60)
    engine_versions = ray.get(rollout.stats.remote(), timeout=60)["engine_versions"]
    probe_ok = probe_diff < PROBE_TOLERANCE or prepacked == 0
    return {
        "equal": tensors_equal and probe_ok and set(engine_versions) == {trainer_version},
        # Bit-identical tensors differ by 0; the digests cannot say by how much others differ.
        "max_abs_diff": 0.0 if tensors_equal else float("nan"),
        "prepacked": prepacked,
        "problems": problems,
        "probe_logprob_max_abs_diff": probe_diff,
        "version": trainer_version,
    }


def _weights_check_line(check: dict[str, Any]) -> str:
    if check["equal"]:
        return f"arl: engine weights equal to the trainer's at version {check['version']}"
    return (f"arl: engine weights differ from the trainer's at version {check['version']}: "
            f"{', '.join(check['problems']) or 'probe log-prob diff %.3g' % check['probe_logprob_max_abs_diff']}")


#: Sync phases in a step's metrics (seconds): the trainer's pause / transfer / resume around the
#: engine side's receive / in-place load (the slowest worker), and in colocated mode sleep and wake.
SYNC_PHASES = {
    "pause": "sync_pause_s",
    "transfer": "sync_transfer_s",
    "receive": "sync_receive_s",
    "load": "sync_load_s",
    "reset_cache": "sync_reset_cache_s",
    "resume": "sync_resume_s",
    "total": "sync_s",
    "sleep": "colocated_sleep_s",
    "wake_weights": "colocated_wake_weights_s",
    "offload_wait": "colocated_offload_wait_s",
    "wake_kv": "colocated_wake_kv_s",
}


def _add_engine_phases(row: dict[str, Any]) -> None:
    """Copy the engine side's timings of this step's sync (if it synced) into the metrics row."""
    last = row["rollout"].get("last_sync") or {}
    if row.get("sync_s"):
        row["sync_receive_s"] = last.get("receive_s", 0.0)
        row["sync_load_s"] = last.get("apply_s", 0.0)
        row["sync_reset_cache_s"] = last.get("reset_cache_s", 0.0)
        if "inplace" in last:  # 1.0: loaded through the model's loaders in place; 0.0: reload_weights
            row["sync_inplace"] = last["inplace"]


def _phases_line(row: dict[str, Any]) -> str:
    if not row.get("sync_s"):
        return ""
    parts = [f"{name} {row[key] * 1e3:.1f}" for name, key in SYNC_PHASES.items() if name != "total" and key in row]
    return " | sync ms: " + ", ".join(parts)


def _phase_medians(rows: list[dict[str, Any]]) -> dict[str, float]:
    import statistics

    synced = [r for r in rows if r.get("sync_s")]
    later = synced[1:] or synced  # the first sync also builds groups and maps buffers
    out = {}
    for name, key in SYNC_PHASES.items():
        values = [r[key] for r in later if key in r]
        if values:
            out[name] = round(statistics.median(values) * 1e3, 3)
    return out


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return sum(r[key] for r in rows) / max(1, len(rows))


# Ray gives a local node 30 s (fixed) to register; on a loaded machine (a 2-core box under CI or other
# jobs) that start can miss it although nothing is wrong, so a local start is retried.
RAY_LOCAL_START_ATTEMPTS = 3


def _init_ray(config: AppConfig, env: dict[str, str], log: Callable[[str], None]) -> None:
    """Connect to `config.ray.address`, or start a local Ray (retried when its node misses Ray's startup wait)."""
    import ray

    local = config.ray.address is None
    for attempt in range(1, RAY_LOCAL_START_ATTEMPTS + 1):
        try:
            ray.init(
                address=config.ray.address,
                num_cpus=config.ray.num_cpus if local else None,
                include_dashboard=False,
                log_to_driver=True,
                runtime_env={"env_vars": env},
                _temp_dir=str(Path(os.environ.get("ARL_RAY_TMP", "/tmp/arl-ray"))) if local else None,
            )
            return
        except Exception as e:  # Ray raises a bare Exception for this one
            if not local or "timed out during startup" not in str(e) or attempt == RAY_LOCAL_START_ATTEMPTS:
                raise
            log(f"arl: the local Ray node did not register in time (attempt {attempt}); starting it again")
            ray.shutdown()


def run(config: AppConfig, *, log: Any = print) -> RunSummary:
    started = time.perf_counter()
    out_dir = Path(config.output.dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_bytes(msgspec.json.format(msgspec.json.encode(config)))
    env = _environment(out_dir)
    os.environ.update(env)  # before importing Ray: it reads some of these at import time

    import ray

    from arl.queue.ray_actor import create_queue_actor
    from arl_train.actors import RolloutActor, engine_config, run_budget
    from arl_train.engine_actor import MAX_CONCURRENCY, EngineActor
    from arl_train.placement import check_model, layout_of, reserve

    from arl_train.harbor_section import check_harbor, run_timeouts

    check_harbor(config)  # a misconfigured Harbor agent/environment fails here, by name
    timeouts = run_timeouts(config)
    resume_state = _prepare_resume(config, out_dir)
    model_path = Path(config.trainer.resume_from) if resume_state else prepare_model(config, out_dir)
    layout = layout_of(config)
    check_model(layout, model_path)
    budget = run_budget(config)
    log(f"arl: model {model_path} | budget {budget} | output {out_dir}")
    log(f"arl: layout {msgspec.to_builtins(layout)}")
    if resume_state:
        log(f"arl: resuming at step {resume_state['step']}, weight version {resume_state['version']}")

    guard = watchdog.start()  # every process of the run ends with the driver, even on SIGKILL
    _init_ray(config, env, log)
    metrics = MetricsLog(out_dir / "metrics.jsonl")
    rollout = trainer = reservation = None
    following: list[Any] = []
    try:
        reservation = reserve(layout, config.resources.placement_timeout_s)
        # The queue restores what a resumed checkpoint had queued (copied into its folder above).
        queue = create_queue_actor(max_size=budget.max_queue, persist_dir=str(out_dir / "queue"))
        initial_version = resume_state.get("version", 0)
        engines = []
        for i in range(layout.replicas):
            kind, engine_cfg = engine_config(config, str(model_path), i, initial_version)
            engines.append(
                ray.remote(EngineActor)
                .options(max_concurrency=MAX_CONCURRENCY, **reservation.replica_options(i))
                .remote(kind, engine_cfg)
            )
        rollout = ray.remote(num_cpus=0)(RolloutActor).remote(config, str(model_path), queue, engines)
        log("arl: starting the rollout engine(s)…")
        start = rollout.start.remote(
            initial_version=initial_version, skip_tasks=resume_state.get("tasks_started", 0),
            replay_tasks=resume_state.get("tasks_in_flight", []),
        )
        ray.get(start, timeout=START_TIMEOUT_S)
        trainer, followers, following = _start_trainer(
            ray, config, layout, reservation, model_path, queue, rollout, resume_state or None)
        where = ray.get(trainer.placement.remote(), timeout=START_TIMEOUT_S)
        _check_followers(ray, following)
        replicas = ray.get(rollout.replica_info.remote(), timeout=60)
        log(f"arl: trainer {where}{f' + {len(followers)} follower rank(s)' if followers else ''} | replicas {replicas}")
        if config.trainer.save_final or config.trainer.save_every:  # no room: fail now, not at the end
            ray.get(trainer.check_checkpoint_space.remote(str(out_dir / "checkpoint")), timeout=60)
        total = config.trainer.total_steps

        def save_checkpoint(directory: Path) -> str:
            """Weights + optimizer + trainer state + the queued samples + the dataset position."""
            # Read before the queue snapshot: a task still in flight here is either in the snapshot or replayed.
            stats = ray.get(rollout.stats.remote(), timeout=60)
            position = {"tasks_started": int(stats["next_task"]), "tasks_in_flight": stats["tasks_in_flight"]}
            path = ray.get(
                trainer.save_checkpoint.remote(str(directory), position),
                timeout=START_TIMEOUT_S,
            )
            snapshot = ray.get(queue.snapshot.remote(), timeout=120)
            shutil.copy2(snapshot, Path(path) / SNAPSHOT_FILENAME)
            return path

        for _ in range(resume_state.get("step", 0), total):
            row = _await_step(ray, trainer.train_step.remote(), rollout, timeouts.step_s, following)
            row["rollout"] = ray.get(rollout.stats.remote(), timeout=60)
            _add_engine_phases(row)
            metrics.write(row)
            log(progress_line(row, total) + _phases_line(row))
            if config.trainer.save_every and row["step"] % config.trainer.save_every == 0:
                save_checkpoint(out_dir / "checkpoints" / f"step_{row['step']}")
        rows = metrics.rows
        check = _verify_engine_weights(ray, trainer, rollout, layout.replicas, timeouts.step_s)
        log(_weights_check_line(check))  # now, not only in the summary: the final checkpoint can still fail
        checkpoint = save_checkpoint(out_dir / "checkpoint") if config.trainer.save_final else ""
        png = plot(rows, out_dir / "reward.png")
        tenth = max(1, len(rows) // 10)
        summary = RunSummary(
            layout=msgspec.to_builtins(layout),
            steps=len(rows),
            syncs=check["version"],
            samples_consumed=rows[-1]["samples_seen"],
            reward_first_tenth=_mean(rows[:tenth], "reward_mean"),
            reward_last_tenth=_mean(rows[-tenth:], "reward_mean"),
            weights_equal_after_sync=check["equal"],
            weights_max_abs_diff=check["max_abs_diff"],
            weights_prepacked=check["prepacked"],
            probe_logprob_max_abs_diff=check["probe_logprob_max_abs_diff"],
            sync_phases_ms=_phase_medians(rows),
            weights_problems=check["problems"],
            wall_s=time.perf_counter() - started,
            output_dir=str(out_dir),
            checkpoint=checkpoint,
            plot=str(png),
            rollout=rows[-1]["rollout"],
            trainer=where,
        )
        (out_dir / "summary.json").write_bytes(msgspec.json.format(msgspec.json.encode(summary)))
        return summary
    finally:
        metrics.close()
        # After a failure, a dead peer can block a graceful stop: give it seconds, ray.shutdown ends the rest.
        grace = 60 if sys.exc_info()[0] is None else 5
        if rollout is not None:
            try:
                ray.get(rollout.stop.remote(), timeout=grace)
            except Exception as exc:  # teardown must not hide the run's own error
                print(f"arl: rollout stop failed: {exc}", file=sys.stderr)
        if trainer is not None:
            try:
                ray.get(trainer.close.remote(), timeout=min(grace, 30))
            except Exception as exc:
                print(f"arl: trainer close failed: {exc}", file=sys.stderr)
        if following:  # rank 0's close released them; ray.shutdown ends any that are stuck
            try:
                ray.get(following, timeout=min(grace, 30))
            except Exception as exc:
                print(f"arl: follower trainer ranks did not stop cleanly: {exc}", file=sys.stderr)
        if reservation is not None:
            reservation.release()
        ray.shutdown()
        guard.stop()


def format_summary(summary: RunSummary) -> str:
    return json.dumps(msgspec.to_builtins(summary), indent=2)
