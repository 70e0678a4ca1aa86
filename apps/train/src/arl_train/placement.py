"""Placement: which devices every actor of a run gets, and the Ray placement groups that reserve them.

The packages only take devices and addresses as arguments; this module decides them from the config's
`resources`, `rollout.device` / `rollout.replicas` and `sync.transport`:

* `check_layout(config)` (part of `validation.validate`, at load) rejects impossible layouts with an
  error naming the key; `resolve(config)` then turns `sync.transport = "auto"` into a transport and
  makes colocated runs synchronous; a shared-GPU schedule (`resources.shared_gpu`, arl_train.shared_gpu)
  implies the colocated placement and keeps its async mode (b, c, d; time_sliced always resumes
  partial generations).
* `Layout` is the resolved shape of a run: trainer ranks, replicas × tensor-parallel GPUs, colocated
  or split, the transport, how many receivers a sync has (every TP worker is one).
* `reserve(layout)` asks Ray for the GPUs: split runs get one placement group for the trainer ranks
  (STRICT_PACK: one node, one bundle per rank) and one per replica (one bundle of TP GPUs, so the
  replica's actor owns all of them and vLLM's "mp" executor starts one worker per GPU inside it);
  colocated runs get one group with one GPU bundle per replica, shared by the replica (half a GPU in
  Ray's accounting) and the trainer rank of that GPU, which sends it the weights (`per_rank_sync`).
  `Reservation.trainer_options(rank)` / `replica_options(i)` are the Ray actor options that place
  each actor in its bundle.
* `sender_host(transport)` is the address the weight sender binds: the node's reachable address for
  NCCL and TCP (receivers may sit on other nodes), loopback for the single-host transports;
  `transport_between_nodes` settles "auto" on a cluster once `arl_train.cluster` placed the actors.
"""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path
from typing import Any

import msgspec

from arl.sync.net import free_port
from arl_train.errors import ConfigError, require
from arl_train.sections import AppConfig


class PlacementError(ConfigError):
    """The cluster cannot hold the configured layout (too few GPUs, a model TP cannot split, Ray did
    not grant the placement groups in time); the message names the config key."""


class Layout(msgspec.Struct, frozen=True, kw_only=True):
    """The resolved shape of a run (what `reserve` and the actors need)."""

    trainer_gpus: int
    replicas: int
    tensor_parallel_size: int
    colocate: bool
    rollout_on_gpu: bool
    # "off" (colocated runs take turns synchronously), "time_sliced" or "concurrent" (async on the
    # shared GPUs; colocate is then true).
    shared_gpu: str = "off"
    transport: str
    # Trainer ranks on the CPU (gloo) when trainer_gpus = 0.
    trainer_cpu_ranks: int = 1

    @property
    def sleeps(self) -> bool:
        """The replicas release their GPU memory while the trainer trains (synchronous colocated and
        time_sliced); concurrent replicas stay resident."""
        return self.colocate and self.shared_gpu != "concurrent"

    @property
    def trainer_ranks(self) -> int:
        """Trainer processes: one per trainer GPU, else `trainer_cpu_ranks`; > 1 runs FSDP2 data parallel."""
        return self.trainer_gpus or self.trainer_cpu_ranks

    @property
    def rollout_gpus(self) -> int:
        return self.replicas * self.tensor_parallel_size if self.rollout_on_gpu else 0

    @property
    def total_gpus(self) -> int:
        return (
            self.trainer_gpus
            if self.colocate and self.rollout_on_gpu
            else self.trainer_gpus + self.rollout_gpus
        )

    @property
    def receivers(self) -> int:
        """Receivers of one sync: every worker (TP rank) of every replica receives the full tensors."""
        return self.replicas * (self.tensor_parallel_size if self.rollout_on_gpu else 1)

    @property
    def per_rank_sync(self) -> bool:
        """Every trainer rank sends to the replica on its own device (colocated, one replica per
        rank: CUDA IPC on the shared GPU instead of rank 0 reaching the other GPUs); otherwise rank 0
        sends to all."""
        return self.colocate and self.trainer_ranks > 1 and self.trainer_ranks == self.replicas

    @property
    def receivers_per_rank(self) -> int:
        """Receivers of one rank's sender when `per_rank_sync`: the workers of its one replica."""
        return self.receivers // self.replicas


