"""The run's plan: what a run will start, decided from the config without starting Ray."""

import json

import msgspec
import pytest

from arl.queue.persistence import SNAPSHOT_FILENAME, write_snapshot
from arl_train.checkpointing import resume_state
from arl_train.config import load_config
from arl_train.plan import plan, prepare, prepare_model, run_environment


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    return prepare_model(load_config(overrides=[f"output.dir={out}"]), out)


def test_prepare_writes_the_config_builds_the_model_and_plans_the_default_run(tmp_path):
    cfg = load_config(overrides=[f"output.dir={tmp_path}"])
    p = prepare(cfg)
    assert json.loads((tmp_path / "config.json").read_text())["output"]["dir"] == str(tmp_path)
    assert (p.model_path / "config.json").is_file() and p.model_path.parent == tmp_path
    assert p.resume == {} and p.first_step == 0 and p.initial_version == 0
    assert [(s.index, s.kind) for s in p.replicas] == [(0, cfg.rollout.engine)]
    assert p.env == run_environment(tmp_path) and p.env["ARL_LEDGER_DIR"] == str(tmp_path / "ledger")
    assert p.trainer_env == {}  # a CPU trainer: no CUDA allocator setting
    assert p.budget.max_queue > 0 and p.timeouts.step_s > p.timeouts.batch_s


def test_a_colocated_gpu_plan_has_a_sleeping_replica_per_gpu_seeded_apart(tiny_model, tmp_path):
    cfg = load_config(
        overrides=[
            "resources.trainer_gpus=2",
            "rollout.replicas=2",
            "rollout.device=cuda",
            "rollout.engine=vllm",
            "resources.colocate=true",
            "actor.expandable_segments=true",
            "seed=7",
        ]
    )
    p = plan(cfg, tmp_path, tiny_model, {"step": 3, "version": 5})
    assert p.layout.colocate and p.layout.replicas == 2 and p.layout.trainer_gpus == 2
    assert [s.kind for s in p.replicas] == ["vllm", "vllm"]
    assert [s.config.seed for s in p.replicas] == [7, 8]
    assert all(s.config.initial_version == 5 and s.config.enable_sleep_mode for s in p.replicas)
    assert (p.first_step, p.initial_version) == (3, 5)
    assert "expandable_segments:True" in next(iter(p.trainer_env.values()))


@pytest.mark.parametrize("cap", [0, 60])
def test_under_the_runs_mps_daemon_the_trainer_starts_with_its_sm_cap(tiny_model, tmp_path, cap):
    cfg = load_config(
        overrides=[
            "resources.trainer_gpus=1",
            "rollout.device=cuda",
            "rollout.engine=vllm",
            "resources.shared_gpu=concurrent",
            "rollout.gpu_memory_utilization=0.3",
            "resources.mps=start",
            f"resources.mps_trainer_sm_percent={cap}",
            "actor.expandable_segments=false",
        ]
    )
    expected = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "60"} if cap else {}
    assert plan(cfg, tmp_path, tiny_model, {}).trainer_env == expected


def _checkpoint(tmp_path, step):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": step, "version": step, "tasks_started": 40}))
    write_snapshot(ckpt, [])
    return ckpt


def test_resume_restores_the_checkpoint_s_queue_and_position(tmp_path):
    out = tmp_path / "out"
    cfg = load_config(
        overrides=[
            f"output.dir={out}",
            f"trainer.resume_from={_checkpoint(tmp_path, 2)}",
            "trainer.total_steps=4",
        ]
    )
    p = prepare(cfg)
    assert (p.first_step, p.initial_version, p.resume["tasks_started"]) == (2, 2, 40)
    assert p.model_path == tmp_path / "ckpt"  # the checkpoint's weights, not a fresh model
    assert (out / "queue" / SNAPSHOT_FILENAME).read_bytes() == (p.model_path / SNAPSHOT_FILENAME).read_bytes()


def test_a_fresh_run_never_restores_an_earlier_run_s_queue(tmp_path):
    (tmp_path / "queue").mkdir()
    (tmp_path / "queue" / SNAPSHOT_FILENAME).write_bytes(b"old")
    prepare(load_config(overrides=[f"output.dir={tmp_path}"]))
    assert not (tmp_path / "queue" / SNAPSHOT_FILENAME).exists()


