"""Real multi-process transfers over the "cpu" (shared-memory) transport: bit-exact arrival, many
shapes and dtypes, cast, two receivers, lost peers, streaming, timeouts. No mocks."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest
import torch

from arl.sync import (
    ReceiverLostError,
    SenderLostError,
    SyncConfig,
    SyncConfigError,
    SyncTimeoutError,
    TransferAbortedError,
    WeightReceiver,
    WeightSender,
)
from arl.sync.testing import (
    assert_same,
    dying_sender_main,
    load_result,
    make_tensors,
    spawn_receiver,
    wait_for_file,
)

# forkserver: children fork from one server that imported torch once (a fresh torch import costs
# ~10 s on the CI machine); the server itself never touches threads or CUDA, so forking is safe.
CTX = mp.get_context("forkserver")
CTX.set_forkserver_preload(["arl.sync.testing"])
BUCKET = 64 * 1024  # small buckets, so that tensors span buckets and a sync has many of them


def start_receiver(address: str, cfg: SyncConfig, rounds: int, out: str, **kw) -> mp.Process:
    return spawn_receiver(CTX, address, cfg, rounds, out, **kw)


load = load_result


def test_three_rounds_bit_exact_many_shapes(tmp_path):
    cfg = SyncConfig(transport="cpu", bucket_bytes=BUCKET, timeout_s=30)
    rounds = 3
    with WeightSender(cfg, num_receivers=1) as s:
        # Started before send(), but joins late (child imports torch): send() waits for it.
        p = start_receiver(s.address, cfg, rounds, str(tmp_path / "r.pt"))
        for v in range(rounds):
            # Round 2 uses a lazy generator, as a trainer gathering shard by shard would.
            src = make_tensors(v)
            stats = s.send(src if v < 2 else ((k, t) for k, t in src.items()), version=10 + v)
            assert stats.version == 10 + v and stats.tensors == len(src) and stats.receivers == 1
            assert stats.buckets >= 6 and stats.bytes == sum(
                t.numel() * t.element_size() for t in src.values()
            )
            # After each round, the receiver's copy is checked at the end (last round), and per round
            # through the version log.
        p.join(30)
    assert p.exitcode == 0
    res = load(str(tmp_path / "r.pt"))
    assert res["log"] == [(10, ""), (11, ""), (12, "")]
    assert res["version"] == 12
    assert_same(res["model"], make_tensors(2))


def test_every_round_bit_exact_streaming_and_cast(tmp_path):
    """Streaming receiver, fp32 -> bf16 cast on the sender; each round checked."""
    cfg = SyncConfig(transport="cpu", bucket_bytes=BUCKET, timeout_s=30, cast_dtype="bfloat16")
    with WeightSender(cfg) as s:
        for v in range(3):
            out = str(tmp_path / f"r{v}.pt")
            p = start_receiver(s.address, cfg, 1, out, stream=True)
            src = make_tensors(v, dtype_mix=False)
            s.send(src, version=v)
            p.join(30)
            assert p.exitcode == 0
            res = load(out)
            assert res["log"] == [(v, "")]
            want = {k: (t.to(torch.bfloat16) if t.dtype.is_floating_point else t) for k, t in src.items()}
            assert_same(res["model"], want)
            assert res["model"]["big.int64"].dtype == torch.int64


def test_two_receivers(tmp_path):
    cfg = SyncConfig(transport="cpu", bucket_bytes=BUCKET, timeout_s=30)
    with WeightSender(cfg, num_receivers=2) as s:
        ps = [start_receiver(s.address, cfg, 3, str(tmp_path / f"r{i}.pt")) for i in range(2)]
        for v in range(3):
            stats = s.send(make_tensors(v), version=v)
            assert stats.receivers == 2
        for p in ps:
            p.join(30)
            assert p.exitcode == 0
    for i in range(2):
        res = load(str(tmp_path / f"r{i}.pt"))
        assert res["log"] == [(0, ""), (1, ""), (2, "")]
        assert_same(res["model"], make_tensors(2))


def test_receiver_dies_mid_transfer(tmp_path):
    """One of two receivers exits abruptly in round 1: the sender raises in bounded time, the survivor
    keeps round 0's weights, and a later sync to the survivor alone succeeds."""
    cfg = SyncConfig(transport="cpu", bucket_bytes=BUCKET, timeout_s=20)
    with WeightSender(cfg, num_receivers=2) as s:
        survivor = start_receiver(s.address, cfg, 3, str(tmp_path / "ok.pt"))
        dying = start_receiver(s.address, cfg, 3, str(tmp_path / "dead.pt"), die_round=1, die_after=5)
        s.send(make_tensors(0), version=0)
        t = time.monotonic()
        with pytest.raises(ReceiverLostError):
            s.send(make_tensors(1), version=1)
        assert time.monotonic() - t < cfg.timeout_s  # detected, not timed out
        dying.join(10)
        assert dying.exitcode == 3
        # The survivor's second receive saw the abort; now sync to it alone.
        s.num_receivers = 1
        s.send(make_tensors(2), version=2)
        survivor.join(30)
        assert survivor.exitcode == 0
    res = load(str(tmp_path / "ok.pt"))
    assert res["log"] == [(0, ""), (None, "TransferAbortedError"), (2, "")]
    assert_same(res["model"], make_tensors(2))