class TrainerRank(msgspec.Struct, frozen=True, kw_only=True):
    """One trainer rank's place in the data-parallel group (the rendezvous of torch.distributed)."""

    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0


def layout_of(config: AppConfig) -> Layout:
    r = config.resources
    return Layout(
        trainer_gpus=r.trainer_gpus,
        replicas=config.rollout.replicas,
        tensor_parallel_size=r.tensor_parallel_size,
        colocate=r.colocate or r.shared_gpu != "off",
        rollout_on_gpu=config.rollout.device == "cuda",
        shared_gpu=r.shared_gpu,
        transport=config.sync.transport,
        trainer_cpu_ranks=r.trainer_cpu_ranks,
    )


def _auto_transport(trainer_on_gpu: bool, rollout_on_gpu: bool, colocate: bool) -> str:
    if not (trainer_on_gpu and rollout_on_gpu):
        return "cpu"
    return "cuda_ipc" if colocate else "nccl"


def check_layout(config: AppConfig) -> None:
    """Refuse a layout that cannot run, naming the key (called by `validation.validate`)."""
    r, ro = config.resources, config.rollout
    require(
        r.trainer_gpus >= 0, "resources.trainer_gpus", r.trainer_gpus, "must be >= 0 (0 = trainer on the CPU)"
    )
    require(ro.replicas >= 1, "rollout.replicas", ro.replicas, "must be >= 1")
    require(
        r.tensor_parallel_size >= 1, "resources.tensor_parallel_size", r.tensor_parallel_size, "must be >= 1"
    )
    require(
        r.gpus_per_node >= 0,
        "resources.gpus_per_node",
        r.gpus_per_node,
        "must be >= 0 (0 = check at start only)",
    )
    trainer_on_gpu = r.trainer_gpus > 0
    rollout_on_gpu = ro.device == "cuda"
    require(
        not config.actor.device.startswith("cuda") or trainer_on_gpu,
        "actor.device",
        config.actor.device,
        "needs resources.trainer_gpus >= 1 (Ray reserves the trainer's GPUs; the trainer's device follows "
        "resources.trainer_gpus)",
    )
    require(r.trainer_cpu_ranks >= 1, "resources.trainer_cpu_ranks", r.trainer_cpu_ranks, "must be >= 1")
    require(
        r.trainer_cpu_ranks == 1 or not trainer_on_gpu,
        "resources.trainer_cpu_ranks",
        r.trainer_cpu_ranks,
        f"is for a CPU trainer: with resources.trainer_gpus={r.trainer_gpus} the trainer runs one rank per GPU "
        "(leave it at 1)",
    )
    tp = r.tensor_parallel_size
    if tp > 1:
        require(
            rollout_on_gpu,
            "resources.tensor_parallel_size",
            tp,
            "needs rollout.device='cuda' (tensor parallelism splits a replica over GPUs)",
        )
        require(
            ro.engine == "vllm",
            "resources.tensor_parallel_size",
            tp,
            f"needs rollout.engine='vllm' (the {ro.engine!r} engine runs on one device)",
        )
    if r.gpus_per_node:
        require(
            tp <= r.gpus_per_node,
            "resources.tensor_parallel_size",
            tp,
            f"exceeds resources.gpus_per_node={r.gpus_per_node}: a replica's GPUs are packed on one node",
        )
        require(
            r.trainer_gpus <= r.gpus_per_node,
            "resources.trainer_gpus",
            r.trainer_gpus,
            f"exceeds resources.gpus_per_node={r.gpus_per_node}: the trainer's GPUs are packed on one node",
        )
    if r.mps != "off":
        _check_mps(config)
    require(
        0 <= r.mps_trainer_sm_percent <= 100,
        "resources.mps_trainer_sm_percent",
        r.mps_trainer_sm_percent,
        "must be in [0, 100] (0: no cap)",
    )
    require(
        not r.mps_trainer_sm_percent or r.mps == "start",
        "resources.mps_trainer_sm_percent",
        r.mps_trainer_sm_percent,
        "caps the trainer's SMs under the run's MPS daemon: it needs "
        f"resources.mps='start' (is {r.mps!r}); without MPS the GPU ignores it",
    )
    if r.colocate or r.shared_gpu != "off":
        key, value = (
            ("resources.colocate", True) if r.shared_gpu == "off" else ("resources.shared_gpu", r.shared_gpu)
        )
        setting = (
            "resources.colocate=true" if r.shared_gpu == "off" else f"resources.shared_gpu={r.shared_gpu!r}"
        )
        require(
            trainer_on_gpu == rollout_on_gpu,
            key,
            value,
            "puts trainer and rollout on the same devices: set both on GPUs (resources.trainer_gpus >= 1 and "
            f"rollout.device='cuda') or both on the CPU; got resources.trainer_gpus={r.trainer_gpus}, "
            f"rollout.device={ro.device!r}",
        )
        if r.shared_gpu != "off":
            _check_shared_gpu(config)
        if rollout_on_gpu:
            require(
                tp == 1,
                "resources.tensor_parallel_size",
                tp,
                f"with {setting}: colocated replicas use one GPU each in this build",
            )
            require(
                r.trainer_gpus == ro.replicas * tp,
                "resources.trainer_gpus",
                r.trainer_gpus,
                f"with {setting} needs as many trainer GPUs as rollout GPUs: rollout.replicas × "
                f"resources.tensor_parallel_size = {ro.replicas * tp}",
            )
    colocate = r.colocate or r.shared_gpu != "off"
    transport = config.sync.transport
    if transport in ("nccl", "cuda_ipc"):
        require(
            trainer_on_gpu and rollout_on_gpu,
            "sync.transport",
            transport,
            "moves weights GPU to GPU: it needs resources.trainer_gpus >= 1 and rollout.device='cuda' "
            f"(got {r.trainer_gpus} and {ro.device!r}); use 'cpu' or 'auto'",
        )
        require(
            transport != "nccl" or not colocate,
            "sync.transport",
            transport,
            "cannot serve resources.colocate=true: NCCL puts each rank on its own GPU and a colocated replica "
            "shares the trainer's; use 'cuda_ipc' or 'auto'",
        )
        require(
            transport != "cuda_ipc" or colocate,
            "sync.transport",
            transport,
            "needs the replicas on the trainer's GPU (resources.colocate=true): each actor sees only its own "
            "GPUs; use 'nccl' or 'auto'",
        )
    require(
        config.sync.bucket_mb >= 0, "sync.bucket_mb", config.sync.bucket_mb, "must be >= 0 (0 = by transport)"
    )


