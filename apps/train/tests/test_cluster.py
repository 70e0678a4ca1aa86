"""Placement on a cluster without Ray: which node runs what (cluster.plan_nodes), the transport between
them, what each node must see (storage.needs) and the probe a node runs (node_probe.check_paths), the
`cluster`/`storage` keys' validation, and naming a lost actor's node."""

from __future__ import annotations

from pathlib import Path

import pytest

from arl_train.cluster import NodeInfo, NodePlan, lost_actor, plan_nodes, spread
from arl_train.config import ConfigError, load_config
from arl_train.node_probe import check_paths, free_port_on
from arl_train.placement import PlacementError, transport_between_nodes
from arl_train.storage import Need, needs

HEAD = NodeInfo(id="h" * 56, ip="10.0.0.2", resources={"CPU": 2.0, "sandbox": 1.0})
T1 = NodeInfo(id="a" * 56, ip="10.0.0.3", resources={"trainer": 1.0})
T2 = NodeInfo(id="b" * 56, ip="10.0.0.10", resources={"trainer": 1.0})
R1 = NodeInfo(id="c" * 56, ip="10.0.0.4", resources={"rollout": 1.0})
R2 = NodeInfo(id="d" * 56, ip="10.0.0.5", resources={"rollout": 1.0})


def test_each_role_is_spread_over_the_nodes_declaring_it_in_turn():
    config = load_config(
        overrides=[
            "rollout.replicas=3",
            "resources.trainer_cpu_ranks=2",
            "run.agent_workers=2",
            "ray.address=10.0.0.2:6379",
        ]
    )
    where = plan_nodes(config, [T2, R2, HEAD, R1, T1], HEAD.id)
    assert where.driver == HEAD
    assert where.trainer == [T1, T2]  # by address: .3 before .10
    assert where.replicas == [R1, R2, R1] and where.workers == [HEAD, HEAD]
    assert where.cross_host and [n.id for n in where.nodes] == [HEAD.id, T1.id, T2.id, R1.id, R2.id]


def test_a_role_no_node_declares_stays_on_the_drivers_node():
    config = load_config(overrides=["rollout.replicas=2", "ray.address=auto"])
    where = plan_nodes(config, [HEAD, R1], HEAD.id)
    assert where.trainer == [HEAD] and where.replicas == [R1, R1]
    plain = plan_nodes(load_config(), [HEAD], HEAD.id)
    assert plain.trainer == plain.replicas == [HEAD] and not plain.cross_host and plain.workers == []
    assert spread([HEAD], "gpu-box", 2, HEAD) == [HEAD, HEAD]
    with pytest.raises(RuntimeError, match="not among the live Ray nodes"):
        plan_nodes(config, [R1], HEAD.id)


def test_the_transport_between_nodes():
    # "auto" with the CPU side on a cluster stays "auto" at load and settles at start.
    config = load_config(overrides=["ray.address=10.0.0.2:6379"])
    assert config.sync.transport == "auto" and config.sync.bucket_mb == 64
    assert load_config().sync.transport == "cpu"  # own Ray: one host by construction
    assert transport_between_nodes("auto", cross_host=True, where="x") == "tcp"
    assert transport_between_nodes("auto", cross_host=False, where="x") == "cpu"
    assert transport_between_nodes("tcp", cross_host=False, where="x") == "tcp"
    assert transport_between_nodes("nccl", cross_host=True, where="x") == "nccl"
    with pytest.raises(
        PlacementError,
        match=r"sync.transport = 'cpu': needs the trainer and the replicas on one "
        r"host, but the trainer is on .*; use 'tcp'",
    ) as err:
        transport_between_nodes(
            "cpu",
            cross_host=True,
            where=NodePlan(driver=HEAD, trainer=[T1], replicas=[R1], workers=[]).weights_path(),
        )
    assert err.value.key == "sync.transport"
    assert load_config(overrides=["sync.transport=tcp"]).sync.bucket_mb == 64


