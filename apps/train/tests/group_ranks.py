"""Bodies of spawned trainer ranks for the trainer-group tests (imported by module name in the children)."""

import torch


def kl_group(spec, model_dir, out_dir):
    """Rank 0 leads (train step with KL, then a reference forward of its own), rank 1 follows."""
    torch.set_num_threads(1)
    from arl.trainer import TrainerConfig
    from arl.trainer.algorithm_config import AlgorithmConfig
    from arl.trainer.fsdp import FSDPPolicy
    from arl.trainer.group import LeaderPolicy, follow, probe_batch

    config = TrainerConfig(mixed_precision="none", algorithm=AlgorithmConfig(kl_coef=0.1))
    policy = FSDPPolicy(model_dir, config, spec)
    if spec.rank > 0:
        torch.save(follow(policy), out_dir / "follower.pt")
        return
    leader = LeaderPolicy(policy)
    batch = probe_batch([1, 2, 3, 4], [5, 6, 7, 8, 9])
    metrics = leader.train_step(batch, mini_batch_rows=1)
    ref = leader.reference_log_probs(batch)
    leader.stop()
    torch.save({"metrics": metrics, "ref": ref}, out_dir / "leader.pt")


def settle_group(spec, model_dir, out_dir):
    """Rank 0 leads a training step, then settles the optimizer state's way out on every rank (as the
    colocated app does before the KV caches wake); each rank records its own settles."""
    torch.set_num_threads(1)
    from arl.trainer import TrainerConfig
    from arl.trainer.fsdp import FSDPPolicy
    from arl.trainer.group import LeaderPolicy, follow, probe_batch

    policy = FSDPPolicy(model_dir, TrainerConfig(mixed_precision="none"), spec)
    settled = []
    own_settle = policy.settle_optimizer_offload
    policy.settle_optimizer_offload = lambda: settled.append(spec.rank) or own_settle()
    if spec.rank > 0:
        counts = follow(policy)
    else:
        leader = LeaderPolicy(policy)
        leader.train_step(probe_batch([1, 2, 3, 4], [5, 6, 7, 8, 9]), mini_batch_rows=1)
        counts = {"waited_s": leader.settle_optimizer_offload()}
        leader.stop()
    torch.save({"counts": counts, "settled": settled}, out_dir / f"settle_rank{spec.rank}.pt")