def resolve(config: AppConfig) -> AppConfig:
    """The config with `sync.transport` ("auto") and `sync.bucket_mb` (0) resolved, a shared-GPU
    schedule's colocated placement set, and, for colocated runs, the synchronous schedule (for a
    layout `check_layout` accepted)."""
    r, ro, at = config.resources, config.rollout, config.async_training
    if r.shared_gpu != "off":
        # The shared schedules use the colocated placement (one trainer rank and one replica per GPU).
        r = msgspec.structs.replace(r, colocate=True)
    if r.colocate:
        if r.shared_gpu == "off":
            # Taking turns is synchronous: one step's samples, all from the current weights, then train.
            at = msgspec.structs.replace(
                at, trigger_parameter_sync_step=1, staleness_threshold=0.0, partial_rollout=False
            )
        elif r.shared_gpu == "time_sliced":
            # Yielding the GPU aborts the in-flight generations; they resume after it (never drained).
            at = msgspec.structs.replace(at, partial_rollout=True)
    transport = config.sync.transport
    if transport == "auto":
        transport = _auto_transport(r.trainer_gpus > 0, ro.device == "cuda", r.colocate)
        if transport == "cpu" and config.ray.address is not None:
            transport = "auto"  # "cpu" or "tcp": known at start, once the nodes are (transport_between_nodes)
    bucket_mb = (
        config.sync.bucket_mb or {"auto": 64, "cpu": 64, "tcp": 64, "nccl": 256, "cuda_ipc": 1024}[transport]
    )
    sync = msgspec.structs.replace(config.sync, transport=transport, bucket_mb=bucket_mb)
    return msgspec.structs.replace(config, resources=r, async_training=at, sync=sync)


