"""The one-copy protocol of the "cuda_ipc" transport (receivers export their staging buffer, the sender
writes into it, bytes complete at `End`), driven through the real WeightSender / WeightReceiver on the
CPU with `arl.sync.testing.DirectSender` standing in for the CUDA IPC mapping (receivers in threads).
The GPU transport itself is tested in test_gpu.py."""

from __future__ import annotations

import threading

import pytest
import torch

from arl.sync import SyncConfig, WeightReceiver, WeightSender
from arl.sync.testing import assert_same, make_tensors, use_direct_transport

BUCKET = 64 * 1024


def _receive(receiver: WeightReceiver, rounds: int, stream: bool, got: list) -> None:
    for _ in range(rounds):
        if stream:
            got.append({n: t.clone() for n, t in receiver.iter_tensors(timeout_s=30)})
        else:
            staged: dict = {}
            receiver.receive(
                apply=lambda named, staged=staged: staged.update({n: t.clone() for n, t in named}),
                timeout_s=30,
            )
            got.append(staged)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("lazy", [False, True])
def test_sender_writes_every_bucket_into_each_receivers_staging(monkeypatch, stream, lazy):
    torch.set_num_threads(1)
    use_direct_transport(monkeypatch)
    cfg = SyncConfig(transport="cpu", bucket_bytes=BUCKET, timeout_s=30, cast_dtype="bfloat16")
    rounds = 3
    with WeightSender(cfg, num_receivers=2) as sender:
        receivers = [WeightReceiver(sender.address, cfg) for _ in range(2)]
        got: list[list] = [[], []]
        threads = [
            threading.Thread(target=_receive, args=(r, rounds, stream, g)) for r, g in zip(receivers, got)
        ]
        for t in threads:
            t.start()
        for v in range(rounds):
            tensors = make_tensors(v)
            stats = sender.send(iter(tensors.items()) if lazy else tensors, version=v)
            assert stats.buckets > 4 and stats.receivers == 2
            assert stats.plan_reused == (not lazy and v > 0)  # a sized collection's plan is kept
        for t in threads:
            t.join(30)
        # Each receiver's buffer was "opened" once and reused for every round.
        assert sender._transport.handles_opened == 2
        for r in receivers:
            r.close()
    for g in got:
        assert len(g) == rounds
        for v in range(rounds):
            want = {
                k: (t.to(torch.bfloat16) if t.dtype.is_floating_point else t)
                for k, t in make_tensors(v).items()
            }
            assert_same(g[v], want)


def test_reused_plan_follows_new_tensors_in_place_updates_and_shape_changes(monkeypatch):
    """The sender's kept plan and the prepared copies into each receiver's buffer: re-pointed at new
    tensor objects, at tensors changed in place, dropped when the tensor set changes (and the copies
    prepared into a receiver's buffer dropped when it reallocates); large chunks (a copy each) and small
    ones (one batched copy) both exact."""
    import arl.sync.plan as plan

    torch.set_num_threads(1)
    use_direct_transport(monkeypatch)
    monkeypatch.setattr(plan, "SMALL_CHUNK_BYTES", 4096)  # so these tensors take both copy paths
    cfg = SyncConfig(transport="cpu", bucket_bytes=BUCKET, timeout_s=30)
    same = list(make_tensors(7, dtype_mix=False).items())
    rounds = [
        list(make_tensors(0).items()),
        list(make_tensors(1).items()),  # new objects, same layout
        list(make_tensors(2, dtype_mix=False).items()),
        same,
        same,  # fewer tensors; then in place
        list(make_tensors(3).items()) + [("grown", torch.randn(50_000))],
    ]  # a larger stream: new buffer
    with WeightSender(cfg, num_receivers=1) as sender:
        receiver = WeightReceiver(sender.address, cfg)
        got: list = []
        thread = threading.Thread(target=_receive, args=(receiver, len(rounds), False, got))
        thread.start()
        reused, wanted = [], []
        for v, named in enumerate(rounds):
            if v == 4:
                for _, t in same:
                    t.add_(1) if t.dtype != torch.bool else t.logical_not_()
            wanted.append({k: t.clone() for k, t in named})
            reused.append(sender.send(named, version=v).plan_reused)
            assert all(c.flat.numel() == 0 for b in sender._memo.buckets for c in b.chunks)  # holds no tensor
        assert sender._transport.handles_opened == 2  # the last stream outgrew the buffer: re-exported
        thread.join(30)
        receiver.close()
    assert reused == [False, True, False, True, True, False]
    for g, want in zip(got, wanted, strict=True):
        assert_same(g, want)
