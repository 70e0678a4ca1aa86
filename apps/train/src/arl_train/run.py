"""One training run, top to bottom: plan, start, train, check, summarise, tear down.

`arl_train.plan.prepare` decides everything from the config before anything starts; this module is the
lifecycle: start Ray, place the run on the cluster's nodes and check they see its files (`_place`:
arl_train.cluster, arl_train.storage), start the actors the plan names (the sample queue, one engine
actor per replica, the rollout actor over them, the trainer ranks), drive the steps (one trainer step
at a time, so the driver can print progress, checkpoint and stop cleanly on Ctrl-C), check the
engines' weights, write the summary, and tear down everything it started, Ray included, in `finally`.
An actor lost with its node or process fails the run naming it, its node and the checkpoint to resume.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from arl_train import mps, watchdog
from arl_train.checkpointing import latest_checkpoint_hint, save_checkpoint
from arl_train.cluster import NodePlan, lost_actor
from arl_train.errors import NodeLostError
from arl_train.metrics import MetricsLog, add_engine_phases, phase_medians, phases_line, plot, progress_line
from arl_train.plan import RunPlan, prepare, settle_transport
from arl_train.sections import AppConfig
from arl_train.weights_check import verify_engine_weights, weights_check_line

HEALTH_CHECK_S = 5.0
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
    # Median milliseconds of each phase of the syncs after the first (see `metrics.SYNC_PHASES`).
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
    # False when a trainer tensor held NaN or inf at the end (the engine's then does too: it is "equal").
    weights_finite: bool = True


def _await_step(
    ray: Any, step_ref: Any, rollout: Any, timeout_s: float, followers: list[Any] = ()
) -> dict[str, Any]:
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
            raise TimeoutError(f"a trainer step took longer than {timeout_s:.0f}s (run.step_timeout_s)")


def _check_followers(ray: Any, followers: list[Any]) -> None:
    """A follower rank's `follow` only returns when rank 0 stops the group: earlier, it failed."""
    finished, _ = ray.wait(list(followers), num_returns=len(followers), timeout=0) if followers else ([], [])
    for ref in finished:
        ray.get(ref)  # re-raises the rank's failure
        raise RuntimeError("a follower trainer rank left the group before the run ended")


@dataclass
class _Started:
    """What the lifecycle has started so far (what `_teardown` stops)."""

    reservation: Any = None
    queue: Any = None
    rollout: Any = None
    trainer: Any = None
    followers: list[Any] = field(default_factory=list)
    # The followers' `follow` calls: each returns only when rank 0 stops the group.
    following: list[Any] = field(default_factory=list)
    # Where trainer rank 0 runs (its `placement()`).
    where: dict[str, Any] = field(default_factory=dict)
    # The node of every actor (arl_train.cluster).
    nodes: NodePlan | None = None

    def parts(self) -> dict[str, tuple[Any, Any]]:
        """name -> (actor handle, node) of the actors a step waits on, for naming a lost one."""
        if self.nodes is None:
            return {}
        ranks = [self.trainer, *self.followers]
        return {
            f"trainer rank {i}": (a, self.nodes.trainer[i]) for i, a in enumerate(ranks) if a is not None
        } | ({"the rollout actor": (self.rollout, self.nodes.driver)} if self.rollout is not None else {})


def _place(
    ray: Any, plan: RunPlan, log: Callable[[str], None], started: _Started
) -> tuple[RunPlan, NodePlan]:
    """Reserve the GPUs and decide the node of every actor (arl_train.cluster); settle the transport
    between those nodes, and check every node sees the files it needs (arl_train.storage). Returns the
    plan with its config's transport settled, and the nodes."""
    from arl_train import cluster, storage
    from arl_train.placement import reserve, transport_between_nodes

    config = plan.config
    nodes = cluster.live_nodes()
    roles = {role: cluster.role_resource(config, role, nodes) for role in ("trainer", "rollout")}
    started.reservation = reservation = reserve(plan.layout, config.resources.placement_timeout_s, roles)
    where = cluster.plan_nodes(config, nodes, cluster.current_node_id())
    if reservation.trainer_pg is not None or reservation.shared_pg is not None:
        [rank0] = cluster.nodes_of_groups([reservation.trainer_pg or reservation.shared_pg], nodes)
        where = msgspec.structs.replace(where, trainer=[rank0] * plan.layout.trainer_ranks)
    if reservation.replica_pgs or reservation.shared_pg is not None:
        groups = reservation.replica_pgs or [reservation.shared_pg] * plan.layout.replicas
        where = msgspec.structs.replace(where, replicas=cluster.nodes_of_groups(groups, nodes))
    transport = transport_between_nodes(config.sync.transport, where.cross_host, where.weights_path())
    plan = settle_transport(plan, transport)
    config = plan.config
    if len(where.nodes) > 1:
        log(f"arl: nodes: {where.describe()}; weights over {transport!r}")
    storage.probe(
        where,
        storage.needs(config, plan.out_dir, plan.model_path, where),
        plan.out_dir,
        config.storage.shared_dir,
        config.storage.probe_timeout_s,
    )
    return plan, where


