"""Storage, said out loud: what each node of a run must see, and a probe on every node at start.

A run's files live on the driver's disk unless they are somewhere every node mounts. `needs(plan, nodes)`
lists, per node, the paths its actors use: the model folder (replicas load it, the trainer and the
agent workers read its tokenizer), the run folder (the trainer writes checkpoints and the ledger there,
agent workers their Harbor trials; the agent preset's task set is in it), a resumed checkpoint, a KL
reference, a dataset file, a Harbor task set. `probe(...)` runs a task on each node that checks them
and raises `StorageError` naming every node and path it cannot see, before any actor starts.

What "see" means: a folder the node writes must be the driver's folder itself, not a same-named local
one (a probe file with a fresh token, written by the driver, must read back); a folder it only reads
must exist there with what the run reads (a model staged on each node's local disk is fine).

`storage.shared_dir` names the shared folder (a relative `output.dir` goes into it; validation keeps
an absolute one inside it), so that on a cluster the run folder is shared by construction.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import msgspec

from arl_train.cluster import NodeInfo, NodePlan, on_node, ray_node_alive
from arl_train.errors import NodeLostError, StorageError
from arl_train.node_probe import check_paths
from arl_train.sections import AppConfig

PROBE_NAME = ".arl-storage-probe"


class Need(msgspec.Struct, frozen=True, kw_only=True):
    """A path a node must see: `what` it is (for messages), whether the node writes it."""

    path: str
    what: str
    write: bool = False


def resolve_output_dir(config: AppConfig) -> AppConfig:
    """`output.dir` inside `storage.shared_dir` when it is relative and a shared folder is declared."""
    shared, out = config.storage.shared_dir, config.output.dir
    if not shared or Path(out).is_absolute():
        return config
    output = msgspec.structs.replace(config.output, dir=str(Path(shared) / out))
    return msgspec.structs.replace(config, output=output)


def needs(config: AppConfig, out_dir: Path, model_path: Path, plan: NodePlan) -> dict[str, list[Need]]:
    """Node id -> the paths that node must see (the driver's node is not listed: the driver made them)."""
    run = Need(path=str(out_dir), what="the run folder (output.dir)", write=True)
    model = Need(
        path=str(model_path),
        what="the model folder" + (" (trainer.resume_from)" if config.trainer.resume_from else ""),
    )
    reads = [model]
    if config.actor.reference_path:
        reads.append(
            Need(
                path=str(Path(config.actor.reference_path).resolve()),
                what="the KL reference (actor.reference_path)",
            )
        )
    source = config.data.source
    data = None
    if source.startswith("harbor:"):
        local = source.removeprefix("harbor:")
        if Path(local).exists():
            data = Need(path=str(Path(local).resolve()), what="the Harbor task set (data.source)")
    elif not source.startswith("builtin:"):
        data = Need(path=str(Path(source).resolve()), what="the dataset (data.source)")
    out: dict[str, list[Need]] = {}

    def add(node: NodeInfo, items: list[Need]) -> None:
        if node.id == plan.driver.id:
            return
        have = out.setdefault(node.id, [])
        have += [n for n in items if n not in have]

    for node in plan.trainer:
        add(node, [run, *reads])
    for node in plan.replicas:
        add(node, [model])
    for node in plan.workers:
        add(node, [run, model] + ([data] if data else []))
    return out


def probe(
    plan: NodePlan, wanted: dict[str, list[Need]], out_dir: Path, shared_dir: str, timeout_s: float
) -> None:
    """Check every node of `plan` sees what `wanted` lists; raise `StorageError` naming each node and
    path it cannot, with what to do."""
    if not wanted:
        return
    import ray

    token = uuid.uuid4().hex
    token_file = f"{PROBE_NAME}-{token[:8]}"
    marker = out_dir / token_file
    marker.write_text(token)
    by_id = {n.id: n for n in plan.nodes}
    try:
        check = ray.remote(num_cpus=0)(check_paths)
        refs = {
            node_id: check.options(**on_node(by_id[node_id])).remote(
                [msgspec.to_builtins(n) for n in items], token_file, token
            )
            for node_id, items in wanted.items()
        }
        problems: list[str] = []
        for node_id, ref in refs.items():
            node = by_id[node_id]
            try:
                found = ray.get(ref, timeout=timeout_s)
            except Exception as exc:  # the node could not run the probe at all
                if not ray_node_alive(node):
                    raise NodeLostError(
                        f"node {node.label()} was lost while the run started (its raylet is "
                        "gone): start the run again"
                    ) from exc
                found = [
                    f"the probe did not run there within storage.probe_timeout_s={timeout_s:g}s "
                    f"({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''})"
                ]
            problems += [f"node {node.label()}: {p}" for p in found]
    finally:
        marker.unlink(missing_ok=True)
    if problems:
        hint = (
            f"storage.shared_dir={shared_dir!r} must be the same folder on every node (mounted at that path)"
            if shared_dir
            else "put them in a folder every node mounts at the same path and set storage.shared_dir to it "
            "(a relative output.dir then goes there)"
        )
        raise StorageError(
            "a node of the cluster cannot see what the run needs:\n  "
            + "\n  ".join(problems)
            + f"\n{hint} (docs/guide/cluster.md, 'Shared storage')",
            "storage.shared_dir",
        )
