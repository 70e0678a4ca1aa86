"""Joining a torch.distributed group: the same rendezvous for Ray actors, torchrun and local processes.

A trainer rank only needs a `DistributedSpec` (address, port, rank, world size, and on a cluster its
own node's address, whose interface the group binds): the app's placement code picks rank 0's host
and a free port there and hands a spec to each Ray actor; `spec_from_env`
reads torchrun's variables; `spawn_local` starts N processes on this host (tests, benchmarks)
without torchrun. NCCL on CUDA, gloo on CPU.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from arl.sync.net import free_port, use_interface_of


@dataclass(frozen=True)
class DistributedSpec:
    address: str
    port: int
    rank: int
    world_size: int
    # CUDA device index on this host; None = rank % visible devices (a Ray actor that sees one GPU gets 0).
    local_rank: int | None = None
    # "nccl" | "gloo" | None (nccl when CUDA is available, else gloo)
    backend: str | None = None
    timeout_s: float = 600.0
    # This rank's node address as the other ranks reach it ("": let NCCL / gloo pick an interface): the
    # group binds the interface holding it (arl.sync.net.use_interface_of), so ranks on several hosts
    # meet on the network they share, never on loopback or a guessed interface.
    local_address: str = ""


def spec_from_env() -> DistributedSpec:
    """The spec torchrun (or any launcher setting RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) describes."""
    try:
        return DistributedSpec(
            address=os.environ["MASTER_ADDR"],
            port=int(os.environ["MASTER_PORT"]),
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            local_rank=int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else None,
        )
    except KeyError as exc:
        raise RuntimeError(f"torch.distributed environment variable {exc} is not set") from None


def init_distributed(spec: DistributedSpec) -> torch.device:
    """Join the process group (once per process); returns this rank's device."""
    use_cuda = torch.cuda.is_available() and spec.backend != "gloo"
    backend = spec.backend or ("nccl" if use_cuda else "gloo")
    if use_cuda:
        index = spec.local_rank if spec.local_rank is not None else spec.rank % torch.cuda.device_count()
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if spec.local_address:
        use_interface_of(spec.local_address)
    if not dist.is_initialized():
        dist.init_process_group(
            backend,
            init_method=f"tcp://{spec.address}:{spec.port}",
            rank=spec.rank,
            world_size=spec.world_size,
            timeout=datetime.timedelta(seconds=spec.timeout_s),
            **({"device_id": device} if backend == "nccl" else {}),
        )
    return device


def _entry(
    rank: int,
    fn: Callable[..., Any],
    world_size: int,
    port: int,
    backend: str | None,
    timeout_s: float,
    args: tuple,
) -> None:
    spec = DistributedSpec("127.0.0.1", port, rank, world_size, backend=backend, timeout_s=timeout_s)
    try:
        fn(spec, *args)
        if dist.is_initialized():
            # Every rank done before any tears down: a rank destroying its group while a peer's
            # gloo thread still talks to it can abort that peer at exit.
            dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    _exit_without_finalizers()


def _exit_without_finalizers() -> None:
    """End a finished rank with exit code 0 before interpreter finalization.

    A spawned process leaves through `sys.exit`, which runs C++ static destructors in no set order; a
    C++ thread still joinable there calls std::terminate ("terminate called without an active
    exception", SIGABRT). One such abort of rank 1 failed the 2-rank FSDP test once in CI; 30 runs
    here (idle and with both cores busy) did not reproduce it, so where it struck is not known. A rank
    that got here has done its work: its objects are dropped while the interpreter is whole and
    `os._exit` skips that stage. A failing rank still leaves through mp.spawn's error path.
    """
    import gc
    import sys

    gc.collect()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# What `spawn_local`'s ranks import before any work: multiprocessing's fork server (one single-threaded
# process per caller, started at the first call) imports them once, and every rank of every later call
# is forked from it already holding them, instead of each fresh process importing torch, transformers'
# model classes and the trainer again (~5 CPU-s a rank). The fork server has no CUDA context and starts no
# threads, so forking from it is safe where forking the caller would not be.
RANK_PRELOAD = (
    "torch",
    "torch.distributed",
    "transformers.modeling_utils",
    "arl.trainer",
    "arl.trainer.fsdp",
)


def spawn_local(
    fn: Callable[..., Any], world_size: int, *args: Any, backend: str | None = None, timeout_s: float = 600.0
) -> None:
    """Run `fn(spec, *args)` in `world_size` new processes on this host; raises if any rank fails.

    The ranks are forked from multiprocessing's fork server (RANK_PRELOAD): each starts from its state (a
    new interpreter holding those imports), never from the caller's. `fn` must be importable by module
    name (a rank imports it to run it).
    """
    import multiprocessing

    import torch.multiprocessing as mp

    # Takes effect when the fork server starts (the first call in this process); later calls reuse it.
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(RANK_PRELOAD))
    mp.start_processes(
        _entry,
        args=(fn, world_size, free_port(), backend, timeout_s, args),
        nprocs=world_size,
        join=True,
        start_method="forkserver",
    )
