"""Stop a run at a checkpoint and resume it, with a data-parallel trainer and KL to a reference policy:
one chain of two app runs.

The trainer is two FSDP2 ranks (gloo, on the CPU) behind one trainer loop
(`resources.trainer_cpu_ranks=2`): rank 0 reads the queue and syncs the engine, rank 1 follows its
collectives (`arl.trainer.group`). The first run (3 steps, `actor.algorithm.kl_coef > 0`) trains,
reports the KL, consumes every sample exactly once (the ledger) and writes a sharded checkpoint
recording the step, weight version, dataset position, queued samples and the base model; the second
resumes it to step 5. Checked: weights, optimizer, step, weight version and queued samples carry over,
the engine ends holding exactly the trainer's weights, and the resumed trainer takes the base model
(not the checkpoint it resumes from) as its reference. One chain serves three subjects (resume, KL,
FSDP ranks): two app runs instead of five, on one Ray head (`app_ray_head`, root conftest.py). The
single-rank checkpoint is resumed three times by the fault chain (tests/test_faults.py).
"""

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from arl.queue.persistence import SNAPSHOT_FILENAME, read_snapshot
from arl_train import ledger
from arl_train.config import load_config
from arl_train.run import run

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # a full app run (tiers: conftest.py)

COMMON = [
    "rollout.engine=torch",
    "actor.ppo_mini_batch_size=2",
    "rollout.n=2",
    "rollout.max_tokens=8",
    "async_training.staleness_threshold=1.0",
    "actor.algorithm.kl_coef=0.01",
    "resources.trainer_cpu_ranks=2",
]


def _tasks(tmp_path: Path) -> str:
    """Prompts scored by `synthetic_hash`: every group has reward variance, so every step updates."""
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        "".join(
            json.dumps({"prompt": f"Say something {i}.", "reward_fn": "synthetic_hash"}) + "\n"
            for i in range(64)
        )
    )
    return f"data.source={path}"


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _consumed_once(out_dirs: list[Path], expected: int) -> None:
    """The last run's trainer took `expected` samples, each once, each produced by one of the runs
    (a resumed run first trains on the samples its checkpoint had queued)."""
    _, consumed = ledger.read(out_dirs[-1] / "ledger")
    produced = {p["uid"] for d in out_dirs for p in ledger.read(d / "ledger")[0]}
    uids = [c["uid"] for c in consumed]
    assert len(uids) == expected, "every step took exactly its batch, on rank 0 only"
    assert max(Counter(uids).values()) == 1, "a sample was consumed twice"
    assert set(uids) <= produced


@pytest.fixture(scope="module")
def chain(tmp_path_factory, app_ray_head):
    """Run a (3 steps, checkpoint) then b (resumed from a's checkpoint to step 5), on one Ray head."""
    tmp = tmp_path_factory.mktemp("resume")
    data = _tasks(tmp)
    checkpoint = tmp / "a" / "checkpoint"
    ray = f"ray.address={app_ray_head}"
    first = run(
        load_config(overrides=[*COMMON, data, ray, "trainer.total_steps=3", f"output.dir={tmp / 'a'}"]),
        log=lambda _: None,
    )
    queued = read_snapshot(checkpoint)  # samples produced but not yet trained on (read before b runs)
    second = run(
        load_config(
            overrides=[
                *COMMON,
                data,
                ray,
                "trainer.total_steps=5",
                f"trainer.resume_from={checkpoint}",
                f"output.dir={tmp / 'b'}",
            ]
        ),
        log=lambda _: None,
    )
    return {
        "tmp": tmp,
        "data": data,
        "first": first,
        "second": second,
        "checkpoint": checkpoint,
        "queued": queued,
    }


def test_the_checkpoint_records_step_version_position_queue_and_base_model(chain):
    checkpoint, tmp = chain["checkpoint"], chain["tmp"]
    assert chain["first"].steps == 3 and chain["first"].weights_equal_after_sync
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["step"] == 3 and state["version"] == 3 and state["samples_seen"] == 6
    assert state["tasks_started"] >= 6
    assert (checkpoint / "dcp").is_dir() and (checkpoint / "rng_rank1.pt").is_file()  # sharded, both ranks
    assert (checkpoint / SNAPSHOT_FILENAME).is_file()
    assert state["reference_path"] == str((tmp / "a" / "model").resolve())
    trained = load_file(checkpoint / "model.safetensors")  # the HF export rank 0 wrote
    initial = load_file(tmp / "a" / "model" / "model.safetensors")
    assert any(not torch.equal(trained[k], initial[k].to(trained[k].dtype)) for k in initial)


def test_two_trainer_ranks_train_and_leave_the_engine_their_weights(chain):
    first, tmp = chain["first"], chain["tmp"]
    assert first.samples_consumed == 6
    assert first.rollout["engine_versions"] == [3]
    assert first.weights_equal_after_sync and first.weights_max_abs_diff == 0.0, first.weights_problems
    _consumed_once([tmp / "a"], 6)


