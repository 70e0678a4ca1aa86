"""The [harbor] section: overrides, Harbor task sets as data.source, derived timeouts, fail-fast checks."""

from __future__ import annotations

import json

import pytest

from arl.harbor import HarborConfigError
from arl.harbor.testing import write_hello_task
from arl_train.cli import main
from arl_train.config import ConfigError, load_config
from arl_train.harbor_section import check_harbor, harbor_config, load_app_tasks
from arl_train.timeouts import run_timeouts


def test_section_overrides_reach_the_package_config(tmp_path):
    cfg = load_config(
        overrides=[
            "harbor.agent=oracle",
            "harbor.policy.sandbox=drop",
            "harbor.policy.max_attempts=2",
            "harbor.tool_parser=hermes",
            "harbor.proxy_host=0.0.0.0",
            f"output.dir={tmp_path}",
            "harbor.environment_kwargs={memory_mb = 256}",
        ]
    )
    h = harbor_config(cfg)
    assert (h.agent, h.policy.sandbox, h.policy.max_attempts) == ("oracle", "drop", 2)
    assert h.proxy_settings()["tool_parser"] == "hermes" and h.proxy_settings()["host"] == "0.0.0.0"
    assert h.environment_kwargs == {"memory_mb": 256}
    assert h.trials_dir == str(tmp_path / "harbor_trials")
    with pytest.raises(ConfigError, match="harbor.policy.sandbox"):
        load_config(overrides=["harbor.policy.sandbox=explode"])
    with pytest.raises(ConfigError, match="'nope' is not a field of harbor"):
        load_config(overrides=["harbor.nope=1"])


def test_task_folder_and_task_set_file_become_harbor_tasks(tmp_path):
    write_hello_task(tmp_path / "set", "a")
    write_hello_task(
        tmp_path / "set", "b", agent_timeout_sec=100.0, verifier_timeout_sec=20.0, build_timeout_sec=30.0
    )
    (tmp_path / "set" / "notes").mkdir()  # not a task dir: ignored by the folder form
    cfg = load_config(overrides=[f"data.source=harbor:{tmp_path / 'set'}"])
    tasks = load_app_tasks(cfg)
    assert [t.id for t in tasks] == ["a", "b"] and {t.agent for t in tasks} == {"harbor"}
    assert tasks[1].metadata["harbor_task_path"] == str((tmp_path / "set" / "b").resolve())
    assert "Hello, world!" in tasks[0].messages[0]["content"]
    rows = tmp_path / "set.jsonl"
    rows.write_text(json.dumps({"path": "set/b", "id": "bee", "metadata": {"split": "x"}}) + "\n")
    tasks = load_app_tasks(load_config(overrides=[f"data.source=harbor:{rows}"]))
    assert [(t.id, t.metadata["split"]) for t in tasks] == [("bee", "x")]
    # A name/ref reference that is not in the local cache is an error naming it (nothing is downloaded).
    rows.write_text(json.dumps({"name": "org/absent", "ref": "sha256:" + "0" * 64}) + "\n")
    with pytest.raises(HarborConfigError, match="not in the local cache"):
        load_app_tasks(
            load_config(overrides=[f"data.source=harbor:{rows}", f"harbor.task_cache_dir={tmp_path}"])
        )
    # An invalid task dir fails the load, by name.
    (tmp_path / "set" / "a" / "tests" / "test.sh").unlink()
    with pytest.raises(HarborConfigError, match="task a .* no tests/test.sh"):
        load_app_tasks(cfg)


