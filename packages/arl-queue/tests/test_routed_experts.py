"""Packed MoE routing in `Response`: pack/unpack, wire size, the codec and a snapshot round trip."""

from __future__ import annotations

import msgspec
import pytest

from arl.queue import MessageQueue, Response, RoutedExpertsError, decode_sample, encode_sample, packed
from arl.queue.routed_experts import bytes_per_token, pack_routes, route_ids, unpack_routes
from arl.queue.types import RoutedExperts


def _rows(n: int, layers: int = 3, top_k: int = 2, experts: int = 8) -> list[list[list[int]]]:
    return [[[(t + layer + k) % experts for k in range(top_k)] for layer in range(layers)] for t in range(n)]


def test_pack_unpack_round_trip_with_trainer_routed_tokens():
    rows = _rows(5)
    rows[0] = []  # e.g. a tool-output token: the trainer routes it
    rows[3] = []
    packed = pack_routes(rows)
    assert packed is not None and packed.shape == (5, 3, 2) and packed.dtype == "uint8"
    assert len(packed.data) == 5 * 3 * 2  # one byte per expert id
    assert unpack_routes(packed) == rows
    assert list(route_ids(packed))[:6] == [255] * 6  # the "trainer routes" marker


def test_wide_models_use_uint16_and_nothing_routed_is_none():
    rows = [[[300, 7]], [[1, 2]]]
    packed = pack_routes(rows)
    assert packed is not None and packed.dtype == "uint16" and len(packed.data) == 2 * 2 * 2
    assert unpack_routes(packed) == rows
    assert pack_routes([[], None, []]) is None
    assert bytes_per_token(48, 8, 128) == 384  # Qwen3-30B-A3B
    assert bytes_per_token(94, 8, 512) == 1504  # more than 255 experts: two bytes an id


def test_bad_rows_are_named():
    with pytest.raises(RoutedExpertsError, match="row 1"):
        pack_routes([[[1, 2], [3, 4]], [[1, 2]]])
    with pytest.raises(RoutedExpertsError, match="negative"):
        pack_routes([[[1, -3]]])
    with pytest.raises(RoutedExpertsError, match="shape"):
        route_ids(RoutedExperts(data=b"\x01\x02\x03", shape=(2, 1, 2)))


def test_codec_and_snapshot_keep_routes(tmp_path, sample):
    s = sample(1, n_tokens=6)
    rows = _rows(6)
    rows[2] = []
    s.responses[0] = msgspec.structs.replace(s.responses[0], routed_experts=pack_routes(rows))
    data = encode_sample(s)
    back = decode_sample(data)
    assert back == s and unpack_routes(back.responses[0].routed_experts) == rows
    # Packed, the routing costs its raw bytes (plus msgpack framing), not a list per id.
    plain = encode_sample(
        msgspec.structs.replace(s, responses=[msgspec.structs.replace(s.responses[0], routed_experts=None)])
    )
    assert len(data) - len(plain) < 6 * 3 * 2 + 40

    q = MessageQueue(4, persist_dir=tmp_path)
    q.put_nowait(s)
    q.close()
    restored = MessageQueue(4, persist_dir=tmp_path).drain_nowait()
    assert unpack_routes(restored[0].responses[0].routed_experts) == rows


def test_response_without_routes_still_decodes():
    data = msgspec.msgpack.encode(
        Response(
            response_ids=[1], response_mask=[1], response_logprobs=[0.0], weight_versions=[0], reward=0.0
        ),
        enc_hook=packed.enc_hook,
    )
    r = msgspec.msgpack.decode(data, type=Response, dec_hook=packed.dec_hook)
    assert r.routed_experts is None
