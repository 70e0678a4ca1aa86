"""Each fault of the harness (arl_train.faults), in its short form, on one shared chain of runs.

The chain (one module-scoped fixture, ~4 runs of the tiny model on the in-tree engine) injects: a
generation stalled past its timeout, the trainer actor killed, the rollout engine killed, the driver
SIGKILLed, each followed by a resume from the latest checkpoint; then a corrupted queue snapshot and
malformed proxy requests. Each test checks one fault's outcome; the last checks the sample ledger.
The tests without the chain (fast, no Ray) replay a chain's bookkeeping by hand, deterministically.
"""

import json
import uuid
from itertools import islice
from pathlib import Path

import pytest

from arl.queue.persistence import write_snapshot
from arl.rollout import cycle_tasks
from arl.rollout.types import Task
from arl_train import faults
from arl_train.ledger import CONSUMED, PRODUCED, TaskTracker


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    outcomes, book = faults.run_chain(
        tmp_path_factory.mktemp("faults"), "torch", total_steps=28, timeout_s=300
    )
    print(faults.format_table(outcomes))
    return {o.fault: o for o in outcomes}, book


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize(
    "fault",
    [
        "generation stalls past its timeout",
        "trainer actor killed, resumed",
        "rollout engine killed, resumed",
        "driver SIGKILLed, resumed",
        "corrupt queue snapshot",
        "malformed proxy requests",
    ],
)
def test_fault_is_handled(chain, fault):
    outcomes, _ = chain
    outcome = outcomes[fault]
    assert outcome.ok, (outcome.outcome, outcome.detail)
    assert outcome.samples_lost == 0, outcome


@pytest.mark.slow
@pytest.mark.e2e
def test_actor_deaths_reach_the_driver_within_seconds(chain):
    outcomes, _ = chain
    for fault in ("trainer actor killed, resumed", "rollout engine killed, resumed"):
        assert outcomes[fault].detail["detect_s"] < 30, outcomes[fault].detail
        assert outcomes[fault].detail["reason"], "the driver's error does not say why"


@pytest.mark.slow
@pytest.mark.e2e
def test_ledger_every_sample_consumed_once_or_accounted(chain):
    _, book = chain
    assert book["produced"] > 0
    assert book["consumed_twice"] == 0 and book["phantom"] == 0
    assert sum(book["lost_per_run"]) == 0, (book["lost_samples"], book["dropped"], book["rolled_back"])
    assert book["steps_continuous"] and book["versions_continuous"], book
    assert book["dropped"]["generate_timeout"] >= 1  # the stalled prompts, counted with their reason
    assert book["final_run"]["weights_equal_after_sync"] is True
    # The optimizer was restored at every resume (single-rank checkpoints): one Adam step per step.
    assert book["final_run"]["adam_steps"] == [float(book["final_run"]["end_step"])], book["final_run"]


@pytest.mark.slow
@pytest.mark.e2e
def test_sigkill_of_the_app_driver_leaves_no_ray_process(chain):
    """Run C's driver (the app's command line, its own local Ray) is SIGKILLed with its actors up: the
    watchdog (arl_train.watchdog) ends every process of the run, Ray's included, within 15 s."""
    outcomes, _ = chain
    detail = outcomes["driver SIGKILLed, resumed"].detail
    running = detail["running_before"]
    assert len(running) >= 5, running  # GCS, raylet, agents, actors
    assert any("RolloutActor" in t for t in running) and any("raylet" in t for t in running), running
    assert detail["left"] == [] and detail["cleanup_s"] < 15, detail


# ----- fast: the bookkeeping of a chain, by hand -----------------------------------------------------
class _FakeRun:
    """One run's rollout feed (the real TaskTracker), queue and ledger files, driven step by step."""

    def __init__(self, root: Path, name: str, tasks: list[Task], *, resume: dict | None = None) -> None:
        self.out = root / name
        (self.out / "ledger").mkdir(parents=True)
        resume = resume or {"skip": 0, "replay": [], "queue": []}
        self.tracker = TaskTracker(tasks, seed=0, skip=resume["skip"], replay=resume["replay"])
        self._feed = iter(self.tracker)
        self.queue: list[str] = list(resume["queue"])  # uids, oldest first (restored from the snapshot)
        self._rows: list[dict] = []

    def _log(self, name: str, record: dict) -> None:
        with (self.out / "ledger" / name).open("a") as f:
            f.write(json.dumps(record) + "\n")

    def start(self, k: int) -> list[Task]:
        """The feed loop starts `k` prompts."""
        return [task for _, task in islice(self._feed, k)]

    def produce(self, task: Task) -> None:
        """The prompt's sample reaches the queue (what ledger.RecordingSink does)."""
        uid = uuid.uuid4().hex
        self.queue.append(uid)
        self.tracker.queued(task.id)
        self._log(PRODUCED, {"uid": uid, "task_id": task.id, "version": 0})

    def take(self, step: int, n: int = 2) -> None:
        """The trainer takes `n` samples for `step` (what ledger.RecordingSource records)."""
        for _ in range(min(n, len(self.queue))):
            self._log(CONSUMED, {"uid": self.queue.pop(0), "step": step})

    def train(self, step: int) -> None:
        self.take(step)
        self._rows.append({"step": step, "version": step, "rollout": {}})

    def checkpoint(self) -> dict:
        """What run.save_checkpoint records: the dataset position, the positions in flight, the queue."""
        t = self.tracker
        return {"skip": t.next_position, "replay": t.in_flight(), "queue": list(self.queue)}

    def rows(self) -> list[dict]:
        return self._rows

    def save_final(self) -> None:
        """The final checkpoint's queue snapshot and dataset position (what run._finish saves)."""
        assert not self.queue, "the fake writes an empty snapshot only"
        write_snapshot(self.out / "checkpoint", [])
        (self.out / "checkpoint" / "trainer_state.json").write_text(json.dumps(self.tracker.position()))


