"""Real multi-process transfers over the "tcp" transport: bit-exact arrival (lists, lazy iterators, a
cast, streaming), two receivers, and lost receivers seen through their connections alone, as across
hosts (each peer reports another host's pid namespace, so no pid check can help). A lost sender:
test_transfer_cpu.py's `test_sender_dies_mid_transfer`, over both transports. No mocks."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest
import torch

from arl.sync import ReceiverLostError, SyncConfig, TransportError, WeightSender
from arl.sync.testing import assert_same, load_result, make_tensors, spawn_receiver

CTX = mp.get_context("forkserver")
CTX.set_forkserver_preload(["arl.sync.testing"])
BUCKET = 64 * 1024


def start_receiver(address: str, cfg: SyncConfig, rounds: int, out: str, **kw) -> mp.Process:
    return spawn_receiver(CTX, address, cfg, rounds, out, **kw)


load = load_result


def test_rounds_bit_exact_list_lazy_and_streaming_with_cast(tmp_path):
    cfg = SyncConfig(transport="tcp", bucket_bytes=BUCKET, timeout_s=30)
    with WeightSender(cfg, num_receivers=2) as s:
        plain = start_receiver(s.address, cfg, 3, str(tmp_path / "plain.pt"), other_host=True)
        streaming = start_receiver(
            s.address, cfg, 3, str(tmp_path / "stream.pt"), stream=True, other_host=True
        )
        for v in range(3):
            src = make_tensors(v)
            stats = s.send(src if v < 2 else ((k, t) for k, t in src.items()), version=v)
            assert stats.receivers == 2 and stats.transport == "tcp" and stats.buckets >= 6
        # One connection per receiver, made at the first sync and kept by the next two.
        assert s._transport.connections_made == 2
        for p in (plain, streaming):
            p.join(30)
            assert p.exitcode == 0
    for name in ("plain", "stream"):
        res = load(str(tmp_path / f"{name}.pt"))
        assert res["log"] == [(0, ""), (1, ""), (2, "")]
        assert_same(res["model"], make_tensors(2))
    cast = SyncConfig(transport="tcp", bucket_bytes=BUCKET, timeout_s=30, cast_dtype="bfloat16")
    with WeightSender(cast) as s:
        p = start_receiver(s.address, cast, 1, str(tmp_path / "cast.pt"))
        src = make_tensors(5, dtype_mix=False)
        s.send(src, version=5)
        p.join(30)
    want = {k: (t.to(torch.bfloat16) if t.dtype.is_floating_point else t) for k, t in src.items()}
    assert_same(load(str(tmp_path / "cast.pt"))["model"], want)


def test_a_receiver_lost_mid_sync_then_between_syncs_is_seen_by_its_connection(tmp_path):
    """A receiver on "another host" dies inside sync 1: the sender sees its connection break and aborts
    in bounded time; the survivor keeps sync 0's weights; sync 2 reaches the survivor alone. Then the
    survivor's peer dies between syncs: the next sync leaves it out without waiting for it."""
    cfg = SyncConfig(transport="tcp", bucket_bytes=BUCKET, timeout_s=20)
    with WeightSender(cfg, num_receivers=3) as s:
        survivor = start_receiver(s.address, cfg, 4, str(tmp_path / "ok.pt"), other_host=True)
        dying = start_receiver(
            s.address, cfg, 3, str(tmp_path / "dead.pt"), die_round=1, die_after=5, other_host=True
        )
        idle = start_receiver(s.address, cfg, 3, str(tmp_path / "idle.pt"), other_host=True, vanish=True)
        s.send(make_tensors(0), version=0)
        t = time.monotonic()
        with pytest.raises(ReceiverLostError):
            s.send(make_tensors(1), version=1)
        assert time.monotonic() - t < cfg.timeout_s  # seen through the connection, not timed out
        dying.join(10)
        assert dying.exitcode == 3
        s.num_receivers = 2
        s.send(make_tensors(2), version=2)
        idle.join(30)  # it took its three rounds and vanished without a word: its connection closed
        assert idle.exitcode == 0
        s.num_receivers = 1
        t = time.monotonic()
        s.send(make_tensors(3), version=3)
        assert time.monotonic() - t < cfg.timeout_s / 2
        survivor.join(30)
        assert survivor.exitcode == 0
    res = load(str(tmp_path / "ok.pt"))
    assert res["log"] == [(0, ""), (None, "TransferAbortedError"), (2, ""), (3, "")]
    assert_same(res["model"], make_tensors(3))


def test_a_wildcard_address_is_refused():
    with pytest.raises(TransportError, match="wildcard"):
        WeightSender(SyncConfig(transport="tcp", bucket_bytes=BUCKET), host="0.0.0.0")
