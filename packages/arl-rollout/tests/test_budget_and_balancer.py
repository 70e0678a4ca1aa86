import pytest

from arl.rollout import LoadBalancer, compute_budget


@pytest.mark.parametrize(
    ("staleness", "trigger", "expected_max_required"),
    [(0.0, 1, 8), (0.0, 2, 16), (0.5, 1, 12), (1.0, 2, 32)],
)
def test_budget_follows_reference_formulas(staleness, trigger, expected_max_required):
    b = compute_budget(
        require_batches=2,
        ppo_mini_batch_size=4,
        staleness_threshold=staleness,
        trigger_parameter_sync_step=trigger,
        replicas=2,
        per_replica=5,
    )
    assert b.required == 8
    assert b.max_required == expected_max_required
    assert b.max_concurrent == min(10, expected_max_required)
    assert b.max_queue == expected_max_required


def test_budget_rejects_bad_values_by_name():
    with pytest.raises(ValueError, match="actor.ppo_mini_batch_size"):
        compute_budget(
            require_batches=1,
            ppo_mini_batch_size=0,
            staleness_threshold=0,
            trigger_parameter_sync_step=1,
            replicas=1,
            per_replica=1,
        )
    with pytest.raises(ValueError, match="staleness_threshold"):
        compute_budget(
            require_batches=1,
            ppo_mini_batch_size=1,
            staleness_threshold=-1,
            trigger_parameter_sync_step=1,
            replicas=1,
            per_replica=1,
        )


def test_load_balancer_sticky_then_least_in_flight():
    lb = LoadBalancer(3)
    a = lb.acquire("traj-a")
    b = lb.acquire("traj-b")
    c = lb.acquire("traj-c")
    assert sorted([a, b, c]) == [0, 1, 2]  # spread over idle replicas
    assert lb.acquire("traj-a") == a  # sticky while the trajectory lives
    assert lb.in_flight[a] == 2
    lb.release(a)
    lb.release(a)
    lb.release(b)
    lb.forget("traj-a")
    # replica a and b are idle now; c is busy: a new trajectory avoids c
    assert lb.acquire("traj-d") in (a, b)
