"""The Ray actors of a run: the trainer side here, the rollout side in `rollout_actor` (re-exported).

Both are async actors, each built from its spec (`arl_train.actor_specs`, derived once by the plan):
never the whole config. Each engine replica is its own actor (`engine_actor.EngineActor`, placed on its
GPUs by `placement`); the rollout actor drives them through `RemoteEngine`s. The trainer drives the
weight sync by calling the rollout actor's pause / update_weights / resume; samples travel through
the arl-queue actor as msgspec bytes. A trainer rank is built from its layout's row (`TrainerShape`)
by tables instead of branches: the policy (`POLICIES`: one process, or FSDP2 ranks led by rank 0), who
sends the weights (rank 0 to every replica, or each rank to the replica on its GPU), and the GPU-sharing
schedule (`SCHEDULES`: in colocated mode the trainer puts the replicas to sleep while it trains,
`colocated`; on time-sliced shared GPUs it yields them the GPU between batches, `shared_gpu`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arl.trainer.group import (
    GroupPublisher,
    LeaderPolicy,
    follow,
    probe_batch,
    release_memory_together,
    sender_addresses,
)
from arl_train import ledger
from arl_train.actor_specs import TrainerSpec, reference_path_of
from arl_train.colocated import ColocatedControl, ColocatedSource
from arl_train.package_configs import engine_config, run_budget
from arl_train.placement import TrainerRank, node_ip, sender_host
from arl_train.rollout_actor import RPC_TIMEOUT_S, RolloutActor
from arl_train.shared_gpu import (
    TimeSlicedControl,
    TimeSlicedSource,
    explain_out_of_memory,
    limit_trainer_memory,
)

__all__ = [
    "POLICIES",
    "SCHEDULES",
    "RolloutActor",
    "TrainerActor",
    "engine_config",
    "reference_path_of",
    "run_budget",
]


def _limit_threads() -> None:
    # The trainer shares a small machine with the engines: keep torch from oversubscribing cores.
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))


class _RolloutHandle:
    """`RolloutControl` over the rollout actor's handle, with a timeout on every call."""

    def __init__(self, handle: Any, pause_timeout_s: float = RPC_TIMEOUT_S, publisher: Any = None) -> None:
        self.handle = handle
        self.pause_timeout_s = pause_timeout_s  # a non-partial pause drains active prompts
        self.publisher = publisher

    async def pause(self) -> None:
        live_receivers = await asyncio.wait_for(self.handle.pause.remote(), self.pause_timeout_s)
        if self.publisher is not None:  # a dead replica's receivers skip this sync
            self.publisher.expect_receivers(live_receivers)

    async def update_weights(
        self, sync_address: str | list[str], sync_config_json: bytes, version: int
    ) -> None:
        await asyncio.wait_for(
            self.handle.update_weights.remote(sync_address, sync_config_json, version), RPC_TIMEOUT_S
        )

    async def resume(self, queued_samples: int) -> None:
        await asyncio.wait_for(self.handle.resume.remote(queued_samples), RPC_TIMEOUT_S)


@dataclass
class _Policy:
    """A rank's policy as its `POLICIES` row builds it."""

    policy: Any
    # Rank 0's part: (the policy the trainer loop drives, the publisher it syncs through) from this
    # rank's own publisher and, when every rank sends, all the ranks' sender addresses.
    lead: Callable[[Any, list[str] | None], tuple[Any, Any]]
    # Called by the leader after each step (FSDP colocated: every rank frees its cached blocks together).
    after_step: Callable[[], Any] | None = None


def _single_policy(spec: TrainerSpec, rank: TrainerRank) -> _Policy:
    from arl.trainer import HFPolicy

    policy = HFPolicy(
        spec.model_path,
        spec.trainer,
        device=spec.device,
        dtype=spec.dtype,
        seed=spec.seed,
        reference_path=spec.reference_path,
    )
    return _Policy(policy, lead=lambda own, addresses: (policy, own))


