import re
import tomllib

import pytest

from arl_train.cli import main
from arl_train.config import DEFAULT_CONFIG, ConfigError, load_config


def test_defaults_are_mode_d():
    cfg = load_config()
    assert cfg.async_training.partial_rollout is True
    assert cfg.async_training.staleness_threshold > 0
    assert cfg.rollout.engine == "vllm"


def test_overrides_and_modes():
    cfg = load_config(
        overrides=["rollout.n=4", "actor.optim.lr=1e-4", "output.dir=/tmp/x", "ray.address=auto"]
    )
    assert (
        cfg.rollout.n == 4
        and cfg.actor.optim.lr == 1e-4
        and cfg.output.dir == "/tmp/x"
        and cfg.ray.address == "auto"
    )
    a = load_config(mode="a")
    assert (a.async_training.trigger_parameter_sync_step, a.async_training.staleness_threshold) == (1, 0.0)
    b = load_config(mode="b")
    assert b.async_training.trigger_parameter_sync_step > 1 and b.async_training.staleness_threshold == 0
    c = load_config(mode="c")
    assert c.async_training.staleness_threshold > 0 and c.async_training.partial_rollout is False
    # an explicit override wins over the mode preset
    assert (
        load_config(
            mode="a", overrides=["async_training.trigger_parameter_sync_step=3"]
        ).async_training.trigger_parameter_sync_step
        == 3
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.nn=4", "'nn' is not a field of rollout"),
        ("rolout.n=4", "'rolout' is not a field of top level"),
        ("rollout.n=four", "rollout.n"),
        ("rollout.n.x=1", "rollout.n is not a section"),
        ("rollout.n", "section.key=value"),
        ("rollout.engine=sglang", "rollout.engine"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("'", ".")):
        load_config(overrides=[override])


def test_cli_rejects_bad_config_with_exit_2(capsys):
    assert main(["rollout.bogus=1"]) == 2
    assert "rollout.bogus" in capsys.readouterr().err


def test_unknown_key_in_toml_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[actor]\nlearning_rate = 1.0\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'actor\.learning_rate'") as err:
        load_config(path)
    assert err.value.key == "actor.learning_rate"


def test_wrong_types_in_a_toml_file_name_the_dotted_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[actor.optim]\nlr = "fast"\n')
    with pytest.raises(ConfigError, match=r"invalid config: actor\.optim\.lr: Expected `float`") as err:
        load_config(path)
    assert err.value.key == "actor.optim.lr"


@pytest.mark.parametrize(
    ("old", "new", "value"),
    [
        ("actor.lr", "actor.optim.lr", 1e-4),
        ("actor.grad_clip", "actor.optim.grad_clip", 0.5),
        ("actor.fused_optimizer", "actor.optim.fused", True),
        ("harbor.step_timeout_s", "run.step_timeout_s", 5.0),
        ("harbor.drain_timeout_s", "run.drain_timeout_s", 7.0),
        ("harbor.agent_workers", "run.agent_workers", 2),
    ],
)
def test_moved_keys_keep_working_with_a_warning_naming_both(tmp_path, old, new, value):
    def get(cfg, dotted):
        for part in dotted.split("."):
            cfg = getattr(cfg, part)
        return cfg

    literal = str(value).lower()
    with pytest.warns(
        FutureWarning, match=rf"'{re.escape(old)}' \(override\) is deprecated: it is now '{re.escape(new)}'"
    ):
        assert get(load_config(overrides=[f"{old}={literal}"]), new) == value
    section, _, leaf = old.rpartition(".")
    path = tmp_path / "old.toml"
    path.write_text(f"[{section}]\n{leaf} = {literal}\n")
    with pytest.warns(
        FutureWarning,
        match=rf"'{re.escape(old)}' \(config file .*old\.toml\) is deprecated: it is now '{re.escape(new)}'",
    ):
        assert get(load_config(path), new) == value
    # Both names in one file: ambiguous, refused naming both.
    new_section, _, new_leaf = new.rpartition(".")
    path.write_text(f"[{section}]\n{leaf} = {literal}\n[{new_section}]\n{new_leaf} = {literal}\n")
    with pytest.raises(ConfigError, match=rf"both {re.escape(old)} \(its old name\) and {re.escape(new)}"):
        load_config(path)


def test_the_shipped_configs_load_without_old_keys():
    import warnings

    for path in sorted(DEFAULT_CONFIG.parent.glob("*.toml")):
        # Remote Ray: model/task folders are not looked up; a config that starts its own MPS daemon
        # needs the run's own Ray (and its model is built in).
        starts_mps = tomllib.loads(path.read_text()).get("resources", {}).get("mps") == "start"
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)  # a shipped config uses the current keys
            tree_ok = load_config(path, [] if starts_mps else ["ray.address=auto"])
        assert tree_ok.actor.optim.lr > 0, path


def test_null_unsets_an_optional_key_and_stays_a_word_elsewhere():
    assert load_config(overrides=["ray.address=auto", "ray.address=null"]).ray.address is None
    assert load_config(overrides=["actor.loss_agg_norm_len=null"]).actor.loss_agg_norm_len is None
    assert load_config(overrides=["output.dir=null"]).output.dir == "null"  # a plain string field
    assert load_config(overrides=["rollout.engine_args.x=null"]).rollout.engine_args == {"x": "null"}
    with pytest.raises(ConfigError, match=r"rollout\.n"):
        load_config(overrides=["rollout.n=null"])


def test_the_preset_sections_are_sections_of_the_one_config():
    cfg = load_config(overrides=["swe.tasks=2", "swe.env=local", "warm_start.seed=3"])
    assert (cfg.swe.tasks, cfg.swe.env, cfg.warm_start.seed) == (2, "local", 3)
    with pytest.raises(ConfigError, match=r"swe\.env") as err:
        load_config(overrides=["swe.env=podman"])
    assert err.value.key == "swe.env"