def test_survivor_keeps_old_weights_after_abort(tmp_path):
    """The receiver's model after an aborted sync is still the previous version, bit for bit."""
    cfg = SyncConfig(transport="cpu", bucket_bytes=BUCKET, timeout_s=20)
    with WeightSender(cfg, num_receivers=2) as s:
        survivor = start_receiver(s.address, cfg, 2, str(tmp_path / "ok.pt"))
        dying = start_receiver(s.address, cfg, 2, str(tmp_path / "dead.pt"), die_round=1, die_after=40)
        s.send(make_tensors(0), version=0)
        with pytest.raises(ReceiverLostError):
            s.send(make_tensors(1), version=1)
        survivor.join(30)
        dying.join(10)
    res = load(str(tmp_path / "ok.pt"))
    assert res["log"] == [(0, ""), (None, "TransferAbortedError")]
    assert res["version"] == 0
    assert_same(res["model"], make_tensors(0))


def test_kept_plan_survives_an_aborted_sync(tmp_path):
    """A sync that dies while using the kept plan (a receiver lost mid-transfer) leaves the plan usable:
    the next sync of the same layout reuses it and lands bit for bit on the survivor."""
    cfg = SyncConfig(transport="cpu", bucket_bytes=BUCKET, timeout_s=20)
    with WeightSender(cfg, num_receivers=2) as s:
        survivor = start_receiver(s.address, cfg, 3, str(tmp_path / "ok.pt"))
        dying = start_receiver(s.address, cfg, 2, str(tmp_path / "dead.pt"), die_round=1, die_after=40)
        assert not s.send(make_tensors(0), version=0).plan_reused
        with pytest.raises(ReceiverLostError):
            s.send(make_tensors(1), version=1)
        s.num_receivers = 1
        assert s.send(make_tensors(2), version=2).plan_reused
        survivor.join(30)
        dying.join(10)
    res = load(str(tmp_path / "ok.pt"))
    assert res["log"] == [(0, ""), (None, "TransferAbortedError"), (2, "")]
    assert_same(res["model"], make_tensors(2))


