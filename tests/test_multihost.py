"""arl on a Ray cluster of several hosts: real `ray start` nodes, each in its own network, mount, UTS
and PID namespaces (arl_train.testbed), on one machine.

One bed for the whole module (started once): `head` (the driver, the queue, the rollout actor, the
agent-loop worker: a "sandbox" node), `t1` and `t2` ("trainer"), `r1` and `r2` ("rollout"); only the
shared folder is shared. A chain of two runs of the app's command line, started on the head as
`python -m arl_train.cli ray.address=<head> storage.shared_dir=<shared>`, with a checkpoint every step:

  A: two FSDP2 ranks on t1 and t2 (gloo, meeting at t1's address), two replicas (the in-tree engine)
     on r1 and r2, weights over TCP. r2 is lost mid-run (its namespace's processes killed): its
     requests fail over to r1, the run goes on. A's answers are long enough (A_MAX_TOKENS) that
     generation, not training, sets the pace, so the replicas are always generating and the loss
     catches requests in flight (with the default 12 tokens they often sat idle, gated by staleness).
     Then t1 (rank 0's node) is lost: the driver fails within seconds, saying why.
  C: a new node t3 joins; resumed from A's last checkpoint in the shared folder, the ranks on t2 and
     t3, the replica on vLLM (the embedded default's engine); it runs to its end, the engine's weights
     equal to the trainer's.

Over the chain the digits reward rises, and the ledger shows every sample consumed once or accounted
for. Besides: a run that cannot see its folder on a node is refused at start, naming node and path; the
nodes are isolated as hosts are.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import time

import pytest

from arl_train import faults, testbed
from arl_train.testbed import NodeSpec

# Full app runs (tiers: conftest.py); the chain is one fixture of several runs: more than the default timeout.
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(2400)]

UNAVAILABLE = testbed.unavailable()
NODES = [
    NodeSpec("head", {"sandbox": 1}, head=True),
    NodeSpec("t1", {"trainer": 1}),
    NodeSpec("t2", {"trainer": 1}),
    NodeSpec("r1", {"rollout": 1}),
    NodeSpec("r2", {"rollout": 1}),
]
TOTAL_STEPS = 12
LOSE_ROLLOUT_AT, LOSE_TRAINER_AT = 2, 6
A_MAX_TOKENS = 48
# lr 1e-2 makes the digits reward rise within the chain's 12 steps (0.003 -> 0.8 in 16 steps on one host).
COMMON = [
    "resources.trainer_cpu_ranks=2",
    "run.agent_workers=1",
    "trainer.save_every=1",
    "actor.optim.lr=1e-2",
    f"trainer.total_steps={TOTAL_STEPS}",
]
TIMEOUT_S = 900.0


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    if UNAVAILABLE:
        pytest.skip(UNAVAILABLE)
    root = tmp_path_factory.mktemp("multihost")
    with testbed.bed(root / "shared", NODES, log_dir=root / "logs") as b:
        yield b


def _app(bed: testbed.TestBed, name: str, overrides: list[str]) -> faults.AppRun:
    """The app's command line on the head, joining the bed's cluster, its run folder in the shared folder."""

    def launch(argv, **kw):
        return bed.popen("head", argv, **kw)

    return faults.AppRun(
        name,
        bed.shared_dir,
        [f"ray.address={bed.address}", f"storage.shared_dir={bed.shared_dir}", *overrides],
        TIMEOUT_S,
        launch=launch,
    )


def _summary(run: faults.AppRun) -> dict:
    return json.loads((run.out / "summary.json").read_text())


@pytest.fixture(scope="module")
def chain(bed):
    out: dict = {}
    a = _app(
        bed,
        "A",
        [*COMMON, "rollout.engine=torch", "rollout.replicas=2", f"rollout.max_tokens={A_MAX_TOKENS}"],
    )
    try:
        a.wait_step(LOSE_ROLLOUT_AT)  # between syncs: the trainer trains while both replicas generate
        bed.kill("r2")
        a.wait_step(LOSE_TRAINER_AT)
        bed.kill("t1")
        killed = time.monotonic()
        out["A_exit"] = a.wait_exit()
        out["A_detect_s"] = time.monotonic() - killed
    finally:
        a.cleanup()
    out["A"] = a
    bed.add_node(NodeSpec("t3", {"trainer": 1}))
    resume, out["resumed_at"] = faults.latest_checkpoint(a.out)
    c = _app(
        bed, "C", [*COMMON, "rollout.engine=vllm", "rollout.replicas=1", f"trainer.resume_from={resume}"]
    )
    try:
        out["C_exit"] = c.wait_exit()
    finally:
        c.cleanup()
    out["C"] = c
    return out


def test_nodes_are_hosts_of_their_own(bed):
    """Own hostname, address, /tmp and /dev/shm; the machine's files read-only; the shared folder shared;
    no route anywhere but the bridge's subnet."""
    (bed.shared_dir / "from-host").write_text("x")
    seen = bed.run(
        "t1",
        [
            "sh",
            "-c",
            "hostname; ip -4 -o addr show eth0; ip route; ls /tmp; cat "
            f"{bed.shared_dir}/from-host; touch /work/arl-probe 2>&1; true",
        ],
    ).stdout
    assert seen.startswith("t1\n") and f"inet {bed.nodes['t1'].ip}/24" in seen
    assert "default" not in seen and "10.213.0.0/24 dev eth0" in seen
    assert "Read-only file system" in seen and "\nx" in seen and "ray" in seen
    far = bed.run(
        "t1",
        [
            sys.executable,
            "-c",
            "import socket; s=socket.socket(); s.settimeout(2); print(s.connect_ex(('10.0.0.1', 9)))",
        ],
    ).stdout.strip()
    assert far == "101"  # ENETUNREACH: nothing outside the bed is reachable


