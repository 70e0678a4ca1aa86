"""Bad config values are refused when loaded: exit 2, the key named, nothing started (no Ray, no output)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arl_train.config import ConfigError, load_config
from arl_train.validation import check_machine

APP = Path(__file__).resolve().parents[1] / "__main__.py"

CASES = [
    ("rollout.n=0", "rollout.n"),
    ("async_training.staleness_threshold=-1", "async_training.staleness_threshold"),
    ("async_training.trigger_parameter_sync_step=0", "async_training.trigger_parameter_sync_step"),
    ("async_training.require_batches=0", "async_training.require_batches"),
    ("async_training.max_version_lag=-2", "async_training.max_version_lag"),
    ("actor.ppo_mini_batch_size=0", "actor.ppo_mini_batch_size"),
    ("actor.optim.lr=0", "actor.optim.lr"),
    ("actor.max_tokens_per_microbatch=0", "actor.max_tokens_per_microbatch"),
    ("actor.logprob_chunk_elements=0", "actor.logprob_chunk_elements"),
    ("actor.loss_agg_norm_len=0", "actor.loss_agg_norm_len"),
    ("actor.loss_agg_mode=token-sum", "actor.loss_agg_mode"),
    ("actor.optimizer_prefetch_inflight_mb=-1", "actor.optimizer_prefetch_inflight_mb"),
    ("actor.algorithm.clip_ratio_low=1.5", "actor.algorithm.clip_ratio_low"),
    ("actor.device=tpu", "actor.device"),
    ("rollout.replicas=0", "rollout.replicas"),
    ("rollout.max_tokens=600", "rollout.max_tokens"),
    ("rollout.temperature=0", "rollout.temperature"),
    ("rollout.top_p=1.5", "rollout.top_p"),
    ("rollout.dtype=int8", "rollout.dtype"),
    ("rollout.generate_timeout_s=0", "rollout.generate_timeout_s"),
    ("model.dtype=float8", "model.dtype"),
    ("model.path=/nonexistent/model", "model.path"),
    ("model.path=builtin:qwen9-random", "model.path"),
    ("data.source=/nonexistent/tasks.jsonl", "data.source"),
    ("data.size=0", "data.size"),
    ("trainer.total_steps=0", "trainer.total_steps"),
    ("trainer.save_every=-1", "trainer.save_every"),
    ("trainer.resume_from=/nonexistent/ckpt", "trainer.resume_from"),
    ("sync.transport=nccl", "sync.transport"),
    ("sync.bucket_mb=-1", "sync.bucket_mb"),
    ("ray.num_cpus=0", "ray.num_cpus"),
    ("seed=-1", "seed"),
    # Fields the packages declare and check themselves (their __post_init__), named by the app's key.
    ("actor.optim.grad_clip=0", "actor.optim.grad_clip"),
    ("trainer.batch_timeout_s=0", "trainer.batch_timeout_s"),
    ("sync.timeout_s=0", "sync.timeout_s"),
    ("rollout.max_model_len=0", "rollout.max_model_len"),
    ("rollout.gpu_memory_utilization=1.5", "rollout.gpu_memory_utilization"),
    ("rollout.max_num_seqs=0", "rollout.max_num_seqs"),
    ("rollout.dtype=auto", "rollout.dtype"),
]


@pytest.mark.parametrize(("override", "key"), CASES, ids=[c[0] for c in CASES])
def test_each_bad_value_is_refused_by_name(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides=[override])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "actor.ppo_mini_batch_size=0",
            "invalid config: actor.ppo_mini_batch_size = 0: ppo_mini_batch_size must be >= 1",
        ),
        ("actor.optim.lr=0", "invalid config: actor.optim.lr = 0: lr must be > 0"),
        (
            "async_training.require_batches=0",
            "invalid config: async_training.require_batches = 0: require_batches must",
        ),
        (
            "async_training.max_version_lag=-2",
            "invalid config: async_training.max_version_lag = -2: max_version_lag must",
        ),
        ("sync.timeout_s=-1.0", "invalid config: sync.timeout_s = -1.0: timeout_s must be > 0"),
        # The torch engine does not read it, but the field is vLLM's: its check applies whichever engine runs.
        (
            "rollout.gpu_memory_utilization=0.0",
            "invalid config: rollout.gpu_memory_utilization = 0.0: gpu_memory_utilization",
        ),
    ],
)
def test_a_package_refuses_its_own_field_and_the_app_names_the_key(override, message):
    overrides = [override, "rollout.engine=torch"] if "gpu_memory" in override else [override]
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")) as err:
        load_config(overrides=overrides)
    assert err.value.key == override.partition("=")[0]


def test_no_bound_is_minus_one_in_toml():
    assert load_config(overrides=["async_training.max_version_lag=-1"]).async_training.max_version_lag == -1


@pytest.mark.parametrize(
    "shape", ["tiny", "qwen3-0.6b-random", "qwen3-1.7b-random", "qwen3-4b-random", "qwen3-8b-random"]
)
def test_every_builtin_model_shape_is_accepted(shape):
    # The bench's GPU presets name these shapes; a check that knew only builtin:tiny stopped them at load.
    assert load_config(overrides=[f"model.path=builtin:{shape}"]).model.path == f"builtin:{shape}"


def test_resume_needs_steps_beyond_the_checkpoint(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"step": 40, "version": 40, "samples_seen": 320}))
    with pytest.raises(ConfigError, match=r"trainer\.resume_from.*incomplete: no queue\.snapshot"):
        load_config(overrides=[f"trainer.resume_from={tmp_path}", "trainer.total_steps=41"])
    from arl.queue.persistence import write_snapshot

    write_snapshot(tmp_path, [])
    with pytest.raises(ConfigError, match=r"trainer\.total_steps.*step \(40\)"):
        load_config(overrides=[f"trainer.resume_from={tmp_path}", "trainer.total_steps=40"])
    assert (
        load_config(
            overrides=[f"trainer.resume_from={tmp_path}", "trainer.total_steps=41"]
        ).trainer.total_steps
        == 41
    )


def test_gpu_requests_are_checked_against_this_machine():
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ConfigError, match=r"actor\.device"):
        load_config(overrides=[f"actor.device=cuda:{count}"])  # the trainer's GPUs come from resources
    with pytest.raises(ConfigError, match=r"resources.*more GPUs than this machine has"):
        check_machine(load_config(overrides=[f"resources.trainer_gpus={count + 1}"]))


def test_defaults_and_modes_pass():
    for mode in (None, "a", "b", "c", "d"):
        load_config(mode=mode)


@pytest.mark.parametrize(
    "override", ["rollout.n=0", "async_training.staleness_threshold=-1", "sync.transport=cuda_ipc"]
)
def test_cli_exits_2_naming_the_key_before_anything_starts(tmp_path, override):
    ray_tmp, out = tmp_path / "ray", tmp_path / "out"
    env = os.environ | {"ARL_RAY_TMP": str(ray_tmp)}
    proc = subprocess.run(
        [sys.executable, str(APP), override, f"output.dir={out}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert override.partition("=")[0] in proc.stderr
    # Nothing was started: no Ray session folder, no run folder, no actor.
    assert not ray_tmp.exists() and not out.exists()
    assert "Started a local Ray instance" not in proc.stderr


def test_a_corrupt_queue_snapshot_in_the_checkpoint_is_refused_by_name(tmp_path):
    from arl.queue.persistence import SNAPSHOT_FILENAME, write_snapshot
    from arl.queue.types import Response, Sample

    (tmp_path / "trainer_state.json").write_text(json.dumps({"step": 2, "version": 2, "samples_seen": 4}))
    response = Response(
        response_ids=[1, 2],
        response_mask=[1, 1],
        response_logprobs=[-0.1, -0.2],
        weight_versions=[1, 1],
        reward=1.0,
    )
    write_snapshot(
        tmp_path,
        [
            Sample(uid=f"u{i}", prompt_ids=[5], responses=[response], start_version=1, end_version=1)
            for i in range(3)
        ],
    )
    overrides = [f"trainer.resume_from={tmp_path}", "trainer.total_steps=5"]
    assert load_config(overrides=overrides).trainer.resume_from == str(tmp_path)
    snapshot = tmp_path / SNAPSHOT_FILENAME
    data = bytearray(snapshot.read_bytes())
    data[-5] ^= 0xFF  # one flipped byte in the last sample
    snapshot.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=rf"trainer\.resume_from.*{SNAPSHOT_FILENAME}.*checksum"):
        load_config(overrides=overrides)
    snapshot.write_bytes(bytes(data[: len(data) // 2]))  # truncated
    with pytest.raises(ConfigError, match=rf"trainer\.resume_from.*{SNAPSHOT_FILENAME}"):
        load_config(overrides=overrides)


def test_kl_reference_keys_are_checked_by_name(tmp_path):
    model = tmp_path / "base"
    model.mkdir()
    (model / "config.json").write_text("{}")
    kl = "actor.algorithm.kl_coef=0.01"
    assert load_config(overrides=[kl, "actor.activation_offload=true"]).actor.activation_offload
    assert load_config(overrides=[kl, f"actor.reference_path={model}"]).actor.reference_path == str(model)
    with pytest.raises(ConfigError, match=r"actor\.reference_path.*needs actor\.algorithm\.kl_coef > 0"):
        load_config(overrides=[f"actor.reference_path={model}"])
    with pytest.raises(ConfigError, match=r"actor\.reference_path.*no config\.json"):
        load_config(overrides=[kl, f"actor.reference_path={tmp_path / 'nothing'}"])
    with pytest.raises(ConfigError, match=r"kl_coef"):
        load_config(overrides=["actor.algorithm.kl_coef=-0.1"])
    with pytest.raises(ConfigError, match=r"kl_in"):
        load_config(overrides=[kl, 'actor.algorithm.kl_in="advantage"'])


def test_a_kl_resume_needs_the_reference_its_checkpoint_recorded(tmp_path):
    from arl.queue.persistence import write_snapshot

    base, ckpt = tmp_path / "base", tmp_path / "ckpt"
    base.mkdir()
    (base / "config.json").write_text("{}")
    ckpt.mkdir()
    write_snapshot(ckpt, [])
    state = {"step": 2, "version": 2, "samples_seen": 4}
    overrides = [f"trainer.resume_from={ckpt}", "trainer.total_steps=5", "actor.algorithm.kl_coef=0.01"]
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(
        ConfigError, match=r"trainer\.resume_from.*records no reference_path.*actor\.reference_path"
    ):
        load_config(overrides=overrides)
    assert load_config(overrides=[*overrides, f"actor.reference_path={base}"]).actor.reference_path == str(
        base
    )
    assert load_config(overrides=overrides[:2]).trainer.resume_from == str(ckpt)  # no KL: no reference needed
    (ckpt / "trainer_state.json").write_text(json.dumps(state | {"reference_path": str(tmp_path / "gone")}))
    with pytest.raises(ConfigError, match=r"trainer\.resume_from.*is not a model folder any more"):
        load_config(overrides=overrides)
    (ckpt / "trainer_state.json").write_text(json.dumps(state | {"reference_path": str(base)}))
    assert load_config(overrides=overrides).actor.algorithm.kl_coef == 0.01


def test_compiled_layers_are_taken_by_both_backends():
    assert load_config(overrides=["actor.compile_layers=true"]).actor.compile_layers
    assert load_config(
        overrides=["actor.compile_layers=true", "resources.trainer_cpu_ranks=2"]
    ).actor.compile_layers
