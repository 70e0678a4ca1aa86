"""Data-parallel trainer ranks: rank 0 leads, the other ranks follow its collectives.

With N > 1 trainer ranks (one per GPU, or gloo ranks on the CPU), each holding an `FSDPPolicy` in one
torch.distributed group, only rank 0 runs the trainer loop: it alone reads the queue (so every sample
is consumed exactly once), owns the `WeightPublisher` and talks to the rollout side. Every operation
that is a collective under FSDP2 — a training step (with its proximal and reference forwards), a
reference forward on its own, the weight gather of a sync, a checkpoint, the end-of-run weights check
and probe — goes through `LeaderPolicy`, which first broadcasts a command (with the step's whole batch:
`PackedPolicy.train_step` wants the same batch on every rank and takes its share of the balanced
packing plan itself), then runs its own part. Ranks 1.. sit in `follow`, running the same command on
their shard until rank 0 sends "stop". A driver therefore talks to rank 0 only, and watches the
followers' `follow` calls for failures (apps/train runs one Ray actor per rank this way). Colocated
ranks also free GPU memory together when rank 0 says so: after each step (`release_memory_together`)
and, with an overlapped optimizer offload, once its copies have landed (`settle_memory_together`).

Weights leave the group one of two ways. Split layouts: rank 0 alone sends (to every replica) and
the other ranks only take part in the gathers. Colocated layouts with one replica per trainer GPU:
every rank holds each gathered tensor anyway, so each sends it to the replica on its own GPU (CUDA
IPC, no copy across GPUs); rank 0's `GroupPublisher` starts the followers' senders and tells the
rollout side which sender each replica joins.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from arl.sync import SyncStats
from arl.trainer.batch import TrainBatch
from arl.trainer.memory import release_cached_gpu_memory
from arl.trainer.publisher import RolloutControl, WeightPublisher, finish_stream


def _broadcast(command: tuple[Any, ...] | None) -> tuple[Any, ...]:
    box = [command]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class LeaderPolicy:
    """Rank 0's view of an `FSDPPolicy`: every collective is announced to the followers first.

    The trainer loop and `TrainerActor` use it exactly like a single-device policy.
    """

    def __init__(
        self, policy: Any, followers_send: bool = False, after_step: Callable[[], None] | None = None
    ) -> None:
        self.inner = policy
        self.followers_send = followers_send  # the sync is announced by `GroupPublisher` instead
        self.after_step = after_step  # run by every rank after each training step (`release_memory_together`)
        self.stopped = False

    def __getattr__(self, name: str) -> Any:  # device, model, config, optimizer, … (non-collective)
        return getattr(self.inner, name)

    @property
    def version(self) -> float:
        return self.inner.version

    @version.setter
    def version(self, value: float) -> None:
        self.inner.version = value

    def train_step(
        self, batch: TrainBatch, mini_batch_rows: int, routes: torch.Tensor | None = None
    ) -> dict[str, float]:
        # MoE routes (router replay) travel with the batch: every rank replays the same experts.
        _broadcast(("train", batch, mini_batch_rows, self.inner.version, routes))
        metrics = self.inner.train_step(batch, mini_batch_rows, routes=routes)
        if self.after_step is not None:
            self.after_step()
        return metrics

    def settle_optimizer_offload(self) -> float:
        """Colocated, with the optimizer state's overlapped offload: every rank settles its way out and
        hands the memory back (`settle_memory_together`) before the replicas' KV caches wake. Returns
        rank 0's wait, which includes the slowest rank's (the barrier)."""
        _broadcast(("settle",))
        t0 = time.perf_counter()
        settle_memory_together(self.inner)
        return time.perf_counter() - t0

    def named_parameters_for_sync(self) -> Any:
        if not self.followers_send:
            _broadcast(("sync",))  # the followers join every gather of the stream rank 0 sends
        return self.inner.named_parameters_for_sync()

    def parameters_for_check(self) -> Any:
        """The gathered stream of a sync, for a weights check (the followers join every gather)."""
        _broadcast(("sync",))
        return self.inner.iter_sync_parameters()

    def log_probs(self, batch: TrainBatch, routes: torch.Tensor | None = None) -> torch.Tensor:
        _broadcast(("log_probs", batch, routes))
        return self.inner.log_probs(batch, routes=routes)

    def reference_log_probs(self, batch: TrainBatch, routes: torch.Tensor | None = None) -> torch.Tensor:
        # (train_step runs the reference forward itself; this is the same pass on its own, e.g. a probe)
        _broadcast(("ref_log_probs", batch, routes))
        return self.inner.reference_log_probs(batch, routes=routes)

    def save(self, directory: Any, trainer_state: dict[str, Any]) -> Any:
        _broadcast(("save", directory, trainer_state))
        return self.inner.save(directory, trainer_state)

    def stop(self) -> None:
        """Release the followers (their `follow` returns); once."""
        if not self.stopped:
            self.stopped = True
            _broadcast(("stop",))


class GroupPublisher:
    """Rank 0's publisher when every trainer rank sends to the replica on its own device.

    `addresses[k]` is rank k's sender (rank 0's own is `own`); replica k loads from rank k. A sync
    announces itself to the followers (they start sending the same gathered stream), then runs rank
    0's part exactly like a `WeightPublisher`.
    """

    def __init__(self, own: WeightPublisher, addresses: list[str]) -> None:
        self.own = own
        self.addresses = addresses

    @property
    def address(self) -> str:
        return self.own.address

    def expect_receivers(self, n: int) -> None:
        if n != len(self.addresses):
            raise RuntimeError(
                f"{len(self.addresses) - n} replica(s) died: with one replica per trainer rank, rank k sends "
                f"only to replica k, so the sync needs all {len(self.addresses)} replicas"
            )

    async def publish(self, named_tensors: Any, version: int, rollout: RolloutControl) -> SyncStats:
        _broadcast(("send", version))
        return await self.own.publish(named_tensors, version, rollout, replica_addresses=self.addresses)

    def close(self) -> None:
        self.own.close()


def sender_addresses(own: WeightPublisher) -> list[str]:
    """Every rank's sender address, in rank order (a collective: all ranks call it)."""
    addresses: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(addresses, own.address)
    return addresses