def test_kl_run_reports_the_kl(chain):
    rows = _rows(chain["tmp"] / "a")
    assert all(r["grad_norm"] > 0 and r["ref_s"] > 0 for r in rows)
    assert rows[0]["kl_ref_mean"] == 0.0  # step 1, one update: the policy is its reference (fp32, CPU)
    assert rows[-1]["kl_ref_mean"] > 0.0  # after updates the policy has moved away from it


def test_resume_continues_where_the_checkpoint_stopped(chain):
    second, queued, tmp = chain["second"], chain["queued"], chain["tmp"]
    rows = _rows(tmp / "b")
    assert [r["step"] for r in rows] == [4, 5]  # the step count continues
    assert [r["version"] for r in rows] == [4, 5]  # so does the weight version, engine included
    assert second.rollout["engine_versions"] == [5]
    assert second.samples_consumed == 10
    assert second.weights_max_abs_diff == 0.0, second.weights_problems
    _consumed_once([tmp / "a", tmp / "b"], 4)
    _, consumed_a = ledger.read(tmp / "a" / "ledger")
    _, consumed_b = ledger.read(tmp / "b" / "ledger")
    assert not {c["uid"] for c in consumed_a} & {c["uid"] for c in consumed_b}  # none trained on twice
    # The samples queued at the checkpoint come back first (FIFO): step 4 trains on the first two of
    # them, so its staleness is exactly theirs.
    assert len(queued) >= 2
    assert rows[0]["staleness_max"] == max(3 - s.min_token_version() for s in queued[:2])
    assert rows[0]["staleness_mean"] == sum(3 - s.min_token_version() for s in queued[:2]) / 2
    assert second.weights_equal_after_sync
    # It trained further from the restored optimizer: two more updates on top of the checkpoint's three.
    # (Asserted on the optimizer, not the weights: with the digits task a tiny untrained model can draw
    # only zero-advantage groups, and Adam with zero gradients and zero moments leaves the weights as they are.)
    assert _adam_steps(tmp / "b" / "checkpoint", tmp) == {5.0}
    assert _adam_steps(chain["checkpoint"], tmp) == {3.0}
    resumed = load_file(tmp / "b" / "checkpoint" / "model.safetensors")
    trained = load_file(chain["checkpoint"] / "model.safetensors")
    assert any(not torch.equal(resumed[k], trained[k]) for k in trained)  # it trained further


def test_the_resumed_trainer_keeps_the_base_model_as_its_reference(chain):
    """The resumed run's trainer (TrainerActor) takes its reference from the checkpoint's record, so the
    KL keeps pointing at the base model: the resumed run's first step already measures a KL > 0 (its
    policy is the checkpoint's, three updates from the base), and a policy built here as TrainerActor
    builds it gives the base model's log probs as its reference."""
    from arl.queue.types import Response, Sample
    from arl.trainer import HFPolicy, TrainerConfig
    from arl.trainer.batch import assemble_batch
    from arl_train.actors import reference_path_of

    tmp, data, checkpoint = chain["tmp"], chain["data"], chain["checkpoint"]
    assert _rows(tmp / "b")[0]["kl_ref_mean"] > 0.0  # against its own start (the checkpoint) it would be 0
    base = str((tmp / "a" / "model").resolve())
    resumed = load_config(
        overrides=[
            *COMMON,
            data,
            "trainer.total_steps=5",
            f"trainer.resume_from={checkpoint}",
            f"output.dir={tmp / 'b'}",
        ]
    )
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert reference_path_of(resumed, str(checkpoint), state) == base
    assert reference_path_of(load_config(overrides=[*COMMON, data]), str(tmp / "a" / "model"), None) == base
    tcfg = TrainerConfig(algorithm=resumed.actor.algorithm, mixed_precision="none")
    policy = HFPolicy(checkpoint, tcfg, reference_path=reference_path_of(resumed, str(checkpoint), state))
    ids = torch.randint(
        1, policy.model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0)
    ).tolist()
    batch = assemble_batch(
        [
            Sample(
                uid="probe",
                prompt_ids=ids[0][:4],
                responses=[
                    Response(
                        response_ids=row[4:],
                        response_mask=[1] * 8,
                        response_logprobs=[0.0] * 8,
                        weight_versions=[0] * 8,
                        reward=0.0,
                    )
                    for row in ids
                ],
                start_version=0,
                end_version=0,
            )
        ],
        pad_token_id=0,
    )
    base_policy = HFPolicy(base, TrainerConfig(mixed_precision="none"))
    assert torch.equal(policy.reference_log_probs(batch), base_policy.log_probs(batch))
    assert not torch.equal(policy.log_probs(batch), base_policy.log_probs(batch))  # so its KL is > 0


def _adam_steps(checkpoint: Path, scratch: Path) -> set[float]:
    """The Adam step counts in a sharded checkpoint's optimizer state, read offline (no process group)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = scratch / f"{checkpoint.parent.name}_{checkpoint.name}.pt"
    dcp_to_torch_save(checkpoint / "dcp", whole)
    state = torch.load(whole, weights_only=False)["optim"]["state"]
    return {float(s["step"]) for s in state.values()}