def test_replays_not_started_yet_survive_a_second_resume(tmp_path):
    """The race behind "3 samples lost in run A": run A's checkpoint lists many positions in flight
    (prompts dropped by the stall stay listed, plus those generating); A produces samples for the
    generating ones after that checkpoint, then its trainer dies. Run B replays A's list a few at a time
    (the staleness budget admits ~2 prompts a step) and checkpoints before it has started them all; run
    C resumes from B's checkpoint. B's checkpoint listed only the replays B had started, so C skipped
    the rest and A's samples for them were neither consumed, queued, nor re-run: lost. Whether it
    happened in the app depended on how many steps B ran before the checkpoint C resumed from."""
    tasks = [Task(id=f"t{i}", messages=[{"role": "user", "content": str(i)}]) for i in range(64)]
    order = [t.id for _, t in islice(cycle_tasks(tasks, seed=0), 64)]
    a = _FakeRun(tmp_path, "A", tasks)
    started = a.start(12)  # positions 0..11
    for task in started[:4]:
        a.produce(task)
    a.train(1)
    a.train(2)
    # positions 4..7: dropped by the stall (counted, never queued); 8..11: generating at the checkpoint
    ck_a = a.checkpoint()
    assert ck_a == {"skip": 12, "replay": list(range(4, 12)), "queue": []}
    for task in started[8:]:  # produced after the checkpoint; the trainer takes two, then is killed
        a.produce(task)
    a.take(3)

    b = _FakeRun(tmp_path, "B", tasks, resume=ck_a)
    for task in b.start(3):  # replays of positions 4, 5, 6
        b.produce(task)
    b.train(3)
    ck_b = b.checkpoint()  # B dies after this checkpoint (its engine killed)
    assert ck_b["replay"] == [7, 8, 9, 10, 11], "replays B had not started yet must stay listed"

    c = _FakeRun(tmp_path, "C", tasks, resume=ck_b)  # the last run: goes to the end
    rerun = c.start(len(ck_b["replay"]) + 2)
    assert [t.id for t in rerun] == [order[p] for p in [7, 8, 9, 10, 11, 12, 13]]
    for task in rerun:
        c.produce(task)
    step = 4
    while c.queue:
        c.train(step)
        step += 1

    book = faults.check_ledger([(a, 2), (b, 3), (c, None)], total_steps=step - 1)
    assert book["lost_per_run"] == [0, 0, 0], book["lost_samples"]
    assert book["rolled_back"] == 4 and book["consumed_twice"] == 0 and book["phantom"] == 0
    assert book["steps_continuous"] and book["versions_continuous"]


def test_a_replay_backlog_longer_than_the_runs_after_it_is_pending_not_lost(tmp_path):
    """A stall on a loaded machine drops many prompts (78 in one chain): their positions all wait for
    replay, ahead of those generating at the checkpoint, and the staleness budget replays ~2 a step. The
    final run ends before the backlog does; the samples of the prompts at its end were rolled back with
    their run, and their tasks wait in the final checkpoint's list, for the next resume: not lost."""
    tasks = [Task(id=f"t{i}", messages=[{"role": "user", "content": str(i)}]) for i in range(64)]
    a = _FakeRun(tmp_path, "A", tasks)
    started = a.start(24)  # positions 0..23
    for task in started[:2]:
        a.produce(task)
    a.train(1)
    # positions 2..21: dropped by the stall; 22, 23: generating at the checkpoint
    ck_a = a.checkpoint()
    for task in started[22:]:  # produced after the checkpoint and taken for step 2; then the trainer dies
        a.produce(task)
    a.take(2)

    b = _FakeRun(tmp_path, "B", tasks, resume=ck_a)  # the last run: three steps, six replays
    for step in (2, 3, 4):
        for task in b.start(2):
            b.produce(task)
        b.train(step)
    b.save_final()
    state = json.loads((b.out / "checkpoint" / "trainer_state.json").read_text())
    assert state["tasks_in_flight"] == list(range(8, 24)) and state["tasks_started"] == 24
    book = faults.check_ledger([(a, 1), (b, None)], total_steps=4)
    assert book["lost_per_run"] == [0, 0], book["lost_samples"]
    assert book["pending_replay"] == 2 and book["rolled_back"] == 0
    assert book["steps_continuous"] and book["consumed_twice"] == 0 and book["phantom"] == 0
