"""Each fault of the harness (apps/train/benchmarks/faults.py), in its short form, on one shared chain of runs.

The chain (one module-scoped fixture, ~4 runs of the tiny model on the in-tree engine) injects: a
generation stalled past its timeout, the trainer actor killed, the rollout engine killed, the driver
SIGKILLed, each followed by a resume from the latest checkpoint; then a corrupted queue snapshot and
malformed proxy requests. Each test checks one fault's outcome; the last checks the sample ledger.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location(
    "arl_faults", Path(__file__).resolve().parents[1] / "apps" / "train" / "benchmarks" / "faults.py"
)
faults = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = faults  # dataclasses look their module up there
_spec.loader.exec_module(faults)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    outcomes, book = faults.run_chain(tmp_path_factory.mktemp("faults"), "torch", total_steps=40, timeout_s=300)
    print(faults.format_table(outcomes))
    return {o.fault: o for o in outcomes}, book


@pytest.mark.parametrize("fault", [
    "generation stalls past its timeout",
    "trainer actor killed, resumed",
    "rollout engine killed, resumed",
    "driver SIGKILLed, resumed",
    "corrupt queue snapshot",
    "malformed proxy requests",
])
def test_fault_is_handled(chain, fault):
    outcomes, _ = chain
    outcome = outcomes[fault]
    assert outcome.ok, (outcome.outcome, outcome.detail)
    assert outcome.samples_lost == 0, outcome


def test_actor_deaths_reach_the_driver_within_seconds(chain):
    outcomes, _ = chain
    for fault in ("trainer actor killed, resumed", "rollout engine killed, resumed"):
        assert outcomes[fault].detail["detect_s"] < 30, outcomes[fault].detail
        assert outcomes[fault].detail["reason"], "the driver's error does not say why"


def test_ledger_every_sample_consumed_once_or_accounted(chain):
    _, book = chain
    assert book["produced"] > 0
    assert book["consumed_twice"] == 0 and book["phantom"] == 0
    assert sum(book["lost_per_run"]) == 0, (book["lost_samples"], book["dropped"], book["rolled_back"])
    assert book["steps_continuous"] and book["versions_continuous"], book
    assert book["dropped"]["generate_timeout"] >= 1  # the stalled prompts, counted with their reason
    assert book["final_run"]["weights_equal_after_sync"] is True
