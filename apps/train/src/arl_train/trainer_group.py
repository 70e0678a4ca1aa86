"""Data-parallel trainer ranks in the app: rank 0 leads, the other ranks follow its collectives.

With `resources.trainer_gpus = N > 1` (or `resources.trainer_cpu_ranks = N > 1` on the CPU) the app
starts N `TrainerActor`s, one per GPU, each holding an `FSDPPolicy` in one torch.distributed group
(NCCL on GPUs, gloo on the CPU). Only rank 0 runs the trainer loop: it alone reads the queue (so every
sample is consumed exactly once), owns the `WeightPublisher` and talks to the rollout side. Every
operation that is a collective under FSDP2 — a training step (with its proximal and reference
forwards), a reference forward on its own, the weight gather of a sync, a checkpoint, the end-of-run
weights and probe — goes through `LeaderPolicy`, which first broadcasts a
command (with the step's whole batch: `PackedPolicy.train_step` wants the same batch on every rank and
takes its share of the balanced packing plan itself), then runs its own part. Ranks 1.. sit in
`follow`, running the same command on their shard until rank 0 sends "stop". The driver therefore
talks to rank 0 only, and watches the followers' `follow` calls for failures.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from arl.trainer.batch import TrainBatch


def _broadcast(command: tuple[Any, ...] | None) -> tuple[Any, ...]:
    box = [command]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class LeaderPolicy:
    """Rank 0's view of an `FSDPPolicy`: every collective is announced to the followers first.

    The trainer loop and `TrainerActor` use it exactly like a single-device policy.
    """

    def __init__(self, policy: Any) -> None:
        self.inner = policy
        self.stopped = False

    def __getattr__(self, name: str) -> Any:  # device, model, config, optimizer, … (non-collective)
        return getattr(self.inner, name)

    @property
    def version(self) -> float:
        return self.inner.version

    @version.setter
    def version(self, value: float) -> None:
        self.inner.version = value

    def train_step(self, batch: TrainBatch, mini_batch_rows: int, routes: torch.Tensor | None = None) -> dict[str, float]:
        # MoE routes (router replay) travel with the batch: every rank replays the same experts.
        _broadcast(("train", batch, mini_batch_rows, self.inner.version, routes))
        return self.inner.train_step(batch, mini_batch_rows, routes=routes)

    def named_parameters_for_sync(self) -> Any:
        _broadcast(("sync",))  # the followers join every gather of the stream rank 0 sends
        return self.inner.named_parameters_for_sync()

    def state_dict_cpu(self) -> dict[str, torch.Tensor]:
        _broadcast(("weights",))
        return self.inner.state_dict_cpu()

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


def follow(policy: Any) -> dict[str, int]:
    """A follower rank's loop: run rank 0's commands on this shard until "stop"; returns counts."""
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
        elif op == "sync":
            policy.drain_sync_parameters()
        elif op == "weights":
            policy.state_dict_cpu()
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
    loss[0, len(prompt_ids):] = 1.0
    return TrainBatch(
        input_ids=ids, attention_mask=torch.ones(1, t, dtype=torch.long), loss_mask=loss,
        behaviour_logp=torch.zeros(1, t), token_versions=torch.full((1, t), -1, dtype=torch.long),
        rewards=torch.zeros(1), group_index=torch.zeros(1, dtype=torch.long),
        response_lengths=torch.tensor([len(token_ids)]), trajectory_index=torch.zeros(1, dtype=torch.long),
    )
