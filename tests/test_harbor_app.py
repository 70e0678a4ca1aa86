"""A short real run of apps/train on Harbor tasks: the built-in small task set in the local sandbox,
terminus-2 talking to the per-trial proxy, vLLM (CPU build) and the trainer, one step (Harbor trials
over several steps and syncs are the agent preset's run, tests/test_agent_preset.py).

What it checks: Harbor trials become trained samples end to end, the per-phase timings and the
trajectories' turns reach metrics.jsonl, nothing fails by kind that should not, and the engine still
serves the trainer's weights. The random tiny model cannot solve the tasks (reward 0); the point is the
plumbing, not learning.
"""

import json
import shutil

import pytest

from arl_train.config import load_config
from arl_train.run import run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,  # a full app run (tiers: conftest.py)
    pytest.mark.skipif(shutil.which("tmux") is None, reason="terminus-2 needs tmux"),
]


@pytest.mark.exhaustive(
    reason="Harbor trials in the app are checked every run by the agent preset's run (tests/test_agent_preset.py: "
    "phases, turns, trial folders, weights), terminus-2 through the proxy by arl-harbor's test_terminus2.py"
)
def test_harbor_terminus2_run_on_the_local_sandbox(tmp_path, app_ray_head):
    from arl_train.tiny_model import build_tiny_model

    # terminus-2's first prompt is a few thousand tokens of the tiny byte-level tokenizer.
    model = build_tiny_model(tmp_path / "model8k", seed=0, max_position_embeddings=8192)
    config = load_config(
        mode="a",
        overrides=[
            "data.source=harbor:builtin:small",
            f"model.path={model}",
            "trainer.total_steps=1",
            "actor.ppo_mini_batch_size=2",
            "rollout.n=2",
            "rollout.max_tokens=32",
            "rollout.max_model_len=8192",
            "harbor.agent=terminus-2",
            "harbor.max_turns=2",
            "harbor.max_input_tokens=7000",
            "harbor.max_output_tokens=32",
            f"output.dir={tmp_path}",
            f"ray.address={app_ray_head}",
        ],
    )
    summary = run(config, log=print)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert summary.steps == 1 and summary.samples_consumed == 2
    rollout = rows[-1]["rollout"]
    print(json.dumps(rollout, indent=1))
    # Harbor phase timings were kept and averaged, and every trajectory took turns.
    for phase in ("environment_setup", "agent_setup", "agent_execution", "verifier", "trial"):
        assert rollout["phase_mean_s"][phase] > 0, phase
    assert rollout["trained_responses"] >= 4 and rollout["turns"] >= rollout["trained_responses"]
    assert not any(k in rollout["failed_by_kind"] for k in ("sandbox", "invalid_task", "verifier_network"))
    assert all(r["response_length_mean"] > 0 for r in rows)
    assert summary.weights_equal_after_sync
    assert list((tmp_path / "harbor_trials").iterdir())  # trial dirs under output.dir
