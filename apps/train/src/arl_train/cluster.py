"""Which node of the Ray cluster runs what: the trainer ranks, the replicas, the agent-loop workers.

The nodes say what they are for with custom resources (`ray start --resources='{"rollout": 1}'`), named
by the `[cluster]` section. `plan_nodes` (pure: testable without Ray) spreads each role over the live
nodes that declare its resource, in turn, and keeps a role on the driver's node where no node declares
it (a single machine behaves as before). The driver's node also runs the coordinators (the sample
queue, the rollout actor): what the driver talks to most stays beside it, and losing a rollout or
sandbox node never takes them down.

A GPU layout's trainer ranks and replicas are placed by their placement groups (`placement.reserve`,
whose bundles then also ask for the role's resource); `nodes_of_groups` reads back where Ray put them.

`NodePlan.cross_host` tells whether the weights leave the trainer's node, which settles
`sync.transport = "auto"` (`placement.transport_between_nodes`); `rendezvous` picks the FSDP group's
address on rank 0's node and a port free there (asked on that node).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from arl_train.sections import AppConfig

# How much of a role resource one actor takes: enough to require the resource, small enough that a
# node declaring `{"rollout": 1}` holds any number of replicas.
ROLE_SHARE = 0.001


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A live Ray node: its id, the address other nodes reach it at, its resources."""

    id: str
    ip: str
    resources: dict[str, float] = {}

    def label(self) -> str:
        return f"{self.ip} ({self.id[:8]})"


class NodePlan(msgspec.Struct, frozen=True, kw_only=True):
    """The node of every actor of a run."""

    driver: NodeInfo
    trainer: list[NodeInfo]  # one per trainer rank
    replicas: list[NodeInfo]  # one per rollout replica
    workers: list[NodeInfo]  # one per agent-loop worker

    @property
    def cross_host(self) -> bool:
        """A replica runs on another node than trainer rank 0 (the weights cross the network)."""
        return any(r.id != self.trainer[0].id for r in self.replicas)

    @property
    def nodes(self) -> list[NodeInfo]:
        """Every node the run uses, the driver's first."""
        seen: dict[str, NodeInfo] = {}
        for n in [self.driver, *self.trainer, *self.replicas, *self.workers]:
            seen.setdefault(n.id, n)
        return list(seen.values())

    def describe(self) -> str:
        def ips(nodes: list[NodeInfo]) -> str:
            return ", ".join(n.ip for n in nodes) or "-"

        return (
            f"driver {self.driver.ip} | trainer ranks {ips(self.trainer)} | replicas {ips(self.replicas)} | "
            f"agent workers {ips(self.workers)}"
        )

    def weights_path(self) -> str:
        """Where the weights go, for messages: trainer node → replica nodes."""
        replicas = ", ".join(r.label() for r in self.replicas)
        return f"the trainer is on {self.trainer[0].label()} and the replicas on {replicas}"


def spread(nodes: list[NodeInfo], resource: str, count: int, fallback: NodeInfo) -> list[NodeInfo]:
    """`count` placements over the nodes declaring `resource`, in turn (by address); all on `fallback`
    when none declares it."""
    holders = sorted((n for n in nodes if n.resources.get(resource, 0) > 0), key=lambda n: _ip_key(n.ip))
    if not holders:
        return [fallback] * count
    return [holders[i % len(holders)] for i in range(count)]


def _ip_key(ip: str) -> tuple[int, ...] | tuple[str]:
    try:
        return tuple(int(part) for part in ip.split("."))
    except ValueError:
        return (ip,)


def plan_nodes(config: AppConfig, nodes: list[NodeInfo], driver_id: str) -> NodePlan:
    """The node of every CPU-placed actor of `config` on a cluster of `nodes` (module docstring)."""
    from arl_train.placement import layout_of

    driver = next((n for n in nodes if n.id == driver_id), None)
    if driver is None:
        raise RuntimeError(f"the driver's node {driver_id[:8]} is not among the live Ray nodes")
    layout, c = layout_of(config), config.cluster
    return NodePlan(
        driver=driver,
        trainer=spread(nodes, c.trainer_resource, layout.trainer_ranks, driver),
        replicas=spread(nodes, c.rollout_resource, layout.replicas, driver),
        workers=spread(nodes, c.sandbox_resource, config.run.agent_workers, driver),
    )


