"""Per-step metrics: derived idle ratios and per-trajectory counts in metrics.jsonl and TensorBoard."""

import json

from tensorboard.backend.event_processing import event_accumulator

from arl_train.metrics import MetricsLog, derive, scalars


def _row(step, wait_s, step_s, elapsed, busy, turns, responses, **rollout):
    return {
        "step": step,
        "wait_s": wait_s,
        "step_s": step_s,
        "reward_mean": 0.5 * step,
        "rollout": {
            "manager_elapsed_s": elapsed,
            "engine_busy_s": busy,
            "engine_replicas": 2.0,
            "turns": turns,
            "trained_responses": responses,
            "engine_versions": [step],
            **rollout,
        },
    }


def test_derived_metrics_idle_ratio_per_side_over_the_step_window():
    first = _row(1, 1.0, 4.0, 10.0, 10.0, 6, 3, tool_calls=9, proxy_rebuilds=1)
    second = _row(2, 3.0, 4.0, 20.0, 15.0, 12, 6, tool_calls=12, proxy_rebuilds=2)
    d1, d2 = derive(first, None), derive(second, first)
    assert d1["trainer_idle_ratio"] == 0.25 and d2["trainer_idle_ratio"] == 0.75
    assert d1["rollout_idle_ratio"] == 0.5  # 10 busy s of 2 replicas x 10 s
    assert d2["rollout_idle_ratio"] == 0.75  # this step only: 5 busy s of 2 x 10 s
    assert d2["turns_per_trajectory"] == 2.0 and d2["tool_calls_per_trajectory"] == 2.0
    assert d2["proxy_rebuilds"] == 2.0
    assert "tool_calls_per_trajectory" not in derive(_row(1, 0, 1, 1, 0, 1, 1), None)  # not reported: absent
    assert scalars({"a": 1, "b": {"c": 2.5, "d": [1]}, "e": "x", "f": True}) == {
        "a": 1.0,
        "b/c": 2.5,
        "f": 1.0,
    }


def test_rows_go_to_jsonl_and_tensorboard(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write(_row(1, 1.0, 4.0, 10.0, 10.0, 6, 3))
    log.write(_row(2, 3.0, 4.0, 20.0, 15.0, 12, 6))
    log.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_idle_ratio"] for r in rows] == [0.5, 0.75]
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"trainer_idle_ratio", "rollout_idle_ratio", "reward_mean", "rollout/turns"} <= tags
    assert [(e.step, e.value) for e in acc.Scalars("trainer_idle_ratio")] == [(1, 0.25), (2, 0.75)]


def test_tells_per_step_and_on_the_step_line():
    from arl_train.metrics import progress_line

    first = _row(1, 1.0, 4.0, 10.0, 10.0, 6, 3, tells={"protected_touched": 2})
    second = _row(2, 1.0, 4.0, 20.0, 15.0, 12, 6, tells={"protected_touched": 2, "leftover_processes": 1})
    d2 = derive(second, first)
    assert d2["tells/protected_touched"] == 0.0 and d2["tells/leftover_processes"] == 1.0
    row = {
        **second,
        **d2,
        "staleness_mean": 0.0,
        "staleness_max": 0,
        "samples_per_s": 1.0,
        "sync_s": 0.0,
        "version": 2,
        "loss": 0.0,
    }
    assert progress_line(row, 10).endswith("| hacking tells: leftover_processes 1")
    assert "hacking" not in progress_line({**row, "tells/leftover_processes": 0.0}, 10)
