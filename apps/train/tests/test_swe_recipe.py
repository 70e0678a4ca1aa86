"""The SWE recipe (apps/train/configs/swe.toml, swe_8gpu.toml; docs/guide/swe.md) loads and resolves its
placement, its timeouts derive from the task set, and `--preset swe` builds its config (no Ray here)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from arl.harbor.docker_environment import DOCKER_IMPORT_PATH
from arl.harbor.testing import write_swe_task
from arl_train.config import ConfigError, load_config
from arl_train.harbor_section import harbor_config
from arl_train.timeouts import run_timeouts

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    """A stand-in for the recipe's Hugging Face folder (the loader checks only that config.json exists)."""
    path = tmp_path / "Qwen3"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


def test_one_gpu_recipe_resolves_to_a_shared_gpu(model_dir: Path) -> None:
    config = load_config(CONFIGS / "swe.toml", [f"model.path={model_dir}"])
    assert config.resources.trainer_gpus == 1 and config.rollout.replicas == 1
    assert config.rollout.device == "cuda"
    assert config.resources.shared_gpu == "time_sliced"
    assert config.resources.colocate  # the shared schedules use the colocated placement
    assert config.sync.transport == "cuda_ipc"  # the rank sends weights to the replica beside it
    assert config.async_training.partial_rollout  # yielding the GPU aborts and later resumes generations
    assert config.async_training.staleness_threshold > 0  # asynchronous (mode d)
    h = harbor_config(config)
    assert h.environment_import_path == DOCKER_IMPORT_PATH
    assert h.agent_import_path == "arl.harbor.shell_agent:ShellAgent" and h.tool_parser == "hermes"
    assert not h.keep_trial_dirs
    assert h.policy.verifier_harness == "drop"


def test_eight_gpu_recipe_resolves_to_a_split_placement(model_dir: Path) -> None:
    config = load_config(CONFIGS / "swe_8gpu.toml", [f"model.path={model_dir}"])
    assert config.resources.trainer_gpus == 4 and config.rollout.replicas == 4
    assert not config.resources.colocate and config.resources.shared_gpu == "off"
    assert config.sync.transport == "nccl"
    # The documented alternative: shared on all 8 GPUs.
    shared = load_config(
        CONFIGS / "swe_8gpu.toml",
        [
            f"model.path={model_dir}",
            "resources.trainer_gpus=8",
            "rollout.replicas=8",
            "resources.shared_gpu=time_sliced",
        ],
    )
    assert shared.resources.colocate and shared.sync.transport == "cuda_ipc"
    # A layout that cannot be packed is refused by name.
    with pytest.raises(ConfigError, match="trainer_gpus"):
        load_config(CONFIGS / "swe_8gpu.toml", [f"model.path={model_dir}", "resources.trainer_gpus=9"])


def test_eight_gpu_recipe_differs_only_in_placement_and_scale() -> None:
    one = tomllib.loads((CONFIGS / "swe.toml").read_text())
    eight = tomllib.loads((CONFIGS / "swe_8gpu.toml").read_text())
    assert one.keys() == eight.keys()
    for section in ("seed", "data", "async_training", "trainer", "sync"):
        assert one.get(section) == eight.get(section), section
    assert one["model"]["path"] != eight["model"]["path"]
    same_harbor = {k: v for k, v in one["harbor"].items() if k != "model_name"}
    assert same_harbor == {k: v for k, v in eight["harbor"].items() if k != "model_name"}
    assert one["run"].keys() == eight["run"].keys() == {"agent_workers"}


def test_timeouts_derive_from_the_task_set(model_dir: Path, tmp_path: Path) -> None:
    task = write_swe_task(tmp_path / "tasks")
    source = f"harbor:{task.parent}"
    config = load_config(CONFIGS / "swe.toml", [f"model.path={model_dir}", f"data.source={source}"])
    info = tomllib.loads((task / "task.toml").read_text())
    from arl.harbor.tasks import AGENT_SETUP_ALLOWANCE_SEC, TEARDOWN_ALLOWANCE_SEC

    phases = (
        info["environment"].get("build_timeout_sec", 600.0)
        + AGENT_SETUP_ALLOWANCE_SEC
        + info["agent"]["timeout_sec"]
        + info["verifier"]["timeout_sec"]
    )
    timeouts = run_timeouts(config)
    assert timeouts.attempt_s == pytest.approx(phases + TEARDOWN_ALLOWANCE_SEC)
    attempts, backoff = config.harbor.policy.max_attempts, config.harbor.policy.retry_backoff_sec
    assert timeouts.prompt_s == pytest.approx(
        attempts * timeouts.attempt_s + backoff * attempts * (attempts - 1) / 2
    )
    assert timeouts.step_s > timeouts.batch_s > timeouts.prompt_s