def _check_mps(config: AppConfig) -> None:
    """`resources.mps='start'`: the concurrent schedule, on GPUs, with the run's own Ray (the daemon
    starts on this machine)."""
    r, key = config.resources, "resources.mps"
    require(
        r.shared_gpu == "concurrent",
        key,
        r.mps,
        "is for resources.shared_gpu='concurrent', the one schedule where the trainer and the replica run at "
        f"once (resources.shared_gpu={r.shared_gpu!r}); another schedule takes resources.mps=off "
        "resources.mps_trainer_sm_percent=0",
    )
    require(
        config.rollout.device == "cuda" or r.trainer_gpus > 0,
        key,
        r.mps,
        "needs GPUs: the run has none (rollout.device='cpu', resources.trainer_gpus=0)",
    )
    require(
        config.ray.address is None,
        key,
        r.mps,
        f"starts the daemon on this machine, so it needs the run's own Ray (ray.address unset, is "
        f"{config.ray.address!r}); on a cluster start MPS on each GPU node yourself (docs/guide/gpu-placement.md)",
    )


def _check_shared_gpu(config: AppConfig) -> None:
    """A shared-GPU schedule is asynchronous, one replica of one GPU per trainer rank, and (concurrent
    on GPUs) a memory split that leaves both sides room."""
    r, ro, at = config.resources, config.rollout, config.async_training
    key, mode = "resources.shared_gpu", r.shared_gpu
    require(
        at.trigger_parameter_sync_step > 1 or at.staleness_threshold > 0,
        key,
        mode,
        "needs an asynchronous mode (b, c or d): async_training.staleness_threshold > 0 or "
        "async_training.trigger_parameter_sync_step > 1; mode a on shared GPUs is resources.colocate=true "
        "with resources.shared_gpu='off' (synchronous turn-taking)",
    )
    require(
        r.tensor_parallel_size == 1,
        "resources.tensor_parallel_size",
        r.tensor_parallel_size,
        f"with {key}={mode!r}: a shared GPU holds one replica of one GPU beside one trainer rank "
        "(tensor parallel 1 in this build)",
    )
    require(
        0 <= r.trainer_memory_fraction < 1,
        "resources.trainer_memory_fraction",
        r.trainer_memory_fraction,
        "must be in [0, 1)",
    )
    require(
        not r.trainer_memory_fraction or mode == "concurrent",
        "resources.trainer_memory_fraction",
        r.trainer_memory_fraction,
        f"splits a GPU between a resident replica and the trainer: it is for "
        f"{key}='concurrent' ({key}={mode!r} sleeps the replica)",
    )
    if mode == "concurrent" and ro.device == "cuda":
        require(
            not r.trainer_memory_fraction or ro.gpu_memory_utilization + r.trainer_memory_fraction <= 1,
            "resources.trainer_memory_fraction",
            r.trainer_memory_fraction,
            f"+ rollout.gpu_memory_utilization={ro.gpu_memory_utilization} is more than the whole GPU",
        )
        require(
            ro.gpu_memory_utilization <= 0.8,
            "rollout.gpu_memory_utilization",
            ro.gpu_memory_utilization,
            f"with {key}='concurrent': the resident replica would leave the trainer less than a fifth of the "
            "GPU; lower it (e.g. 0.3) so both fit",
        )


def check_model(layout: Layout, model_path: Path) -> None:
    """Tensor parallelism must split the model's attention heads evenly (vLLM's rule)."""
    tp = layout.tensor_parallel_size
    if tp == 1:
        return
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise PlacementError(
            f"cannot read {model_path}/config.json to check resources.tensor_parallel_size: {exc}"
        ) from exc
    cfg = cfg.get("text_config", cfg)
    heads = int(cfg.get("num_attention_heads", 0))
    kv = int(cfg.get("num_key_value_heads", heads))
    if heads % tp:
        raise PlacementError(
            f"resources.tensor_parallel_size={tp} does not divide the model's {heads} attention heads"
        )
    if kv and (kv % tp if kv >= tp else tp % kv):
        raise PlacementError(
            f"resources.tensor_parallel_size={tp} and the model's {kv} KV heads: one must divide the other"
        )