def _fsdp_ranks(spec: TrainerSpec, rank: TrainerRank) -> _Policy:
    """FSDP2 data parallel: fp32 master shards, cast to the rollout dtype per gather; rank 0 leads the
    group's collectives (`LeaderPolicy`), and where every rank sends, they send together (`GroupPublisher`)."""
    policy = _fsdp_policy(spec, rank)
    # Colocated: every rank frees its cached blocks before the replicas on their GPUs wake.
    after_step = release_memory_together if spec.layout.sleeps else None

    def lead(own: Any, addresses: list[str] | None) -> tuple[Any, Any]:
        per_rank = addresses is not None
        return (
            LeaderPolicy(policy, followers_send=per_rank, after_step=after_step),
            GroupPublisher(own, addresses) if per_rank else own,
        )

    return _Policy(policy, lead, after_step)


# How a rank's policy is built, by `TrainerShape.policy`.
POLICIES: dict[str, Callable[[TrainerSpec, TrainerRank], _Policy]] = {
    "single": _single_policy,
    "fsdp": _fsdp_ranks,
}


@dataclass
class _Wiring:
    """The trainer loop's sample source and rollout control, as a `SCHEDULES` row wraps them."""

    source: Any
    control: Any
    # The shared-GPU control whose phase timings a step reports (None: the replicas never sleep).
    sleeping: Any = None
    # time_sliced: the source that hands the GPU back after a step without a sync.
    shared_source: Any = None


def _split(spec: TrainerSpec, source: Any, control: Any, rollout: Any, settle: Any) -> _Wiring:
    return _Wiring(source, control)


def _colocated(spec: TrainerSpec, source: Any, control: Any, rollout: Any, settle: Any) -> _Wiring:
    """Take turns: the replicas sleep while this trainer runs."""
    sleeping = ColocatedControl(
        control, rollout, spec.sleep_level, RPC_TIMEOUT_S, settle_trainer_memory=settle
    )
    return _Wiring(ColocatedSource(source, sleeping.sleep, _required(spec)), sleeping, sleeping)


def _time_sliced(spec: TrainerSpec, source: Any, control: Any, rollout: Any, settle: Any) -> _Wiring:
    """The replicas generate until the batch is in, then sleep."""
    sleeping = TimeSlicedControl(
        control, rollout, spec.sleep_level, RPC_TIMEOUT_S, settle_trainer_memory=settle
    )
    shared = TimeSlicedSource(source, sleeping, _required(spec))
    return _Wiring(shared, sleeping, sleeping, shared)


def _required(spec: TrainerSpec) -> int:
    return spec.trainer.require_batches * spec.trainer.ppo_mini_batch_size


# How the trainer shares the GPUs with the replicas, by `TrainerShape.schedule` ("concurrent": both stay
# resident, the loop's source and control as they are; the rank caps its memory, `TrainerActor`).
SCHEDULES: dict[str, Callable[..., _Wiring]] = {
    "split": _split,
    "colocated": _colocated,
    "time_sliced": _time_sliced,
    "concurrent": _split,
}