def _start(ray: Any, plan: RunPlan, log: Callable[[str], None], started: _Started) -> RunPlan:
    """Place the run (`_place`), then start the queue, the replicas, the rollout actor and the trainer
    ranks; returns the plan as placed."""
    from transformers import AutoTokenizer

    from arl.queue.ray_actor import create_queue_actor
    from arl_train import cluster
    from arl_train.actors import RolloutActor, TrainerActor
    from arl_train.engine_actor import MAX_CONCURRENCY, EngineActor
    from arl_train.placement import trainer_ranks

    plan, where = _place(ray, plan, log, started)
    started.nodes = where
    config, reservation = plan.config, started.reservation
    at_driver = cluster.on_node(where.driver)
    # The queue restores what a resumed checkpoint had queued (copied into its folder by `prepare`).
    started.queue = create_queue_actor(
        max_size=plan.budget.max_queue,
        persist_dir=str(plan.out_dir / "queue"),
        scheduling_strategy=at_driver["scheduling_strategy"],
    )
    on_cpu = not plan.layout.rollout_on_gpu
    engines = [
        ray.remote(EngineActor)
        .options(
            max_concurrency=MAX_CONCURRENCY,
            **reservation.replica_options(spec.index),
            **(cluster.on_node(where.replicas[spec.index]) if on_cpu else {}),
        )
        .remote(spec.kind, spec.config)
        for spec in plan.replicas
    ]
    workers = [cluster.on_node(node) for node in where.workers]
    # Loaded once here and handed to the rollout actor and its agent-loop workers (RolloutActor).
    tokenizer = AutoTokenizer.from_pretrained(plan.rollout.model_path)
    started.rollout = (
        ray.remote(num_cpus=0)(RolloutActor)
        .options(**at_driver)
        .remote(plan.rollout, tokenizer, started.queue, engines, workers)
    )
    log("arl: starting the rollout engine(s)…")
    ray.get(
        started.rollout.start.remote(
            initial_version=plan.initial_version,
            skip_tasks=plan.resume.get("tasks_started", 0),
            replay_tasks=plan.resume.get("tasks_in_flight", []),
        ),
        timeout=START_TIMEOUT_S,
    )
    # All ranks are constructed at once: they meet in one rendezvous. Ray merges `trainer_env` into the
    # run's environment for the trainer ranks alone.
    extra = {"runtime_env": {"env_vars": plan.trainer_env}} if plan.trainer_env else {}
    rank0 = where.trainer[0]
    # Ranks away from the driver meet on rank 0's node: its address, a port free there.
    meet = (
        cluster.rendezvous(rank0)
        if plan.layout.trainer_ranks > 1
        and (rank0.id != where.driver.id or len({n.id for n in where.trainer}) > 1)
        else None
    )
    on_cpu_trainer = not plan.layout.trainer_gpus
    actors = [
        ray.remote(TrainerActor)
        .options(
            **reservation.trainer_options(r.rank),
            **extra,
            **(cluster.on_node(where.trainer[r.rank]) if on_cpu_trainer else {}),
        )
        .remote(plan.trainer, started.queue, started.rollout, r)
        for r in trainer_ranks(plan.layout, meet)
    ]
    started.trainer, started.followers = actors[0], actors[1:]
    started.following = [a.follow.remote() for a in started.followers]
    started.where = ray.get(started.trainer.placement.remote(), timeout=START_TIMEOUT_S)
    _check_followers(ray, started.following)
    replicas = ray.get(started.rollout.replica_info.remote(), timeout=60)
    more = f" + {len(started.followers)} follower rank(s)" if started.followers else ""
    log(f"arl: trainer {started.where}{more} | replicas {replicas}")
    if config.trainer.save_final or config.trainer.save_every:  # no room: fail now, not at the end
        ray.get(started.trainer.check_checkpoint_space.remote(str(plan.out_dir / "checkpoint")), timeout=60)
    return plan


def _train(
    ray: Any, plan: RunPlan, started: _Started, metrics: MetricsLog, log: Callable[[str], None]
) -> None:
    """The step loop: one trainer step at a time, its metrics row written, a checkpoint every `save_every`."""
    config, total = plan.config, plan.config.trainer.total_steps
    for _ in range(plan.first_step, total):
        row = _await_step(
            ray, started.trainer.train_step.remote(), started.rollout, plan.timeouts.step_s, started.following
        )
        row["rollout"] = ray.get(started.rollout.stats.remote(), timeout=60)
        row["rollout"]["scheduler"] = ray.get(started.rollout.pop_scheduler_stats.remote(), timeout=60)
        add_engine_phases(row)
        metrics.write(row)
        log(progress_line(row, total) + phases_line(row))
        if config.trainer.save_every and row["step"] % config.trainer.save_every == 0:
            save_checkpoint(
                ray,
                started.trainer,
                started.rollout,
                started.queue,
                plan.out_dir / "checkpoints" / f"step_{row['step']}",
            )


