"""Turns arl-proxy generated but never delivered (the agent disconnected) reach the rollout's counters."""

from arl.proxy.types import Trajectory
from arl.rollout.rollouter import RolloutStats
from arl.rollout.trajectories import result_from_trajectory


def _trajectory(dropped: int) -> Trajectory:
    return Trajectory(
        session_id="s",
        prompt_ids=[1, 2],
        response_ids=[3, 4],
        response_mask=[1, 1],
        response_logprobs=[-0.1, -0.2],
        num_turns=1,
        messages=[],
        finish_reason="stop",
        rebuilds=0,
        dropped_turns=dropped,
    )


def test_a_trajectory_s_dropped_turns_are_carried_and_counted_trained_or_not():
    stats = RolloutStats()
    kept = result_from_trajectory(_trajectory(2), reward=1.0)
    assert kept.dropped_turns == 2
    stats.record(kept)
    failed = result_from_trajectory(_trajectory(1), reward=0.0, failed=True, failure_kind="verifier_timeout")
    stats.record(failed)
    stats.record(result_from_trajectory(_trajectory(0), reward=1.0))
    counters = stats.as_dict()
    assert counters["proxy_dropped_turns"] == 3
    assert counters["trained_responses"] == 2 and counters["failed_by_kind"] == {"verifier_timeout": 1}


def test_tells_count_trials_that_showed_each_sign_failed_or_kept():
    stats = RolloutStats()
    flagged = result_from_trajectory(_trajectory(0), reward=0.0)
    flagged.tells = {"protected_touched": 3.0, "leftover_processes": 1.0}
    stats.record(flagged)
    broke = result_from_trajectory(_trajectory(0), reward=0.0, failure_kind="agent_broke_verifier")
    broke.tells = {"agent_broke_verifier": 1.0, "protected_touched": 0.0}
    stats.record(broke)
    stats.record(result_from_trajectory(_trajectory(0), reward=1.0))
    assert stats.as_dict()["tells"] == {
        "protected_touched": 1,
        "leftover_processes": 1,
        "agent_broke_verifier": 1,
    }