def test_swe_preset_config_on_this_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--preset swe`'s config: the CPU placement, the tiny model with a 4096-token context, the first
    N tasks of the set as a dataset file, the chosen environment (here the local sandbox)."""
    from arl_train import swe_preset, tiny_model

    built: list[dict] = []

    def build_tiny_model(out_dir: Path, **kwargs: object) -> Path:  # the builder has its own tests
        built.append(kwargs)
        Path(out_dir).mkdir(parents=True)
        (Path(out_dir) / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
        return Path(out_dir)

    monkeypatch.setattr(tiny_model, "build_tiny_model", build_tiny_model)
    task_set = tmp_path / "set"
    for name in ("a", "b", "c"):
        write_swe_task(task_set, name=name)
        (task_set / name / "environment" / "local_binds.json").write_text(
            json.dumps({"/arl/venv": "../../_venvs/x"})
        )
    (task_set / "manifest.jsonl").write_text(
        "".join(json.dumps({"id": n, "package": p}) + "\n" for n, p in (("a", "x"), ("b", "x"), ("c", "y")))
    )
    out = tmp_path / "run"
    config = swe_preset.load_swe_config(
        None,
        [f"swe.task_set={task_set}", "swe.tasks=2", "swe.env=local", f"output.dir={out}"],
        log=lambda _: None,
    )
    assert config.rollout.device == "cpu" and config.resources.trainer_gpus == 0
    assert config.resources.shared_gpu == "off" and config.sync.transport == "cpu"
    assert [b["max_position_embeddings"] for b in built] == [4096]  # a SWE issue does not fit 1024
    assert Path(config.model.path) == out / "model_tiny_4k"
    rows = [json.loads(line) for line in (out / "swe_tasks.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", "c"]  # one package after another
    assert all(
        Path(r["path"]).parent == out / "tasks" and Path(r["path"], "task.toml").is_file() for r in rows
    )
    binds = json.loads((out / "tasks" / "a" / "environment" / "local_binds.json").read_text())
    assert binds == {"/arl/venv": str((task_set / "_venvs" / "x").resolve())}  # still the set's venv
    h = harbor_config(config)
    assert h.environment_import_path == "arl.harbor.environment:LocalSandboxEnvironment"
    assert "system_dirs" not in h.environment_kwargs  # nothing of the set is visible in the sandbox
    assert h.agent_import_path == "arl.harbor.shell_agent:ShellAgent"  # swe.toml's agent, kept
    with pytest.raises(ConfigError, match="swe.env"):
        swe_preset.load_swe_config(None, ["swe.env=podman", f"output.dir={out}"], log=lambda _: None)


def _set_graded_by_an_older_grader(root: Path, mode: str = "separate") -> Path:
    """A one-task set as an earlier grader wrote it (its grading version older, its plugin files stale)."""
    write_swe_task(root, name="a")
    (root / "manifest.jsonl").write_text(json.dumps({"id": "a", "package": "x"}) + "\n")
    toml = root / "a" / "task.toml"
    text = toml.read_text().replace('environment_mode = "separate"', f'environment_mode = "{mode}"')
    toml.write_text(text.replace('arl_grading = "clean-environment-', 'arl_grading = "clean-environment-0'))
    (root / "a" / "tests" / "plugin" / "score.py").write_text("# the earlier grader's\n")
    return root


def test_the_swe_preset_gives_a_set_of_an_older_grader_the_current_one(tmp_path: Path) -> None:
    from arl.harbor.swe.writer import TASK_FILES, outdated_grading
    from arl_train import swe_preset

    task_set = _set_graded_by_an_older_grader(tmp_path / "set")
    assert outdated_grading(task_set) == ["a"]
    assert swe_preset.ensure_task_set(task_set, log=lambda _: None) == task_set
    assert outdated_grading(task_set) == []
    assert (task_set / "a/tests/plugin/score.py").read_bytes() == (TASK_FILES / "score.py").read_bytes()


def test_the_swe_preset_refuses_a_set_graded_in_the_agents_environment(tmp_path: Path) -> None:
    from arl_train import swe_preset

    task_set = _set_graded_by_an_older_grader(tmp_path / "set", mode="shared")
    with pytest.raises(ConfigError, match="a is graded in the agent's own environment.*rebuild it"):
        swe_preset.ensure_task_set(task_set, log=lambda _: None)