@pytest.mark.parametrize("transport", ["cpu", "tcp"])
def test_sender_dies_mid_transfer(tmp_path, transport):
    """The receiver raises SenderLostError in bounded time and keeps the previous weights. Over "tcp" the
    sender appears to be on another host: its end is seen through the connection, not its pid."""
    cfg = SyncConfig(transport=transport, bucket_bytes=BUCKET, timeout_s=20)
    addr_path = str(tmp_path / "addr")
    src = make_tensors(0)
    torch.save(src, str(tmp_path / "src.pt"))
    p = CTX.Process(
        target=dying_sender_main,
        args=(cfg, str(tmp_path / "src.pt"), 100, addr_path),
        kwargs={"other_host": transport == "tcp"},
        daemon=True,
    )
    p.start()
    address = wait_for_file(addr_path, 60)
    kept: dict[str, torch.Tensor] = {}

    def apply(named):
        kept.clear()
        kept.update({n: t.clone() for n, t in named})

    with WeightReceiver(address, cfg) as r:
        assert r.receive(apply=apply, timeout_s=60) == 0
        t = time.monotonic()
        with pytest.raises((SenderLostError, SyncTimeoutError)) as ei:
            r.receive(apply=apply, timeout_s=60)
        assert ei.type is SenderLostError and time.monotonic() - t < cfg.timeout_s
        assert r.version == 0
    p.join(10)
    assert p.exitcode == 4
    assert_same(kept, src)


def test_iterator_error_aborts_receivers(tmp_path):
    cfg = SyncConfig(transport="cpu", bucket_bytes=BUCKET, timeout_s=20)

    def broken():
        yield from list(make_tensors(1).items())[:50]
        raise RuntimeError("gather failed")

    with WeightSender(cfg) as s:
        p = start_receiver(s.address, cfg, 3, str(tmp_path / "r.pt"))
        s.send(make_tensors(0), version=0)
        with pytest.raises(RuntimeError, match="gather failed"):
            s.send(broken(), version=1)
        s.send(make_tensors(2), version=2)
        p.join(30)
    res = load(str(tmp_path / "r.pt"))
    assert res["log"] == [(0, ""), (None, "TransferAbortedError"), (2, "")]
    assert_same(res["model"], make_tensors(2))


def test_timeouts_and_config_mismatch():
    """No receiver: the sender gives up after timeout_s. No sender: the receiver does too.
    A receiver with another bucket size is refused. (One process: no data moves.)"""
    import threading

    cfg = SyncConfig(transport="cpu", bucket_bytes=BUCKET, timeout_s=0.5)
    with WeightSender(cfg) as s:
        t = time.monotonic()
        with pytest.raises(SyncTimeoutError):
            s.send({"a": torch.ones(3)}, version=0)
        assert time.monotonic() - t < 5
        bad = WeightReceiver(s.address, SyncConfig(transport="cpu", bucket_bytes=2 * BUCKET, timeout_s=0.5))
        # The sender answers hellos while it waits for receivers; run that wait alongside.
        waiter = threading.Thread(target=_swallow, args=(s.wait_for_receivers, 2.0))
        waiter.start()
        try:
            with pytest.raises(SyncConfigError, match="mismatch"):
                bad.join(timeout_s=2)
        finally:
            waiter.join()
        bad.close()
    r = WeightReceiver("tcp://127.0.0.1:9", cfg)
    with pytest.raises(SyncTimeoutError):
        r.receive(timeout_s=0.3)
    r.close()


def _swallow(fn, *args):
    try:
        fn(*args)
    except Exception:
        pass


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_no_shared_memory_file_left_behind():
    cfg = SyncConfig(transport="cpu", bucket_bytes=BUCKET)
    before = set(os.listdir("/dev/shm"))
    s = WeightSender(cfg)
    assert len(set(os.listdir("/dev/shm")) - before) == 1
    s.close()
    assert set(os.listdir("/dev/shm")) - before == set()


def test_cancel_stops_a_send_waiting_for_receivers_at_once():
    """A caller whose receiving side already failed cancels the send instead of waiting out timeout_s."""
    import threading

    cfg = SyncConfig(transport="cpu", bucket_bytes=BUCKET, timeout_s=60)
    with WeightSender(cfg, num_receivers=1) as s:  # no receiver will ever join
        threading.Timer(0.3, s.cancel).start()
        start = time.monotonic()
        with pytest.raises(TransferAbortedError, match="cancelled"):
            s.send(make_tensors(0), version=1)
        assert time.monotonic() - start < 5.0
        # The cancel was for that sync only: the next send waits again (here: times out on its own).
        with pytest.raises(SyncTimeoutError):
            s.wait_for_receivers(timeout_s=0.2)
