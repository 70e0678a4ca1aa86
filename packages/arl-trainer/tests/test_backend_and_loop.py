"""The HF policy learns from advantages, and the trainer loop syncs weights through arl-sync."""

import asyncio

import torch

from arl.queue import MessageQueue
from arl.queue.types import Response, Sample
from arl.sync import SyncConfig, WeightReceiver
from arl.trainer import HFPolicy, Trainer, TrainerConfig, WeightPublisher, assemble_batch
from arl.trainer.config import OptimConfig
from arl.trainer.testing import LocalSource


def sample(uid, good, bad, behaviour_logp=-3.0, version=0):
    def resp(ids, reward):
        return Response(
            response_ids=ids,
            response_mask=[1] * len(ids),
            response_logprobs=[behaviour_logp] * len(ids),
            weight_versions=[version] * len(ids),
            reward=reward,
        )

    return Sample(
        uid=uid,
        prompt_ids=[1, 2, 3],
        responses=[resp(good, 1.0), resp(bad, 0.0)],
        start_version=version,
        end_version=version,
    )


def test_train_step_raises_logprob_of_rewarded_response(tiny_model_dir):
    policy = HFPolicy(tiny_model_dir, TrainerConfig(optim=OptimConfig(lr=1e-2)))
    batch = assemble_batch([sample("s", [10, 11, 12], [20, 21, 22])], pad_token_id=0)
    before = (policy.log_probs(batch) * batch.loss_mask).sum(-1)
    for _ in range(5):
        metrics = policy.train_step(batch, mini_batch_rows=2)
    after = (policy.log_probs(batch) * batch.loss_mask).sum(-1)
    assert after[0] > before[0] + 0.5  # the rewarded response became more likely
    assert after[1] < before[1]  # the unrewarded one less
    assert metrics["updates"] == 1.0 and metrics["grad_norm"] > 0


class ReceivingRollout:
    """RolloutControl double: a real arl-sync receiver stands where the engine would be."""

    def __init__(self):
        self.calls = []
        self.receiver = None
        self.weights = {}

    async def pause(self):
        self.calls.append("pause")

    async def update_weights(self, address, config_json, version):
        import msgspec

        self.calls.append(f"update:{version}")
        if self.receiver is None:
            self.receiver = WeightReceiver(address, msgspec.json.decode(config_json, type=SyncConfig))

        def apply(named):
            self.weights = {n: t.clone() for n, t in named}

        return await asyncio.to_thread(self.receiver.receive, apply=apply)

    async def resume(self, queued_samples):
        self.calls.append(f"resume:{queued_samples}")


async def test_trainer_loop_consumes_drops_stale_and_syncs(tiny_model_dir):
    cfg = TrainerConfig(
        ppo_mini_batch_size=2, trigger_parameter_sync_step=2, max_version_lag=0, batch_timeout_s=10
    )
    policy = HFPolicy(tiny_model_dir, cfg)
    queue = MessageQueue(max_size=20)
    for i in range(4):
        await queue.put(sample(f"s{i}", [10 + i, 11], [30 + i, 31]))
    rollout = ReceivingRollout()
    publisher = WeightPublisher(SyncConfig(transport="cpu", timeout_s=20), num_receivers=1)
    trainer = Trainer(policy, LocalSource(queue), rollout, publisher, cfg, pad_token_id=0)
    try:
        m1 = await trainer.train_step()
        assert m1["sync_s"] == 0.0 and m1["version"] == 0
        m2 = await trainer.train_step()
        assert rollout.calls == ["pause", "update:1", "resume:0"]
        assert m2["version"] == 1 and m2["sync_s"] > 0
        for name, p in policy.model.named_parameters():
            assert torch.equal(rollout.weights[name], p.detach())
        # Samples from version 0 are now one version stale: over max_version_lag=0 they are dropped, counted.
        await queue.put(sample("old", [1], [2], version=0))
        await queue.put(sample("new1", [3], [4], version=1))
        await queue.put(sample("new2", [5], [6], version=1))
        m3 = await trainer.train_step()
        assert m3["over_version_lag"] == 1 and trainer.dropped_version_lag == 1
        assert m3["staleness_max"] == 0
    finally:
        publisher.close()
        if rollout.receiver is not None:
            rollout.receiver.close()


def test_a_failed_sync_still_runs_the_weight_stream_to_its_end():
    """Under FSDP2 each streamed tensor is a gather the other ranks wait in: when the rollout side
    fails a sync, the publisher stops its sender and still iterates the rest of the stream."""
    import pytest

    taken = []

    def stream():
        for i in range(5):
            taken.append(i)
            yield f"w{i}", torch.full((8,), float(i))

    class FailingRollout:
        async def update_weights(self, sync_address, sync_config_json, version):
            raise RuntimeError("replica 0 died")

    publisher = WeightPublisher(SyncConfig(transport="cpu", timeout_s=30), num_receivers=1)
    try:
        with pytest.raises(RuntimeError, match="replica 0 died"):
            asyncio.run(publisher.publish(stream(), 1, FailingRollout()))
    finally:
        publisher.close()
    assert taken == [0, 1, 2, 3, 4]