def live_nodes() -> list[NodeInfo]:
    """The cluster's live nodes (Ray connected): those Ray counts alive whose raylet takes a connection.
    A node lost moments ago is still "alive" to Ray for tens of seconds; a run started then must not be
    placed on it."""
    import ray

    return [
        NodeInfo(id=n["NodeID"], ip=n["NodeManagerAddress"], resources=dict(n.get("Resources", {})))
        for n in ray.nodes()
        if n.get("Alive") and _raylet_answers(n)
    ]


def current_node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def on_node(node: NodeInfo) -> dict[str, Any]:
    """Ray actor/task options that run it on `node` and nowhere else."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node.id, soft=False)}


def role_resource(config: AppConfig, role: str, nodes: list[NodeInfo]) -> dict[str, float]:
    """What a placement-group bundle of `role` ("trainer" or "rollout") asks for besides its GPUs: a
    share of the role's node resource, when some live node declares it."""
    name = getattr(config.cluster, f"{role}_resource")
    return {name: ROLE_SHARE} if any(n.resources.get(name, 0) > 0 for n in nodes) else {}


def nodes_of_groups(groups: list[Any], nodes: list[NodeInfo]) -> list[NodeInfo]:
    """The node of bundle 0 of each placement group (ready)."""
    from ray.util.placement_group import placement_group_table

    by_id = {n.id: n for n in nodes}
    found = []
    for pg in groups:
        node_id = placement_group_table(pg)["bundles_to_node_id"][0]
        found.append(by_id[node_id])
    return found


def rendezvous(node: NodeInfo, timeout_s: float = 120.0) -> tuple[str, int]:
    """(address, port) for a torch.distributed group whose rank 0 runs on `node`: the node's address
    and a port free there, asked on that node (a port free on the driver's host says nothing there)."""
    import ray

    from arl_train.node_probe import free_port_on

    probe = ray.remote(num_cpus=0)(free_port_on).options(**on_node(node))
    return node.ip, int(ray.get(probe.remote(node.ip), timeout=timeout_s))


def lost_actor(
    exc: BaseException,
    parts: dict[str, tuple[Any, NodeInfo]],
    wait_s: float = 0.0,
    node_alive: Callable[[NodeInfo], bool] | None = None,
) -> str | None:
    """When `exc` (or what it wraps) is Ray's error for a dead or unreachable actor among `parts` (a
    name -> (actor handle, its node)), a sentence naming the part, its node and whether that node is
    gone (asked once, or for up to `wait_s`; `node_alive` answers instead of Ray and the node's raylet);
    else None."""
    from ray.exceptions import RayActorError

    err: BaseException | None = exc
    while err is not None and not isinstance(err, RayActorError):
        err = getattr(err, "cause", None) or err.__cause__
    if err is None:
        return None
    actor_id = str(getattr(err, "actor_id", "") or "")
    text = str(err)

    def named(handle: Any) -> bool:  # by the error's actor id, else by the id its message quotes
        hexid = _actor_hex(handle)
        return bool(hexid) and (hexid == actor_id or (not actor_id and hexid in text))

    name, node = next(
        ((n, where) for n, (handle, where) in parts.items() if named(handle)), ("an actor of the run", None)
    )
    if node is None:
        return f"{name} was lost ({type(err).__name__})"
    dead = _wait_node_dead(node, wait_s, node_alive or ray_node_alive)
    return f"{name} on node {node.label()} was lost ({type(err).__name__}): " + (
        "the node is gone (Ray's raylet there is dead or does not answer: the host, or every process on "
        "it, was lost)"
        if dead
        else "its process died or stopped answering (the node is still up)"
    )


def _actor_hex(handle: Any) -> str:
    try:
        return handle._actor_id.hex()
    except AttributeError:
        return ""


def ray_node_alive(node: NodeInfo) -> bool:
    """Ray counts it alive and its raylet takes a connection (Ray's own health check takes tens of
    seconds to give up on a lost node; a connection refused or unanswered says it at once)."""
    import ray

    record = next((n for n in ray.nodes() if n["NodeID"] == node.id), None)
    return record is not None and bool(record.get("Alive")) and _raylet_answers(record)


def _raylet_answers(record: dict[str, Any]) -> bool:
    """The raylet of a node (a `ray.nodes()` record) takes a TCP connection within 2 s."""
    import socket

    try:
        with socket.create_connection(
            (record["NodeManagerAddress"], int(record["NodeManagerPort"])), timeout=2.0
        ):
            return True
    except (OSError, KeyError, ValueError):
        return False


def _wait_node_dead(node: NodeInfo, wait_s: float, node_alive: Callable[[NodeInfo], bool]) -> bool:
    import time

    deadline = time.monotonic() + wait_s
    while True:
        if not node_alive(node):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