class TrainerActor:
    def __init__(self, spec: TrainerSpec, queue_handle: Any, rollout_handle: Any, rank: Any = None) -> None:
        from transformers import AutoTokenizer

        from arl.queue.ray_actor import QueueClient
        from arl.trainer import Trainer, WeightPublisher

        _limit_threads()
        self.spec = spec
        shape, layout = spec.shape, spec.layout
        self.rank = rank or TrainerRank()  # the data-parallel seam: rank / world / rendezvous address
        self.beside_resident_replica = shape.schedule == "concurrent" and bool(layout.trainer_gpus)
        if self.beside_resident_replica:  # before the model takes any memory
            limit_trainer_memory(spec.trainer_memory_fraction)
        # The KL's reference: recorded in every checkpoint so a resumed run keeps the original base model.
        self.reference_path = spec.reference_path
        self.follower = self.rank.rank > 0  # ranks 1.. only follow rank 0's collectives (arl.trainer.group)
        self.trainer = None
        built = POLICIES[shape.policy](spec, self.rank)
        self.policy, self.after_step = built.policy, built.after_step
        if spec.resume is not None:  # model_path is the checkpoint: every rank restores its optimizer (shard)
            self.policy.load_optimizer(Path(spec.model_path))
        host = sender_host(spec.sync.transport)  # where the replicas' workers can reach the sender
        # "per_rank": every rank sends to the workers of the replica on its own device; "rank0": rank 0
        # alone sends, to every worker of every replica.
        per_rank = shape.sender == "per_rank"
        receivers = layout.receivers_per_rank if per_rank else layout.receivers
        self.publisher = (
            WeightPublisher(spec.sync, num_receivers=receivers, host=host)
            if per_rank or not self.follower
            else None
        )
        addresses = sender_addresses(self.publisher) if per_rank else None  # a collective: every rank joins
        if self.follower:
            return
        self.policy, publisher = built.lead(self.publisher, addresses)
        # Colocated/time-sliced: the optimizer state's way out runs beside the replicas' weight wake and the
        # sync, settled before their KV caches wake (FSDP ranks together: arl.trainer.group).
        settle = self.policy.settle_optimizer_offload if spec.trainer.optimizer_offload_overlap else None
        wiring = SCHEDULES[shape.schedule](
            spec,
            QueueClient(queue_handle),
            _RolloutHandle(rollout_handle, spec.pause_rpc_s, publisher),
            rollout_handle,
            settle,
        )
        self.colocated, self.shared_source = wiring.sleeping, wiring.shared_source
        tokenizer = AutoTokenizer.from_pretrained(spec.model_path)
        self.trainer = Trainer(
            self.policy,
            wiring.source,
            wiring.control,
            publisher,
            spec.trainer,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        )
        self.trainer.source = ledger.RecordingSource(self.trainer.source, lambda: self.trainer.step + 1)
        if spec.resume is not None:
            self.trainer.restore(spec.resume)

    async def follow(self) -> dict[str, int]:
        """Ranks 1..: run rank 0's collectives until it stops the group (a thread: the actor stays responsive)."""
        if not self.follower:
            raise RuntimeError("follow() is for trainer ranks 1..; rank 0 runs the trainer loop")
        return await asyncio.to_thread(follow, self.policy, self.publisher, self.after_step)

    async def train_step(self) -> dict[str, Any]:
        from arl.trainer.profiling import profiled_step

        step = self.trainer.step + 1
        recording = (
            profiled_step(Path(self.spec.profile_dir), step)
            if step == self.spec.profile_step
            else contextlib.nullcontext()
        )
        memory = (
            explain_out_of_memory(self.spec.oom_advice)
            if self.beside_resident_replica
            else contextlib.nullcontext()
        )
        with recording, memory:
            metrics = await self.trainer.train_step()
        if self.shared_source is not None:  # a step without a sync hands the GPU back now
            await self.shared_source.end_step()
        if self.colocated is not None:
            timings = self.colocated.pop_timings()
            metrics.update(timings)
            # The replicas were put to sleep inside the batch wait: report it as its own phase.
            inside = ("colocated_sleep_s", "shared_pause_s", "shared_sleep_s")
            metrics["wait_s"] = max(0.0, metrics["wait_s"] - sum(timings.get(k, 0.0) for k in inside))
        return metrics

    async def placement(self) -> dict[str, Any]:
        """Where this rank runs: its device (and on a GPU the card's memory), CUDA_VISIBLE_DEVICES, its
        CUDA allocator setting, the sender's address, its node's address and the group's rendezvous."""
        import torch

        device = getattr(self.policy, "device", "")
        on_cuda = torch.device(device).type == "cuda" if device else False
        return {
            "device": str(device),
            "gpu_memory_gib": torch.cuda.get_device_properties(device).total_memory / 2**30
            if on_cuda
            else 0.0,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "cuda_alloc_conf": os.environ.get("PYTORCH_ALLOC_CONF")
            or os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "sync_address": self.publisher.address if self.publisher is not None else "",
            "rank": self.rank.rank,
            "world_size": self.rank.world_size,
            "node": node_ip(),
            # Where the data-parallel ranks met ("" for one rank).
            "rendezvous": f"{self.rank.master_addr}:{self.rank.master_port}"
            if self.rank.world_size > 1
            else "",
        }

    async def final_sync(self) -> dict[str, Any]:
        """Sync now unless the last step already did, so the engines serve the final weights."""
        if self.trainer.step % self.spec.trainer.trigger_parameter_sync_step == 0:
            return {}
        return await self.trainer.sync()

    async def check_checkpoint_space(self, directory: str) -> int:
        """Raise `CheckpointError` now if a checkpoint at `directory` would not fit on its disk, so a run
        learns it at its start rather than after training; returns the bytes a checkpoint takes."""
        from arl.trainer.checkpoint_space import require_space

        need = self.policy.checkpoint_nbytes()
        require_space(Path(directory), need)
        return need

    async def save_checkpoint(self, directory: str, extra_state: dict[str, int]) -> str:
        reference = {"reference_path": self.reference_path} if self.reference_path else {}
        return str(self.policy.save(Path(directory), self.trainer.state() | extra_state | reference))

    async def log_probs(self, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
        """The trainer's log probs of `token_ids` after `prompt_ids` (temperature as configured)."""
        import torch

        from arl.trainer.algorithms import token_log_probs

        if self.rank.world_size > 1:  # a collective forward through the sharded model (packed path)
            logp = self.policy.log_probs(probe_batch(prompt_ids, token_ids))
            return logp[0, len(prompt_ids) :].tolist()
        ids = torch.tensor([prompt_ids + token_ids], device=self.policy.device)
        with torch.no_grad():
            logits = self.policy.model(input_ids=ids).logits
        return token_log_probs(logits, ids, self.spec.trainer.temperature)[0, len(prompt_ids) :].tolist()

    async def version(self) -> int:
        return self.trainer.version

    async def check_engine_digests(self, replicas: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """Compare every replica's weight fingerprints (per TP rank) with this trainer's weights, in one
        pass over them (under FSDP2 the gathers of a sync, the follower ranks joining)."""
        from arl.rollout.engines.weights_digest import compare_digests_replicas

        if self.rank.world_size > 1:
            stream = self.policy.parameters_for_check()
        else:
            stream = self.policy.named_parameters_for_sync()
        return await asyncio.to_thread(compare_digests_replicas, stream, replicas)

    async def close(self) -> None:
        if self.rank.world_size > 1 and not self.follower:  # rank 0 of a group: release the followers
            self.policy.stop()
        if self.publisher is not None:
            self.publisher.close()


def _fsdp_policy(spec: TrainerSpec, rank: TrainerRank) -> Any:
    """This rank's `FSDPPolicy`, joining the group at rank 0's rendezvous (NCCL on GPUs, gloo on the CPU)."""
    import torch

    from arl.trainer.distributed import DistributedSpec
    from arl.trainer.fsdp import FSDPPolicy

    on_gpu = spec.layout.trainer_gpus > 0
    # Ranks meeting at a node's address (not loopback) bind the interface of their own node's address.
    local = "" if rank.master_addr.startswith("127.") else node_ip()
    distributed = DistributedSpec(
        address=rank.master_addr,
        port=rank.master_port,
        rank=rank.rank,
        world_size=rank.world_size,
        local_address=local,
        local_rank=0 if on_gpu else None,  # Ray shows each rank only its own GPU
        backend=None if on_gpu else "gloo",
        # Followers wait in a broadcast while rank 0 waits for its batch: allow a whole step and more.
        timeout_s=max(1800.0, 2 * spec.step_timeout_s),
    )
    sync_dtype = None if spec.rollout_dtype == "float32" else getattr(torch, spec.rollout_dtype, None)
    return FSDPPolicy(
        spec.model_path,
        spec.trainer,
        distributed,
        seed=spec.seed,
        sync_dtype=sync_dtype,
        reference_path=spec.reference_path,
    )