def test_a_run_that_cannot_see_its_folder_on_a_node_is_refused_naming_it(bed, tmp_path):
    """The run folder on the head's private /tmp: the trainer and rollout nodes do not see it."""
    private = "/tmp/arl-private-run"
    done = bed.run(
        "head",
        [
            sys.executable,
            "-m",
            "arl_train.cli",
            f"ray.address={bed.address}",
            f"output.dir={private}",
            "trainer.total_steps=1",
            "rollout.engine=torch",
        ],
        check=False,
        timeout=300,
    )
    text = done.stdout + done.stderr
    assert done.returncode != 0
    assert "cannot see what the run needs" in text, text[-3000:]
    assert f"node {bed.nodes['t1'].ip}" in text and f"the run folder (output.dir) {private}" in text, text[
        -3000:
    ]
    assert "storage.shared_dir" in text


def _placement(run: faults.AppRun) -> dict:
    """Trainer rank 0's `placement()`, from the run's "arl: trainer {...} | replicas" line."""
    line = next(x for x in run.tail(None).splitlines() if x.startswith("arl: trainer {"))
    return ast.literal_eval(line.removeprefix("arl: trainer ").split(" | replicas")[0].split(" + ")[0])


def test_across_hosts_the_app_places_each_part_by_node_resource(chain, bed):
    ip = {name: node.ip for name, node in bed.nodes.items()}
    assert (
        f"arl: nodes: driver {ip['head']} | trainer ranks {ip['t1']}, {ip['t2']} | replicas {ip['r1']}, "
        f"{ip['r2']} | agent workers {ip['head']}; weights over 'tcp'"
    ) in chain["A"].tail(None)
    trainer = _placement(chain["A"])
    assert trainer["node"] == ip["t1"] and trainer["sync_address"].startswith(f"tcp://{ip['t1']}:")
    # FSDP2's two ranks on two hosts met at rank 0's node address, never loopback.
    assert trainer["world_size"] == 2 and trainer["rendezvous"].startswith(f"{ip['t1']}:")


def test_a_lost_rollout_node_fails_over_and_the_run_goes_on(chain):
    rows = chain["A"].rows()
    assert len(rows) >= LOSE_TRAINER_AT
    last = rows[-1]["rollout"]
    assert last["replicas_healthy"] == [0] and last["failovers"] > 0  # r2's requests resumed on r1
    assert last["dropped_failed"] == 0 and last["dropped_timeout"] == 0 and last["failed_trajectories"] == 0
    # a sync every step, after the loss too
    assert [r["version"] for r in rows] == list(range(1, len(rows) + 1))


def test_a_lost_trainer_node_fails_the_run_fast_with_the_cause(chain, bed):
    assert chain["A_exit"] == 1 and chain["A_detect_s"] < 60, chain["A_detect_s"]
    failed = next(
        line for line in chain["A"].tail(None).splitlines() if line.startswith("arl-train: the run failed:")
    )
    # The driver names the part, its node and what Ray knows, and where to resume from.
    assert re.search(
        rf"NodeLostError: trainer rank [01] on node ({bed.nodes['t1'].ip}) \(\w+\) was lost "
        r"\((ActorDiedError|ActorUnavailableError)\): the node is gone",
        failed,
    ), failed
    assert f"trainer.resume_from={chain['A'].out}/checkpoints/step_" in failed, failed


def test_the_run_resumes_on_a_new_node_from_the_shared_checkpoint_and_ends_with_equal_weights(chain, bed):
    c = chain["C"]
    assert chain["C_exit"] == 0, c.tail(4000)
    assert chain["resumed_at"] >= LOSE_TRAINER_AT - 1
    assert (
        f"trainer ranks {bed.nodes['t2'].ip}, {bed.nodes['t3'].ip} | replicas {bed.nodes['r1'].ip}"
        in c.tail(None)
    )
    s = _summary(c)
    assert s["steps"] == TOTAL_STEPS - chain["resumed_at"] and s["rollout"]["engine_versions"] == [
        TOTAL_STEPS
    ]
    assert s["weights_equal_after_sync"] and s["weights_max_abs_diff"] == 0.0  # vLLM's weights, sent over TCP
    assert s["probe_logprob_max_abs_diff"] < 1e-4


def test_over_the_chain_it_learns(chain):
    rewards = [r["reward_mean"] for r in chain["A"].rows()[: chain["resumed_at"]]] + [
        r["reward_mean"] for r in chain["C"].rows()
    ]
    assert len(rewards) == TOTAL_STEPS
    # 12 steps of the digits task: the reward is still small at the end (0.003 -> ~0.15 with A's 48-token
    # answers on an idle 2-core machine), but it has risen by an order of magnitude.
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > 5 * first and last > first + 0.02, rewards


def test_the_ledger_over_the_chain_has_nothing_lost_or_trained_twice(chain):
    book = faults.check_ledger([(chain["A"], chain["resumed_at"]), (chain["C"], None)], TOTAL_STEPS)
    assert book["produced"] > 0 and book["consumed_twice"] == 0 and book["phantom"] == 0
    assert sum(book["lost_per_run"]) == 0, (book["lost_samples"], book["dropped"], book["rolled_back"])
    assert book["steps_continuous"] and book["versions_continuous"], book


def test_the_beds_namespaces_carry_its_name(bed):
    """So that `close` and `python -m arl_train.testbed down` find every one of them."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert all(f"{testbed.PREFIX}{bed.id}-{n}" in names for n in ("switch", "head", "r1"))