def check_cluster(layout: Layout, cluster_gpus: float, node_gpus: list[float]) -> None:
    """The cluster must hold the layout: enough GPUs, and each packed group on one node."""
    need = layout.total_gpus
    if need > cluster_gpus:
        raise PlacementError(
            f"the run needs {need} GPUs (resources.trainer_gpus={layout.trainer_gpus}"
            + (
                ""
                if layout.colocate
                else f" + rollout.replicas={layout.replicas}"
                f" × resources.tensor_parallel_size={layout.tensor_parallel_size}"
            )
            + f"), the Ray cluster has {cluster_gpus:g}"
            + (
                f"; to train and generate on the same {cluster_gpus:g} GPU(s) asynchronously set "
                "resources.shared_gpu='time_sliced' (apps/train README, 'Shared GPUs')"
                if not layout.colocate and layout.rollout_on_gpu and 0 < cluster_gpus < need
                else ""
            )
        )
    biggest = max(node_gpus, default=0.0)
    if layout.rollout_on_gpu and layout.tensor_parallel_size > biggest:
        raise PlacementError(
            f"resources.tensor_parallel_size={layout.tensor_parallel_size} exceeds the largest node's "
            f"{biggest:g} GPUs (a replica's GPUs are packed on one node)"
        )
    if layout.trainer_gpus > biggest:
        raise PlacementError(
            f"resources.trainer_gpus={layout.trainer_gpus} exceeds the largest node's {biggest:g} GPUs"
        )


class Reservation:
    """The placement groups of a run and the actor options that use them."""

    def __init__(
        self,
        layout: Layout,
        trainer_pg: Any = None,
        replica_pgs: list[Any] | None = None,
        shared_pg: Any = None,
    ) -> None:
        self.layout = layout
        self.trainer_pg = trainer_pg
        self.replica_pgs = replica_pgs or []
        self.shared_pg = shared_pg

    @staticmethod
    def _in(pg: Any, bundle: int) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg,
                placement_group_bundle_index=bundle,
                placement_group_capture_child_tasks=False,
            )
        }

    def trainer_options(self, rank: int = 0) -> dict[str, Any]:
        """Ray actor options of trainer rank `rank` (its GPU, or none on the CPU)."""
        lay = self.layout
        if lay.trainer_gpus == 0:
            return {"num_cpus": 0, "num_gpus": 0}
        if self.shared_pg is not None:  # colocated: half of the GPU it shares with replica `rank`
            return {"num_cpus": 0, "num_gpus": 0.5} | self._in(self.shared_pg, rank)
        return {"num_cpus": 0, "num_gpus": 1} | self._in(self.trainer_pg, rank)

    def replica_options(self, index: int) -> dict[str, Any]:
        """Ray actor options of rollout replica `index` (all its GPUs, or none on the CPU)."""
        lay = self.layout
        if not lay.rollout_on_gpu:
            return {"num_cpus": 0, "num_gpus": 0}
        if self.shared_pg is not None:
            return {"num_cpus": 0, "num_gpus": 0.5} | self._in(self.shared_pg, index)
        return {"num_cpus": 0, "num_gpus": lay.tensor_parallel_size} | self._in(self.replica_pgs[index], 0)

    def release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in [self.trainer_pg, self.shared_pg, *self.replica_pgs]:
            if pg is not None:
                try:
                    remove_placement_group(pg)
                except Exception:
                    pass