def test_bad_resume_points_fail_by_name(tmp_path):
    """`resume_state` refuses them itself, for callers that skip the config's load-time checks."""
    cfg = load_config(overrides=[f"output.dir={tmp_path / 'a'}", "trainer.total_steps=4"])
    at_end = msgspec.structs.replace(cfg.trainer, resume_from=str(_checkpoint(tmp_path, 4)))
    with pytest.raises(ValueError, match="raise trainer.total_steps"):
        resume_state(msgspec.structs.replace(cfg, trainer=at_end), tmp_path / "a")
    not_one = msgspec.structs.replace(cfg.trainer, resume_from=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="not an arl checkpoint"):
        resume_state(msgspec.structs.replace(cfg, trainer=not_one), tmp_path / "a")


LAYOUT_TABLE = [
    ([], ("single", "rank0", "split")),
    (["resources.trainer_cpu_ranks=2"], ("fsdp", "rank0", "split")),
    (
        ["resources.trainer_gpus=1", "rollout.device=cuda", "resources.colocate=true"],
        ("single", "rank0", "colocated"),
    ),
    (
        ["resources.trainer_gpus=2", "rollout.replicas=2", "rollout.device=cuda", "resources.colocate=true"],
        ("fsdp", "per_rank", "colocated"),
    ),
    (
        [
            "resources.trainer_gpus=2",
            "rollout.replicas=2",
            "rollout.device=cuda",
            "resources.shared_gpu=time_sliced",
        ],
        ("fsdp", "per_rank", "time_sliced"),
    ),
    (
        [
            "resources.trainer_gpus=1",
            "rollout.device=cuda",
            "resources.shared_gpu=concurrent",
            "rollout.gpu_memory_utilization=0.3",
        ],
        ("single", "rank0", "concurrent"),
    ),
    (["resources.trainer_gpus=2", "rollout.replicas=1", "rollout.device=cuda"], ("fsdp", "rank0", "split")),
]


@pytest.mark.parametrize(
    ("overrides", "row"), LAYOUT_TABLE, ids=[" ".join(o) or "default" for o, _ in LAYOUT_TABLE]
)
def test_each_layout_names_its_trainer_row(tiny_model, tmp_path, overrides, row):
    spec = plan(load_config(overrides=["rollout.engine=vllm", *overrides]), tmp_path, tiny_model, {}).trainer
    assert (spec.shape.policy, spec.shape.sender, spec.shape.schedule) == row


def test_the_actors_specs_carry_what_the_plan_derived_once(tiny_model, tmp_path):
    cfg = load_config(
        overrides=[
            "actor.optim.lr=2e-4",
            "rollout.temperature=0.7",
            "sync.timeout_s=9",
            "seed=3",
            "run.drain_timeout_s=42",
            "run.agent_workers=2",
            "trainer.profile_step=2",
            f"output.dir={tmp_path}",
        ]
    )
    p = plan(cfg, tmp_path, tiny_model, {})
    t, r = p.trainer, p.rollout
    # log probs at the sampling temperature
    assert t.trainer.optim.lr == 2e-4 and t.trainer.temperature == 0.7
    assert t.trainer.batch_timeout_s == p.timeouts.batch_s  # the run's derived batch wait, not the key's
    assert (t.sync.timeout_s, t.sync.transport, t.layout) == (9, "cpu", p.layout)
    assert (t.step_timeout_s, t.pause_rpc_s) == (p.timeouts.step_s, p.timeouts.pause_rpc_s)
    assert t.reference_path == str(tiny_model.resolve()) and t.resume is None and t.seed == 3
    assert (t.profile_step, t.profile_dir) == (2, str(tmp_path / "profile"))
    assert r.drain_timeout_s == p.timeouts.drain_s == 42 and r.budget == p.budget and r.agent_workers == 2
    assert (r.sampling.temperature, r.n, r.seed, r.model_path) == (0.7, cfg.rollout.n, 3, str(tiny_model))
    assert r.tasks.source == cfg.data.source and r.receivers_per_replica == 1
    # The actors are pickled to Ray: specs are plain msgspec structs that round-trip.
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(t), type=type(t)) == t


def test_a_resumed_plan_hands_the_checkpoint_state_and_its_reference_to_every_rank(tiny_model, tmp_path):
    state = {"step": 3, "version": 3, "reference_path": "/base"}
    spec = plan(load_config(overrides=["actor.algorithm.kl_coef=0.1"]), tmp_path, tiny_model, state).trainer
    assert spec.resume == state and spec.reference_path == "/base"


def test_settling_the_transport_reaches_the_trainer_spec(tiny_model, tmp_path):
    from arl_train.plan import settle_transport

    p = plan(load_config(), tmp_path, tiny_model, {})
    placed = settle_transport(p, "tcp")
    assert (placed.config.sync.transport, placed.layout.transport) == ("tcp", "tcp")
    assert (placed.trainer.sync.transport, placed.trainer.layout.transport) == ("tcp", "tcp")
    assert settle_transport(p, "cpu") is p
