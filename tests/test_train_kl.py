"""The app with KL to a reference policy (`actor.algorithm.kl_coef > 0`): it trains, reports the KL,
records the base model in its checkpoint, and a resumed trainer takes that base model (not the
checkpoint it resumes from) as its reference."""

import json
from pathlib import Path

import pytest

from arl_train.config import load_config
from arl_train.run import run

pytestmark = pytest.mark.slow

COMMON = ["rollout.engine=torch", "actor.ppo_mini_batch_size=2", "rollout.n=2", "rollout.max_tokens=8",
          "async_training.staleness_threshold=1.0", "actor.algorithm.kl_coef=0.01"]


def _tasks(tmp_path):
    """Prompts scored by `synthetic_hash`: every group has reward variance, so every step updates."""
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Say something {i}.", "reward_fn": "synthetic_hash"}) + "\n"
                            for i in range(64)))
    return f"data.source={path}"


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_kl_run_reports_the_kl_and_resumes_against_the_base_model(tmp_path):
    data = _tasks(tmp_path)
    first = run(load_config(overrides=[*COMMON, data, "trainer.total_steps=2", f"output.dir={tmp_path / 'a'}"]),
                log=lambda _: None)
    assert first.steps == 2 and first.weights_equal_after_sync
    rows = _rows(tmp_path / "a")
    assert all(r["grad_norm"] > 0 and r["ref_s"] > 0 for r in rows)
    assert rows[0]["kl_ref_mean"] == 0.0  # step 1, one update: the policy is its reference (fp32, CPU)
    assert rows[-1]["kl_ref_mean"] > 0.0  # after updates the policy has moved away from it
    base = str((tmp_path / "a" / "model").resolve())
    checkpoint = tmp_path / "a" / "checkpoint"
    assert json.loads((checkpoint / "trainer_state.json").read_text())["reference_path"] == base

    # The resumed run's trainer (TrainerActor) takes its reference from the checkpoint's record, so
    # the KL keeps pointing at the base model; built here as TrainerActor builds it (without Ray: a
    # second app run would double this test's time).
    import torch

    from arl.trainer import HFPolicy, TrainerConfig
    from arl.queue.types import Response, Sample
    from arl.trainer.batch import assemble_batch
    from arl_train.actors import reference_path_of

    resumed = load_config(overrides=[*COMMON, data, "trainer.total_steps=3", f"trainer.resume_from={checkpoint}",
                                     f"output.dir={tmp_path / 'b'}"])
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert reference_path_of(resumed, str(checkpoint), state) == base
    assert reference_path_of(load_config(overrides=[*COMMON, data]), str(tmp_path / "a" / "model"), None) == base
    tcfg = TrainerConfig(algorithm=resumed.actor.algorithm, mixed_precision="none")
    policy = HFPolicy(checkpoint, tcfg, reference_path=reference_path_of(resumed, str(checkpoint), state))
    ids = torch.randint(1, policy.model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0)).tolist()
    batch = assemble_batch([Sample(uid="probe", prompt_ids=ids[0][:4], responses=[Response(
        response_ids=row[4:], response_mask=[1] * 8, response_logprobs=[0.0] * 8, weight_versions=[0] * 8, reward=0.0)
        for row in ids], start_version=0, end_version=0)], pad_token_id=0)
    base_policy = HFPolicy(base, TrainerConfig(mixed_precision="none"))
    assert torch.equal(policy.reference_log_probs(batch), base_policy.log_probs(batch))
    assert not torch.equal(policy.log_probs(batch), base_policy.log_probs(batch))  # so its KL is > 0
