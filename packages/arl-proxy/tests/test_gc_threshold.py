"""The proxy raises the garbage collector's first threshold when it starts (fewer full collections, each a
pause of every session), never lowers one the process set higher, and refuses a negative one."""

from __future__ import annotations

import gc

import pytest

from arl.proxy import ChatProxy, ProxyConfig
from arl.proxy.testing import ScriptedGenerator


@pytest.fixture
def saved_threshold():
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


@pytest.mark.parametrize(
    ("start", "configured", "expected"), [(700, 30_000, 30_000), (50_000, 30_000, 50_000), (700, 0, 700)]
)
async def test_start_raises_the_threshold_and_never_lowers_it(
    qwen3_tok, saved_threshold, start, configured, expected
):
    gc.set_threshold(start, saved_threshold[1], saved_threshold[2])
    proxy = ChatProxy(qwen3_tok, ScriptedGenerator(qwen3_tok, []), ProxyConfig(gc_threshold=configured))
    await proxy.start()
    try:
        assert gc.get_threshold() == (expected, saved_threshold[1], saved_threshold[2])
    finally:
        await proxy.stop()


def test_a_negative_threshold_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="gc_threshold must be >= 0"):
        ProxyConfig(gc_threshold=-1)
