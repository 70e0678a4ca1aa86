"""Bucket planning and packing, in one process: layout, splitting, alignment, cast, round trip."""

import pytest
import torch

from arl.sync.errors import SyncConfigError
from arl.sync.plan import PlanTotals, pack_chunks, plan_buckets, stream_views


def _roundtrip(named, bucket_bytes, align=64, cast=None):
    totals = PlanTotals()
    buckets = list(plan_buckets(named, bucket_bytes, align, cast, totals))
    staging = torch.zeros(max(totals.stream_bytes, 1), dtype=torch.uint8)
    metas = []
    for b in buckets:
        buf = torch.zeros(bucket_bytes, dtype=torch.uint8)
        pack_chunks(buf, b.chunks)
        lo = b.index * bucket_bytes
        staging[lo : lo + b.nbytes] = buf[: b.nbytes]
        metas += b.tensors
    return buckets, totals, dict(stream_views(staging, metas))


def test_split_and_alignment():
    named = [("a", torch.arange(10, dtype=torch.int64)), ("big", torch.randn(1000)), ("c", torch.ones(3, 3))]
    buckets, totals, out = _roundtrip(named, bucket_bytes=1024)
    assert [b.index for b in buckets] == list(range(len(buckets)))
    assert all(b.nbytes == 1024 for b in buckets[:-1]) and 0 < buckets[-1].nbytes <= 1024
    assert totals.buckets == len(buckets) and totals.tensors == 3
    for b in buckets:
        for m in b.tensors:
            assert m.offset % 64 == 0 and b.index * 1024 <= m.offset < (b.index + 1) * 1024
    # "big" (4000 bytes) spans several buckets
    assert sum(1 for b in buckets for c in b.chunks if c.flat.numel() == 1000) >= 4
    for name, t in named:
        assert torch.equal(out[name], t)


def test_exact_bucket_fit_and_empty_tensors():
    named = [
        ("x", torch.ones(256, dtype=torch.float32)),
        ("empty", torch.empty(0, 5)),
        ("s", torch.tensor(3.5)),
        ("y", torch.zeros(256, dtype=torch.float32)),
    ]
    buckets, totals, out = _roundtrip(named, bucket_bytes=1024)
    assert totals.stream_bytes == 2048 + 64
    for name, t in named:
        assert out[name].shape == t.shape and torch.equal(out[name], t)


def test_cast_only_floats():
    named = [("w", torch.randn(100, 7)), ("i", torch.arange(5)), ("h", torch.randn(9).half())]
    _, totals, out = _roundtrip(named, bucket_bytes=256, cast=torch.bfloat16)
    assert out["w"].dtype == torch.bfloat16 and torch.equal(out["w"], named[0][1].to(torch.bfloat16))
    assert out["i"].dtype == torch.int64 and torch.equal(out["i"], named[1][1])
    assert torch.equal(out["h"], named[2][1].to(torch.bfloat16))
    assert totals.payload_bytes == 700 * 2 + 5 * 8 + 9 * 2


def test_non_contiguous_and_odd_dtypes():
    base = torch.randn(13, 7)
    named = [
        ("t", base.t()),
        ("b", torch.tensor([True, False, True])),
        ("i8", torch.tensor([-3, 4], dtype=torch.int8)),
        ("f64", torch.randn(3, dtype=torch.float64)),
        ("bf", torch.randn(17).bfloat16()),
    ]
    _, _, out = _roundtrip(named, bucket_bytes=128, align=16)
    for name, t in named:
        assert torch.equal(out[name], t), name


def test_lazy_iterator_drawn_bucket_by_bucket():
    drawn = []

    def gen():
        for i in range(10):
            drawn.append(i)
            yield f"t{i}", torch.full((256,), float(i))  # 1 KiB each

    it = plan_buckets(gen(), 2048, 64)
    first = next(it)
    assert first.index == 0 and len(drawn) <= 3


@pytest.mark.parametrize("bucket,align", [(1000, 64), (1024, 8), (1024, 48)])
def test_bad_config(bucket, align):
    with pytest.raises(SyncConfigError):
        list(plan_buckets([("a", torch.ones(1))], bucket, align))


def test_duplicate_name():
    with pytest.raises(SyncConfigError):
        list(plan_buckets([("a", torch.ones(1)), ("a", torch.ones(1))], 1024, 64))