def reserve(
    layout: Layout, timeout_s: float = 300.0, roles: dict[str, dict[str, float]] | None = None
) -> Reservation:
    """Create (and wait for) the placement groups of `layout`; nothing to reserve on the CPU. `roles`
    adds resources to the bundles of "trainer" and "rollout" (a node resource naming the nodes each
    belongs on: `arl_train.cluster.role_resource`)."""
    roles = roles or {}
    if layout.total_gpus == 0:
        return Reservation(layout)
    import ray
    from ray.util.placement_group import placement_group

    resources = ray.cluster_resources()
    nodes = [n.get("Resources", {}).get("GPU", 0.0) for n in ray.nodes() if n.get("Alive")]
    check_cluster(layout, resources.get("GPU", 0.0), nodes)
    groups: list[Any] = []
    res = Reservation(layout)
    tag = uuid.uuid4().hex[:8]  # names only for `ray status`; unique so that runs can share a cluster
    if layout.colocate:
        res.shared_pg = placement_group(
            [{"GPU": 1}] * layout.replicas, strategy="STRICT_PACK", name=f"arl-colocated-{tag}"
        )
        groups.append(res.shared_pg)
    else:
        if layout.trainer_gpus:
            res.trainer_pg = placement_group(
                [{"GPU": 1} | roles.get("trainer", {})] * layout.trainer_gpus,
                strategy="STRICT_PACK",
                name=f"arl-trainer-{tag}",
            )
            groups.append(res.trainer_pg)
        if layout.rollout_on_gpu:
            res.replica_pgs = [
                placement_group(
                    [{"GPU": layout.tensor_parallel_size} | roles.get("rollout", {})],
                    strategy="STRICT_PACK",
                    name=f"arl-replica-{i}-{tag}",
                )
                for i in range(layout.replicas)
            ]
            groups += res.replica_pgs
    try:
        ray.get([pg.ready() for pg in groups], timeout=timeout_s)
    except Exception as exc:
        res.release()
        raise PlacementError(
            f"Ray did not grant the placement groups within resources.placement_timeout_s={timeout_s:g}s "
            f"({layout.total_gpus} GPUs: {type(exc).__name__})"
        ) from None
    return res


def node_ip() -> str:
    """This node's address as other nodes reach it (Ray's view when Ray runs here)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:
        pass
    return socket_ip()


def socket_ip() -> str:
    """The source address of this host's default route (no packet is sent), else the host name's
    address, else loopback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            ip = s.getsockname()[0]
            if ip and not ip.startswith("0."):
                return ip
    except OSError:
        pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def transport_between_nodes(transport: str, cross_host: bool, where: str) -> str:
    """`sync.transport` for the nodes the run was placed on: "auto" (a CPU side on a cluster) becomes
    "tcp" when the trainer and a replica are on different nodes, else "cpu"; a one-host transport
    asked for across hosts is refused (`where` says which nodes)."""
    if transport == "auto":
        return "tcp" if cross_host else "cpu"
    if cross_host and transport in ("cpu", "cuda_ipc"):
        raise PlacementError(
            f"invalid config: sync.transport = {transport!r}: needs the trainer and the replicas on one host, "
            f"but {where}; use 'tcp' (or 'auto'){' or nccl' if transport == 'cuda_ipc' else ''}",
            "sync.transport",
        )
    return transport


def sender_host(transport: str) -> str:
    """Where the weight sender binds: this node's address as other nodes reach it for the transports
    that cross hosts ("nccl", "tcp"); loopback for the ones that need sender and receivers on one host
    ("cpu" shared memory, "cuda_ipc")."""
    return node_ip() if transport in ("nccl", "tcp") else "127.0.0.1"


def trainer_ranks(layout: Layout, rendezvous: tuple[str, int] | None = None) -> list[TrainerRank]:
    """One `TrainerRank` per trainer GPU, all meeting at rank 0's node (the torch.distributed
    rendezvous a data-parallel backend joins; one rank needs none). `rendezvous`: (address, port) on
    rank 0's node when that is not this one (`arl_train.cluster.rendezvous`)."""
    n = layout.trainer_ranks
    if n == 1:
        return [TrainerRank()]
    if rendezvous is not None:
        addr, port = rendezvous
        return [TrainerRank(rank=i, world_size=n, master_addr=addr, master_port=port) for i in range(n)]
    # Rank 0 on this node: CPU ranks (gloo) all run here; GPU ranks are packed on it (STRICT_PACK).
    addr = node_ip() if layout.trainer_gpus else "127.0.0.1"
    port = free_port(addr if layout.trainer_gpus == 0 else "")
    return [TrainerRank(rank=i, world_size=n, master_addr=addr, master_port=port) for i in range(n)]
