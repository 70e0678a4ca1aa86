"""GPU transports, real processes: CUDA IPC (same GPU), the host-staged "cpu" transport with GPU
tensors on both sides (pinned), and NCCL (needs two GPUs). Skipped without CUDA (see conftest)."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from arl.sync import SyncConfig, WeightSender
from arl.sync.testing import assert_same, make_tensors, receiver_main

pytestmark = pytest.mark.gpu
CTX = mp.get_context("spawn")  # the parent holds a CUDA context: children must not fork it
BUCKET = 1 << 20


def on_gpu(d: dict[str, torch.Tensor], device: str = "cuda:0") -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in d.items()}


def gpu_tensors(round_: int) -> dict[str, torch.Tensor]:
    src = make_tensors(round_)
    src["large.bf16"] = torch.randn(
        1536, 1024, generator=torch.Generator().manual_seed(round_)
    ).bfloat16()  # 3 MiB
    return src


def run_rounds(
    tmp_path,
    cfg: SyncConfig,
    n_receivers: int,
    rounds: int,
    sender_device: str,
    receiver_devices: list[str],
    cast=None,
    lazy: bool = False,
    stream: bool = False,
) -> WeightSender:
    with WeightSender(
        cfg, num_receivers=n_receivers, device=sender_device if cfg.transport != "cpu" else None
    ) as s:
        ps = [
            CTX.Process(
                target=receiver_main,
                args=(s.address, cfg, rounds, str(tmp_path / f"r{i}.pt")),
                kwargs={"device": receiver_devices[i], "start_timeout_s": 120, "stream": stream},
                daemon=True,
            )
            for i in range(n_receivers)
        ]
        for p in ps:
            p.start()
        for v in range(rounds):
            tensors = on_gpu(gpu_tensors(v), sender_device)
            stats = s.send(iter(tensors.items()) if lazy else tensors, version=v)
            assert stats.receivers == n_receivers and stats.buckets >= 4
        for p in ps:
            p.join(60)
            assert p.exitcode == 0
    want = gpu_tensors(rounds - 1)
    if cast is not None:
        want = {k: (t.to(cast) if t.dtype.is_floating_point else t) for k, t in want.items()}
    for i in range(n_receivers):
        res = torch.load(str(tmp_path / f"r{i}.pt"), weights_only=False)
        assert res["log"] == [(v, "") for v in range(rounds)]
        assert_same(res["model"], want)
    return s


def test_cuda_ipc_same_gpu_three_rounds(tmp_path):
    """One copy into each receiver's exported staging; each buffer is opened once for all rounds."""
    cfg = SyncConfig(transport="cuda_ipc", bucket_bytes=BUCKET, timeout_s=60)
    s = run_rounds(tmp_path, cfg, 2, 3, "cuda:0", ["cuda:0", "cuda:0"])
    assert s._transport.handles_opened == 2


def test_cuda_ipc_lazy_iterator_and_streaming_receiver(tmp_path):
    """A generator on the sender (sized by drawing it once) and `iter_tensors` on the receiver."""
    cfg = SyncConfig(transport="cuda_ipc", bucket_bytes=BUCKET, timeout_s=60)
    run_rounds(tmp_path, cfg, 1, 3, "cuda:0", ["cuda:0"], lazy=True, stream=True)


def test_cuda_ipc_cast_bf16(tmp_path):
    cfg = SyncConfig(transport="cuda_ipc", bucket_bytes=BUCKET, timeout_s=60, cast_dtype="bfloat16")
    run_rounds(tmp_path, cfg, 1, 3, "cuda:0", ["cuda:0"], cast=torch.bfloat16)


def test_host_staged_gpu_to_gpu(tmp_path):
    """'cpu' transport with GPU tensors on the sender and a GPU staging buffer on the receiver."""
    cfg = SyncConfig(transport="cpu", bucket_bytes=BUCKET, timeout_s=60)
    run_rounds(tmp_path, cfg, 1, 3, "cuda:0", ["cuda:0"])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per rank (two GPUs)")
def test_nccl_broadcast(tmp_path):
    n = min(torch.cuda.device_count() - 1, 2)
    cfg = SyncConfig(transport="nccl", bucket_bytes=BUCKET, timeout_s=60)
    run_rounds(tmp_path, cfg, n, 3, "cuda:0", [f"cuda:{i + 1}" for i in range(n)])
