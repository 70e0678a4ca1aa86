"""Ray placement groups for each layout, on a Ray instance that declares 4 GPUs (Ray schedules GPU
resources by count, so which actor gets which GPU id is checked without GPUs): split layouts give
every actor its own GPUs, colocated layouts give a replica and its trainer rank the same one."""

import os

import pytest

from arl_train.config import load_config
from arl_train.placement import PlacementError, layout_of, reserve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray4():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        num_cpus=1,
        num_gpus=4,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=os.environ.get("ARL_RAY_TMP", "/tmp/arl-ray"),
    )
    yield ray
    ray.shutdown()


def _gpu_ids() -> list[str]:
    import ray

    return [str(g) for g in ray.get_gpu_ids()]


def _gpus(ray, options):
    """The GPU ids Ray gives a process placed with an actor's `options`: a task with the same resources and
    placement (a task reuses its worker process; an actor per probe would start one each, ~2 CPU-s)."""
    return ray.get(ray.remote(_gpu_ids).options(**options).remote(), timeout=60)


def test_split_layout_gives_each_actor_its_own_gpus(ray4):
    cfg = load_config(
        overrides=[
            "resources.trainer_gpus=1",
            "rollout.device=cuda",
            "rollout.replicas=1",
            "resources.tensor_parallel_size=2",
        ]
    )
    res = reserve(layout_of(cfg), timeout_s=60)
    try:
        trainer = _gpus(ray4, res.trainer_options(0))
        replica = _gpus(ray4, res.replica_options(0))
        assert len(trainer) == 1 and len(replica) == 2
        assert not set(trainer) & set(replica)
    finally:
        res.release()


def test_data_parallel_trainer_ranks_each_get_their_own_gpu(ray4):
    cfg = load_config(overrides=["resources.trainer_gpus=2", "rollout.device=cuda", "rollout.replicas=2"])
    res = reserve(layout_of(cfg), timeout_s=60)
    try:
        ranks = [_gpus(ray4, res.trainer_options(r)) for r in range(2)]
        replicas = [_gpus(ray4, res.replica_options(i)) for i in range(2)]
        assert all(len(g) == 1 for g in ranks + replicas)
        assert len({g[0] for g in ranks + replicas}) == 4  # four actors, four distinct GPUs
    finally:
        res.release()


def test_colocated_layout_shares_each_gpu_between_a_replica_and_a_trainer_rank(ray4):
    cfg = load_config(
        overrides=["resources.trainer_gpus=1", "rollout.device=cuda", "resources.colocate=true"]
    )
    res = reserve(layout_of(cfg), timeout_s=60)
    try:
        assert _gpus(ray4, res.trainer_options(0)) == _gpus(ray4, res.replica_options(0))
        assert len(_gpus(ray4, res.replica_options(0))) == 1
    finally:
        res.release()


def test_two_colocated_ranks_each_share_their_own_gpu_with_one_replica(ray4):
    cfg = load_config(
        overrides=[
            "resources.trainer_gpus=2",
            "rollout.device=cuda",
            "resources.colocate=true",
            "rollout.replicas=2",
        ]
    )
    res = reserve(layout_of(cfg), timeout_s=60)
    try:
        pairs = [(_gpus(ray4, res.trainer_options(k)), _gpus(ray4, res.replica_options(k))) for k in range(2)]
        assert all(rank == replica and len(rank) == 1 for rank, replica in pairs)
        assert pairs[0][0] != pairs[1][0]
    finally:
        res.release()


def test_a_layout_larger_than_the_cluster_is_refused_by_name(ray4):
    cfg = load_config(
        overrides=[
            "resources.trainer_gpus=1",
            "rollout.device=cuda",
            "rollout.replicas=2",
            "resources.tensor_parallel_size=2",
        ]
    )
    with pytest.raises(PlacementError, match=r"needs 5 GPUs"):
        reserve(layout_of(cfg), timeout_s=10)


def test_cpu_layout_reserves_nothing():
    res = reserve(layout_of(load_config()), timeout_s=1)
    assert res.trainer_options(0) == {"num_cpus": 0, "num_gpus": 0}
    assert res.replica_options(0) == {"num_cpus": 0, "num_gpus": 0}
