"""The fully async system at scale, on a virtual clock: arl's real Rollouter, ServerManager,
MessageQueue and Trainer loop, driven by simulated engines and a simulated trainer whose costs come
from a calibration file (apps/bench/calibration/h200.toml).

What is real: task feeding under the concurrency/staleness budget, the load balancer, partial-rollout
abort and resume, the queue, batch assembly, the sync protocol (pause, publish, resume, re-armed
staleness budget), every metric. What is simulated: an engine's decode speed (`CostModelEngine`:
aggregate tokens/s as a function of its running batch, prefill stalls) and the trainer's compute and
sync time (`arl.trainer.testing`). Data-parallel training is assumed to scale linearly over trainer
GPUs; each replica is one GPU (tensor parallel 1).

Layouts on G GPUs: `colocated` = mode a (synchronous: generate a batch, train, sync) with G replicas
and a G-GPU trainer taking turns, plus the engines' wake-up per step; modes `a`–`d` = split, G/2
replicas and a G/2-GPU trainer (`rollout_fraction`). The shared-GPU schedules (apps/train's
`resources.shared_gpu`) put G replicas and a G-GPU trainer on the same GPUs in mode d: `time_sliced` =
the replicas generate until the trainer's batch is in, then their in-flight generations are aborted
(resumed after the sync) and they stay paused while it trains, plus the wake-up per step;
`concurrent` = both at once, the replicas decoding at `share.engine` × their rate while the trainer
computes and the trainer training at `share.trainer` × its rate (the calibration's measured shares of
one GPU run by both at once; the trainer's share assumes the replicas are busy whenever it trains,
which the staleness budget makes nearly so).

`token_unit` > 1 simulates in units of that many tokens (lengths, rates and prefill all divided by
it): the fluid model is linear in tokens, so times are unchanged while the samples the trainer
assembles are `token_unit` times shorter (memory and CPU time of large simulations).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time as real_time
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from arl.rollout.testing import DecodeCost

CALIBRATION_DIR = Path(__file__).resolve().parents[2] / "calibration"
MODES: dict[str, dict[str, Any]] = {
    "colocated": {"trigger_parameter_sync_step": 1, "staleness_threshold": 0.0, "partial_rollout": False},
    "a": {"trigger_parameter_sync_step": 1, "staleness_threshold": 0.0, "partial_rollout": False},
    "b": {"trigger_parameter_sync_step": 2, "staleness_threshold": 0.0, "partial_rollout": False},
    "c": {"trigger_parameter_sync_step": 1, "staleness_threshold": 0.5, "partial_rollout": False},
    "d": {"trigger_parameter_sync_step": 1, "staleness_threshold": 0.5, "partial_rollout": True},
    "time_sliced": {"trigger_parameter_sync_step": 1, "staleness_threshold": 0.5, "partial_rollout": True},
    "concurrent": {"trigger_parameter_sync_step": 1, "staleness_threshold": 0.5, "partial_rollout": True},
}
SHARED_MODES = ("time_sliced", "concurrent")
# The reference's published speedup of fully async over colocated (verl fully_async_policy, 128 GPUs).
REFERENCE_SPEEDUP_128 = (2.35, 2.67)


class TrainCost(msgspec.Struct, kw_only=True):
    tokens_per_s_per_gpu: float
    step_overhead_s: float = 0.0


class SyncCost(msgspec.Struct, kw_only=True):
    split_s: float
    colocated_s: float
    colocated_wake_s: float = 0.0


class ShareCost(msgspec.Struct, kw_only=True):
    """What each side keeps of its rate alone while both run at once on one GPU (raw_vllm_rates.py
    --share: share_engine, share_trainer). Defaults: issue #30's one-H200 measurement (0.6B shape,
    short prompts, vLLM at 0.30 of the memory)."""

    engine: float = 0.64
    trainer: float = 0.63


class Calibration(msgspec.Struct, kw_only=True):
    decode: DecodeCost
    train: TrainCost
    sync: SyncCost
    share: ShareCost = msgspec.field(default_factory=ShareCost)
    meta: dict[str, Any] = msgspec.field(default_factory=dict)


def load_calibration(path: Path | str) -> Calibration:
    """Read a calibration TOML; a missing or mistyped field is named."""
    path = Path(path)
    if not path.is_file() and (CALIBRATION_DIR / f"{path}.toml").is_file():
        path = CALIBRATION_DIR / f"{path}.toml"
    try:
        return msgspec.convert(tomllib.loads(path.read_text()), Calibration)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read calibration {path}: {exc}") from None
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid calibration {path}: {exc}") from None


class SimWorkload(msgspec.Struct, kw_only=True):
    """The long-tail workload the simulation runs (same meaning as the app's settings)."""

    source: str = "builtin:longtail?median=659&p99_ratio=8&max=8192"
    prompt_len: int = 64
    n: int = 8
    # Prompts per trainer step, per GPU of the layout (so the load grows with the cluster).
    prompts_per_step_per_gpu: float = 4.0
    # Or a fixed number of prompts per step (> 0 overrides the per-GPU figure).
    prompts_per_step: int = 0
    steps: int = 8
    warmup_steps: int = 2
    token_unit: int = 1
    seed: int = 0

    def prompts(self, gpus: int) -> int:
        return self.prompts_per_step or max(1, round(self.prompts_per_step_per_gpu * gpus))


class SimResult(msgspec.Struct, kw_only=True):
    mode: str
    gpus: int
    replicas: int
    trainer_gpus: int
    samples_per_s: float
    tokens_per_s: float
    engine_idle_fraction: float
    trainer_idle_fraction: float
    sync_s_per_step: float
    staleness_mean: float
    virtual_s: float
    real_s: float


def _tasks(workload: SimWorkload, size: int) -> list[Any]:
    from arl.rollout import load_tasks

    tasks = load_tasks(workload.source, seed=workload.seed, size=size)
    rng = random.Random(workload.seed)
    unit = workload.token_unit
    prompt_len = max(1, math.ceil(workload.prompt_len / unit))
    for t in tasks:
        sampling = t.metadata.get("sampling") or {}
        if "max_tokens" in sampling:
            sampling["max_tokens"] = max(1, math.ceil(sampling["max_tokens"] / unit))
        t.metadata["prompt_ids"] = [rng.randrange(1, 1000) for _ in range(prompt_len)]
    return tasks


def _scaled(cost: DecodeCost, unit: int) -> DecodeCost:
    return msgspec.structs.replace(
        cost,
        tokens_per_s=[r / unit for r in cost.tokens_per_s],
        prefill_tokens_per_s=cost.prefill_tokens_per_s / unit,
    )


async def _simulate(
    mode: str,
    gpus: int,
    calib: Calibration,
    workload: SimWorkload,
    rollout_fraction: float,
    staleness: float | None,
) -> SimResult:
    import arl.rollout.rollouter as rollouter_module
    import arl.trainer.trainer as trainer_module
    from arl.proxy.types import SamplingParams
    from arl.queue import MessageQueue
    from arl.rollout import Rollouter, ServerManager, compute_budget, cycle_tasks
    from arl.rollout.testing import CostModelEngine, TokenAgentLoop, virtual_time
    from arl.trainer import Trainer, TrainerConfig
    from arl.trainer.testing import SimPolicy, SimPublisher, SimRolloutControl, SimSource, TrainerTimeline
    from arl_train.colocated import ColocatedSource

    loop = asyncio.get_running_loop()
    knobs = dict(MODES[mode])
    if staleness is not None and knobs["staleness_threshold"] > 0:  # modes c and d only
        knobs["staleness_threshold"] = staleness
    colocated = mode == "colocated"
    shared = mode in SHARED_MODES
    if colocated or shared:
        replicas, trainer_gpus = gpus, gpus
    else:
        replicas = max(1, round(gpus * rollout_fraction))
        trainer_gpus = gpus - replicas
        if trainer_gpus < 1:
            raise ValueError(f"{gpus} GPUs with rollout_fraction {rollout_fraction} leave no trainer GPU")
    unit = workload.token_unit
    prompts = workload.prompts(gpus)
    cost = _scaled(calib.decode, unit)
    engines = [CostModelEngine(cost) for _ in range(replicas)]
    budget = compute_budget(
        require_batches=1,
        ppo_mini_batch_size=prompts,
        staleness_threshold=knobs["staleness_threshold"],
        trigger_parameter_sync_step=knobs["trigger_parameter_sync_step"],
        replicas=replicas,
        per_replica=max(1, calib.decode.max_num_seqs // workload.n),
    )
    size = prompts * (workload.steps + 2) * 2
    with virtual_time(loop, rollouter_module, trainer_module):
        for e in engines:
            await e.start()
        manager = ServerManager(engines, generate_timeout_s=1e9, clock=loop.time)
        queue = MessageQueue(budget.max_queue)
        rollouter = Rollouter(
            tasks=cycle_tasks(_tasks(workload, size), seed=workload.seed),
            manager=manager,
            sink=queue,
            agent_loops={"single_turn": TokenAgentLoop()},
            sampling_params=SamplingParams(max_tokens=1),
            n=workload.n,
            budget=budget,
            partial_rollout=knobs["partial_rollout"],
            drain_timeout_s=1e9,
        )
        timeline = _SharedTimeline(engines, calib.share.engine) if mode == "concurrent" else TrainerTimeline()
        sleeps = colocated or mode == "time_sliced"  # the engines wake after the trainer had the GPU
        control = SimRolloutControl(
            rollouter, timeline, resume_extra_s=calib.sync.colocated_wake_s if sleeps else 0.0
        )
        source: Any = SimSource(queue, timeline)
        if mode == "time_sliced":  # once the step's prompts are taken, in-flight generations are aborted
            source = ColocatedSource(source, rollouter.pause, prompts)  # (they resume after the sync)
        train_share = calib.share.trainer if mode == "concurrent" else 1.0
        trainer = Trainer(
            SimPolicy(
                timeline,
                train_tokens_per_s=calib.train.tokens_per_s_per_gpu * train_share * trainer_gpus / unit,
                step_overhead_s=calib.train.step_overhead_s,
            ),
            source,
            control,
            SimPublisher(sync_s=calib.sync.colocated_s if colocated or shared else calib.sync.split_s),
            TrainerConfig(
                ppo_mini_batch_size=prompts,
                trigger_parameter_sync_step=knobs["trigger_parameter_sync_step"],
                batch_timeout_s=1e9,
            ),
            pad_token_id=0,
        )
        started_real = real_time.perf_counter()
        run_task = asyncio.create_task(rollouter.run())
        rows: list[dict[str, Any]] = []
        mark: dict[str, float] = {}
        try:
            for step in range(workload.steps):
                rows.append(await trainer.train_step())
                if run_task.done():
                    run_task.result()
                    raise RuntimeError("the simulated rollouter stopped")
                if step + 1 == workload.warmup_steps:
                    mark = {"t": loop.time(), "train_s": timeline.train_s, "sync": control.sync_s_total}
                    mark |= manager.utilization()
            await timeline.settle()
        finally:
            run_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):  # a failure was raised above already
                await run_task
            for e in engines:
                await e.stop()
        end = manager.utilization()
        window = rows[workload.warmup_steps :]
        span = loop.time() - mark["t"]
        busy = end["engine_busy_s"] - mark["engine_busy_s"]
        return SimResult(
            mode=mode,
            gpus=gpus,
            replicas=replicas,
            trainer_gpus=trainer_gpus,
            samples_per_s=sum(1 for r in window for _ in range(prompts)) / span,
            tokens_per_s=(end["engine_generated_tokens"] - mark["engine_generated_tokens"]) * unit / span,
            engine_idle_fraction=1.0 - busy / (span * replicas),
            trainer_idle_fraction=1.0 - (timeline.train_s - mark["train_s"]) / span,
            sync_s_per_step=(control.sync_s_total - mark["sync"]) / len(window),
            staleness_mean=sum(r["staleness_mean"] for r in window) / len(window),
            virtual_s=loop.time(),
            real_s=real_time.perf_counter() - started_real,
        )


class _SharedTimeline:
    """The trainer's compute on GPUs it shares with running replicas: while it passes, the replicas
    decode at `engine_share` of their rate."""

    def __init__(self, engines: list[Any], engine_share: float) -> None:
        from arl.trainer.testing import TrainerTimeline

        self._inner = TrainerTimeline()
        self.engines = engines
        self.engine_share = engine_share

    @property
    def train_s(self) -> float:
        return self._inner.train_s

    def charge(self, seconds: float) -> None:
        self._inner.charge(seconds)

    async def settle(self) -> None:
        if self._inner.debt_s <= 0:
            return
        for e in self.engines:
            e.set_speed(self.engine_share)
        try:
            await self._inner.settle()
        finally:
            for e in self.engines:
                e.set_speed(1.0)


def simulate(
    mode: str,
    gpus: int,
    calib: Calibration,
    workload: SimWorkload,
    *,
    rollout_fraction: float = 0.5,
    staleness: float | None = None,
) -> SimResult:
    """Run one layout on a fresh virtual-clock event loop (`staleness` overrides modes c/d's 0.5)."""
    from arl.rollout.testing import VirtualClockLoop

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {sorted(MODES)}")
    if workload.steps <= workload.warmup_steps:
        raise ValueError("workload.steps must exceed workload.warmup_steps")
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(_simulate(mode, gpus, calib, workload, rollout_fraction, staleness))
    finally:
        loop.close()


def project(
    calib: Calibration,
    workload: SimWorkload,
    gpu_counts: list[int],
    *,
    modes: tuple[str, ...] = ("colocated", "d"),
    rollout_fraction: float = 0.5,
    staleness: float | None = None,
    log: Any = print,
) -> list[dict[str, Any]]:
    """Per GPU count: every mode's result and its speedup over colocated."""
    table = []
    for gpus in gpu_counts:
        results = {
            m: simulate(m, gpus, calib, workload, rollout_fraction=rollout_fraction, staleness=staleness)
            for m in modes
        }
        base = results["colocated"].samples_per_s if "colocated" in results else float("nan")
        row = {
            "gpus": gpus,
            "results": {m: msgspec.to_builtins(r) for m, r in results.items()},
            "speedup_over_colocated": {m: r.samples_per_s / base for m, r in results.items()},
        }
        log(
            f"sim {gpus:>4} GPUs: "
            + " | ".join(
                f"{m} {r.samples_per_s:.2f} samples/s ({r.samples_per_s / base:.2f}×)"
                for m, r in results.items()
            )
            + f"  [{sum(r.real_s for r in results.values()):.0f} s real]"
        )
        table.append(row)
    return table
