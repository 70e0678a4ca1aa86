"""The task tracker: positions in flight at a checkpoint are replayed by the resumed run, none skipped."""

from itertools import islice

from arl.rollout import cycle_tasks
from arl.rollout.types import Task
from arl_train.ledger import TaskTracker


def test_in_flight_positions_are_replayed_after_a_resume():
    tasks = [Task(id=f"t{i}", messages=[{"role": "user", "content": str(i)}]) for i in range(5)]
    order = [t.id for _, t in islice(cycle_tasks(tasks, seed=3), 12)]
    first = TaskTracker(tasks, seed=3)
    started = [t.id for _, t in islice(iter(first), 4)]
    assert started == order[:4]
    first.queued(order[1])
    first.queued(order[3])
    # Checkpoint: positions 0 and 2 were started but their samples are not queued.
    assert first.next_position == 4 and first.in_flight() == [0, 2]
    resumed = TaskTracker(tasks, seed=3, skip=first.next_position, replay=first.in_flight())
    again = [t.id for _, t in islice(iter(resumed), 5)]
    assert again == [order[0], order[2], *order[4:7]]
    assert resumed.next_position == 7 and resumed.in_flight() == [0, 2, 4, 5, 6]
