"""The multi-host test bed's own rules, without starting it (tests/test_multihost.py starts one): node
specs from the command line, the names a bed accepts, which leftover namespaces `down` may remove."""

from __future__ import annotations

import os

import pytest

from arl_train import testbed
from arl_train.testbed import NodeSpec, TestBed, parse_node


def test_node_specs_from_the_command_line():
    assert parse_node("head:sandbox", head=True) == NodeSpec("head", {"sandbox": 1.0}, head=True)
    assert parse_node("t1:trainer,gpu_box=2") == NodeSpec("t1", {"trainer": 1.0, "gpu_box": 2.0})
    assert parse_node("plain") == NodeSpec("plain", {})


@pytest.mark.parametrize(
    "nodes, problem",
    [
        ([NodeSpec("a", {}), NodeSpec("b", {})], "exactly one head"),
        ([NodeSpec("a", {}, head=True), NodeSpec("a", {})], "unique"),
        ([NodeSpec("head-1", {}, head=True)], "alphanumeric"),
        ([NodeSpec("averyveryverylongname", {}, head=True)], "at most 12"),
    ],
)
def test_a_bed_refuses_nodes_it_cannot_name(tmp_path, nodes, problem):
    with pytest.raises(ValueError, match=problem):
        TestBed(tmp_path, nodes)


def test_down_spares_the_namespaces_of_a_bed_whose_owner_runs():
    mine = f"{testbed.PREFIX}{os.getpid()}.abc123-head"
    gone = f"{testbed.PREFIX}999999999.abc123-head"
    assert testbed._owner_alive(mine) and not testbed._owner_alive(gone)
    bed = TestBed("/tmp", [NodeSpec("head", {}, head=True)])
    assert bed.id.startswith(f"{os.getpid()}.") and bed.switch == f"{bed.tag}-switch"


def test_unavailable_says_why_or_nothing():
    reason = testbed.unavailable()
    assert reason is None or ("root" in reason or "`" in reason or "cannot" in reason)