def test_what_each_node_must_see(tmp_path):
    config = load_config(
        overrides=["run.agent_workers=1", f"data.source={_jsonl(tmp_path)}", "ray.address=auto"]
    )
    where = NodePlan(driver=HEAD, trainer=[T1], replicas=[R1], workers=[R2])
    wanted = needs(config, tmp_path / "run", tmp_path / "run" / "model", where)
    run = Need(path=str(tmp_path / "run"), what="the run folder (output.dir)", write=True)
    model = Need(path=str(tmp_path / "run" / "model"), what="the model folder")
    data = Need(path=str(tmp_path / "d.jsonl"), what="the dataset (data.source)")
    assert wanted == {T1.id: [run, model], R1.id: [model], R2.id: [run, model, data]}
    # Nothing is asked of the driver's own node: a single host probes nothing.
    assert (
        needs(config, tmp_path, tmp_path, NodePlan(driver=HEAD, trainer=[HEAD], replicas=[HEAD], workers=[]))
        == {}
    )


def _jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "hi", "answer": "1"}\n')
    return path


def test_the_probe_tells_a_shared_folder_from_a_same_named_local_one(tmp_path):
    shared, model = tmp_path / "shared", tmp_path / "model"
    shared.mkdir()
    model.mkdir()
    (shared / ".probe").write_text("token")
    ok = [
        {"path": str(shared), "what": "the run folder", "write": True},
        {"path": str(model), "what": "the model", "write": False},
    ]
    assert check_paths(ok, ".probe", "token") == []
    assert list(shared.iterdir()) == [shared / ".probe"]  # its own write probe removed
    problems = check_paths(
        [*ok, {"path": str(tmp_path / "gone"), "what": "the task set", "write": False}],
        ".probe",
        "another token",
    )
    assert problems == [
        f"the run folder {shared} there is another folder than the driver's (it does not hold the "
        "driver's probe file .probe)",
        f"the task set {tmp_path / 'gone'} does not exist there",
    ]
    assert free_port_on("127.0.0.1") > 0


def test_storage_keys_are_checked_and_a_relative_run_folder_goes_into_the_shared_one(tmp_path):
    config = load_config(overrides=[f"storage.shared_dir={tmp_path}", "output.dir=runs/x"])
    assert config.output.dir == str(tmp_path / "runs" / "x")
    for overrides, key in [
        (["storage.shared_dir=relative/dir"], "storage.shared_dir"),
        ([f"storage.shared_dir={tmp_path / 'missing'}"], "storage.shared_dir"),
        ([f"storage.shared_dir={tmp_path}", "output.dir=/elsewhere/run"], "output.dir"),
        (["storage.probe_timeout_s=0"], "storage.probe_timeout_s"),
        (["cluster.trainer_resource=has space"], "cluster.trainer_resource"),
    ]:
        with pytest.raises(ConfigError) as err:
            load_config(overrides=overrides)
        assert err.value.key == key, (overrides, err.value)


ACTOR = "77d5869a5abc943df9e33f7403000000"


def test_a_lost_actor_is_named_with_its_node():
    from ray.exceptions import ActorUnavailableError, RayTaskError

    class Handle:
        class _actor_id:  # noqa: N801 - what a Ray actor handle holds
            @staticmethod
            def hex() -> str:
                return ACTOR

    parts = {"trainer rank 0": (Handle(), T1), "the rollout actor": (object(), HEAD)}
    err = ActorUnavailableError(f"The actor {ACTOR} is unavailable", bytes.fromhex(ACTOR))
    message = lost_actor(err, parts, wait_s=0.0, node_alive=lambda node: False)
    assert message == (
        f"trainer rank 0 on node {T1.ip} ({T1.id[:8]}) was lost (ActorUnavailableError): the node is "
        "gone (Ray's raylet there is dead or does not answer: the host, or every process on it, was lost)"
    )
    wrapped = RayTaskError("train_step", "traceback", err)
    assert lost_actor(wrapped, parts, wait_s=0.0, node_alive=lambda node: True).endswith(
        "its process died or stopped answering (the node is still up)"
    )
    assert lost_actor(ValueError("not Ray's"), parts) is None
