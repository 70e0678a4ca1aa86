import json

import pytest

from arl.rollout import get_reward, load_tasks
from arl.rollout.errors import DatasetError, UnknownRewardError


def test_jsonl_rows_become_tasks(tmp_path):
    path = tmp_path / "tasks.jsonl"
    rows = [
        {"prompt": "What is 2+2?", "ground_truth": "4", "reward_fn": "last_number"},
        {"id": "x", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tasks = load_tasks(str(path))
    assert [t.id for t in tasks] == ["tasks-0", "x"]
    assert tasks[0].messages == [{"role": "user", "content": "What is 2+2?"}]
    assert tasks[1].agent == "single_turn"


def test_bad_rows_are_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"nothing": 1}\n')
    with pytest.raises(DatasetError, match="row 1"):
        load_tasks(str(path))
    path.write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(DatasetError, match="row 1: invalid JSON"):
        load_tasks(str(path))
    with pytest.raises(DatasetError, match="not found"):
        load_tasks(str(tmp_path / "missing.jsonl"))
    with pytest.raises(DatasetError, match="unknown dataset format"):
        load_tasks(str(path.with_suffix(".csv").write_text("") or path.with_suffix(".csv")))


def test_builtin_digits_is_deterministic_and_scored():
    a = load_tasks("builtin:digits", seed=3, size=20)
    b = load_tasks("builtin:digits", seed=3, size=20)
    assert [t.messages for t in a] == [t.messages for t in b]
    assert all(t.reward_fn == "digits" for t in a)
    digits = get_reward("digits")
    assert digits(" 1234\n", None) == 1.0
    assert digits("ab12", None) == 0.5
    assert digits("", None) == 0.0
    assert get_reward("last_number")("so the answer is 42", "42") == 1.0
    with pytest.raises(UnknownRewardError):
        get_reward("nope")