def test_timeouts_derive_from_the_trial_timeouts(tmp_path):
    write_hello_task(
        tmp_path / "set", "a", agent_timeout_sec=1200.0, verifier_timeout_sec=300.0, build_timeout_sec=100.0
    )
    plain = run_timeouts(load_config())
    assert plain.drain_s > plain.prompt_s == load_config().rollout.generate_timeout_s
    assert plain.step_s > plain.batch_s + plain.drain_s
    cfg = load_config(
        overrides=[
            f"data.source=harbor:{tmp_path / 'set'}",
            "harbor.policy.max_attempts=2",
            "harbor.policy.retry_backoff_sec=0.0",
        ]
    )
    t = run_timeouts(cfg)
    attempt = 100 + 360 + 1200 + 300 + 60  # build + agent setup + agent + verifier, + teardown
    assert t.attempt_s == attempt and t.prompt_s == 2 * attempt
    assert t.drain_s > t.prompt_s and t.batch_s > t.prompt_s and t.step_s > t.batch_s + t.drain_s
    assert t.pause_rpc_s > t.drain_s
    doubled = run_timeouts(
        load_config(overrides=[f"data.source=harbor:{tmp_path / 'set'}", "harbor.timeout_multiplier=2"])
    )
    assert doubled.attempt_s == 2 * (attempt - 60) + 60
    fixed = run_timeouts(
        load_config(
            overrides=[
                f"data.source=harbor:{tmp_path / 'set'}",
                "run.step_timeout_s=5",
                "run.drain_timeout_s=7",
            ]
        )
    )
    assert (fixed.step_s, fixed.drain_s) == (5, 7)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("harbor.agent=terminus-9", "harbor.agent = 'terminus-9' is not a Harbor agent"),
        (
            "harbor.agent_import_path=nowhere.mod:Agent",
            "harbor.agent_import_path = 'nowhere.mod:Agent' does not import",
        ),
        ("harbor.environment_type=dockr", "harbor.environment_type = 'dockr' is not a Harbor environment"),
        ("harbor.environment_import_path=arl.harbor.types:HarborConfig", "is not a Harbor BaseEnvironment"),
    ],
)
def test_misconfigured_agent_or_environment_fails_at_start_by_name(tmp_path, override, message):
    write_hello_task(tmp_path / "set", "a")
    cfg = load_config(overrides=[f"data.source=harbor:{tmp_path / 'set'}", override])
    with pytest.raises(HarborConfigError, match=message.replace("(", r"\(")):
        check_harbor(cfg)


def test_harbor_tasks_command(tmp_path, capsys):
    write_hello_task(tmp_path / "set", "a")
    write_hello_task(tmp_path / "set", "b")
    assert main(["harbor-tasks", "list", f"harbor:{tmp_path / 'set'}"]) == 0
    out = capsys.readouterr().out
    assert out.count(" ok ") == 2 and "solution" in out
    (tmp_path / "set" / "b" / "instruction.md").unlink()
    assert main(["harbor-tasks", f"harbor:{tmp_path / 'set'}"]) == 1  # validate is the default
    captured = capsys.readouterr()
    assert "INVALID: no instruction.md" in captured.out and "1/2 tasks valid" in captured.err


def test_default_local_sandbox_config_passes_the_start_check(tmp_path):
    write_hello_task(tmp_path / "set", "a")
    cfg = check_harbor(load_config(overrides=[f"data.source=harbor:{tmp_path / 'set'}"]))
    assert cfg is not None and cfg.environment_import_path == "arl.harbor.environment:LocalSandboxEnvironment"
    bad = load_config(
        overrides=[f"data.source=harbor:{tmp_path / 'set'}", 'harbor.environment_kwargs={network = "wifi"}']
    )
    with pytest.raises(HarborConfigError, match="cannot run here: network must be 'none' or 'host'"):
        check_harbor(bad)
    assert check_harbor(load_config()) is None  # not a Harbor run


def test_builtin_small_task_set():
    tasks = load_app_tasks(load_config(overrides=["data.source=harbor:builtin:small"]))
    assert [t.id for t in tasks] == ["arl", "digits", "goodbye", "hello"]
    with pytest.raises(HarborConfigError, match="unknown built-in Harbor task set 'big'"):
        load_app_tasks(load_config(overrides=["data.source=harbor:builtin:big"]))