def _finish(
    ray: Any,
    plan: RunPlan,
    started: _Started,
    rows: list[dict[str, Any]],
    began: float,
    log: Callable[[str], None],
) -> RunSummary:
    """After the last step: the weights check, the final checkpoint, the plot and summary.json."""
    check = verify_engine_weights(
        ray, started.trainer, started.rollout, plan.layout.replicas, plan.timeouts.step_s
    )
    log(weights_check_line(check))  # now, not only in the summary: the final checkpoint can still fail
    checkpoint = ""
    if plan.config.trainer.save_final:
        checkpoint = save_checkpoint(
            ray, started.trainer, started.rollout, started.queue, plan.out_dir / "checkpoint"
        )
    png = plot(rows, plan.out_dir / "reward.png")
    tenth = max(1, len(rows) // 10)
    summary = RunSummary(
        layout=msgspec.to_builtins(plan.layout),
        steps=len(rows),
        syncs=check["version"],
        samples_consumed=rows[-1]["samples_seen"],
        reward_first_tenth=_mean(rows[:tenth], "reward_mean"),
        reward_last_tenth=_mean(rows[-tenth:], "reward_mean"),
        weights_equal_after_sync=check["equal"],
        weights_max_abs_diff=check["max_abs_diff"],
        weights_prepacked=check["prepacked"],
        probe_logprob_max_abs_diff=check["probe_logprob_max_abs_diff"],
        sync_phases_ms=phase_medians(rows),
        weights_problems=check["problems"],
        weights_finite=check["finite"],
        wall_s=time.perf_counter() - began,
        output_dir=str(plan.out_dir),
        checkpoint=checkpoint,
        plot=str(png),
        rollout=rows[-1]["rollout"],
        trainer=started.where,
    )
    (plan.out_dir / "summary.json").write_bytes(msgspec.json.format(msgspec.json.encode(summary)))
    return summary


def _teardown(ray: Any, started: _Started, failed: bool) -> None:
    """Stop what `_start` started, each part bounded."""
    # After a failure, a dead peer can block a graceful stop: give it seconds, ray.shutdown ends the rest.
    grace = 5 if failed else 60
    if started.rollout is not None:
        _bounded_stop(ray, "rollout stop", started.rollout.stop.remote(), grace)
    if started.trainer is not None:
        _bounded_stop(ray, "trainer close", started.trainer.close.remote(), min(grace, 30))
    if started.following:  # rank 0's close released the followers; ray.shutdown ends any that are stuck
        _bounded_stop(ray, "follower trainer ranks' stop", started.following, min(grace, 30))
    if started.reservation is not None:
        started.reservation.release()


def _bounded_stop(ray: Any, what: str, refs: Any, timeout_s: float) -> None:
    """Wait for one part's stop; its failure is reported, never raised (it must not hide the run's own error)."""
    try:
        ray.get(refs, timeout=timeout_s)
    except Exception as exc:
        print(f"arl: {what} failed: {exc}", file=sys.stderr)


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
    """Train as `config` says; returns the run's summary (also written to output.dir/summary.json)."""
    began = time.perf_counter()
    plan = prepare(config)  # sets the run's environment in this process: before Ray is imported
    import ray

    log(f"arl: model {plan.model_path} | budget {plan.budget} | output {plan.out_dir}")
    log(f"arl: layout {msgspec.to_builtins(plan.layout)}")
    if plan.resume:
        log(f"arl: resuming at step {plan.first_step}, weight version {plan.initial_version}")
    guard = watchdog.start()  # every process of the run ends with the driver, even on SIGKILL
    daemon = _start_mps(plan, log) if config.resources.mps == "start" else None
    try:
        _init_ray(config, plan.env, log)
        metrics = MetricsLog(plan.out_dir / "metrics.jsonl")
        started = _Started()
        try:
            plan = _start(ray, plan, log, started)
            _train(ray, plan, started, metrics, log)
            return _finish(ray, plan, started, metrics.rows, began, log)
        except Exception as exc:  # an actor lost with its node or process: say which, where, how to resume
            lost = lost_actor(exc, started.parts())
            if lost is None:
                raise
            raise NodeLostError(lost + latest_checkpoint_hint(plan.out_dir)) from exc
        finally:
            metrics.close()
            _teardown(ray, started, failed=sys.exc_info()[0] is not None)
            ray.shutdown()
    finally:
        if daemon is not None:
            daemon.stop()
        guard.stop()


def _start_mps(plan: RunPlan, log: Callable[[str], None]) -> mps.MpsDaemon:
    """The run's own MPS control daemon (resources.mps='start'); its variables join the run's
    environment before Ray starts, so every process of the run is its client."""
    daemon = mps.start(plan.out_dir / "mps")
    plan.env.update(daemon.env)
    daemon.export()
    log(f"arl: MPS control daemon started (pipe {daemon.pipe_dir}, log {daemon.log_dir})")
    return daemon


def format_summary(summary: RunSummary) -> str:
    return json.dumps(msgspec.to_builtins(summary), indent=2)