def _send_own(policy: Any, publisher: WeightPublisher | None, version: int) -> None:
    """A follower's part of a `GroupPublisher` sync: send the gathered stream to its own replica."""
    if publisher is None:
        raise RuntimeError(
            f"trainer rank {policy.rank}: rank 0 asked it to send weights, but it has no sender"
        )
    stream = policy.iter_sync_parameters()
    try:
        publisher.sender.send(stream, version)
    finally:
        finish_stream(stream)  # a failed send still joins the gathers left


def release_memory_together() -> None:
    """Colocated ranks, after a step: every rank hands its cached CUDA blocks back (its replica wakes
    on the same GPU next), and the barrier keeps rank 0 from waking the replicas before all have."""
    release_cached_gpu_memory()
    dist.barrier()


def settle_memory_together(policy: Any) -> None:
    """Colocated ranks, just before the replicas' KV caches wake: every rank waits for its optimizer
    state's overlapped way out to land, frees that GPU memory and hands it back with the rest of its
    cached blocks; the barrier keeps rank 0 from waking the replicas before all have."""
    policy.settle_optimizer_offload()
    release_memory_together()


def follow(
    policy: Any, publisher: WeightPublisher | None = None, after_step: Callable[[], None] | None = None
) -> dict[str, int]:
    """A follower rank's loop: run rank 0's commands on this shard until "stop"; returns counts.
    `publisher`: this rank's own sender, for layouts where every rank sends (`GroupPublisher`);
    `after_step`: what rank 0's `LeaderPolicy` runs after each training step, run here too."""
    counts: dict[str, int] = {}
    while True:
        command = _broadcast(None)
        op = command[0]
        counts[op] = counts.get(op, 0) + 1
        if op == "stop":
            return counts
        if op == "train":
            _, batch, rows, version, routes = command
            policy.version = version
            policy.train_step(batch, rows, routes=routes)
            if after_step is not None:
                after_step()
        elif op == "settle":
            settle_memory_together(policy)
        elif op == "sync":
            policy.drain_sync_parameters()
        elif op == "send":
            _send_own(policy, publisher, command[1])
        elif op == "log_probs":
            policy.log_probs(command[1], routes=command[2])
        elif op == "ref_log_probs":
            policy.reference_log_probs(command[1], routes=command[2])
        elif op == "save":
            policy.save(command[1], command[2])
        else:
            raise ValueError(f"trainer rank {policy.rank}: unknown command {op!r} from rank 0")


def probe_batch(prompt_ids: list[int], token_ids: list[int]) -> TrainBatch:
    """A one-row batch whose trained tokens are `token_ids` after `prompt_ids` (for `log_probs`)."""
    ids = torch.tensor([prompt_ids + token_ids])
    t = ids.shape[1]
    loss = torch.zeros(1, t)
    loss[0, len(prompt_ids) :] = 1.0
    return TrainBatch(
        input_ids=ids,
        attention_mask=torch.ones(1, t, dtype=torch.long),
        loss_mask=loss,
        behaviour_logp=torch.zeros(1, t),
        token_versions=torch.full((1, t), -1, dtype=torch.long),
        rewards=torch.zeros(1),
        group_index=torch.zeros(1, dtype=torch.long),
        response_lengths=torch.tensor([len(token_ids)]),
        trajectory_index=torch.zeros(1, dtype=torch.long),
    )
