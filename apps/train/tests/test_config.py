import pytest

from arl_train.cli import main
from arl_train.config import ConfigError, load_config


def test_defaults_are_mode_d():
    cfg = load_config()
    assert cfg.async_training.partial_rollout is True
    assert cfg.async_training.staleness_threshold > 0
    assert cfg.rollout.engine == "vllm"


def test_overrides_and_modes():
    cfg = load_config(overrides=["rollout.n=4", "actor.lr=1e-4", "output.dir=/tmp/x", "ray.address=auto"])
    assert cfg.rollout.n == 4 and cfg.actor.lr == 1e-4 and cfg.output.dir == "/tmp/x" and cfg.ray.address == "auto"
    a = load_config(mode="a")
    assert (a.async_training.trigger_parameter_sync_step, a.async_training.staleness_threshold) == (1, 0.0)
    b = load_config(mode="b")
    assert b.async_training.trigger_parameter_sync_step > 1 and b.async_training.staleness_threshold == 0
    c = load_config(mode="c")
    assert c.async_training.staleness_threshold > 0 and c.async_training.partial_rollout is False
    # an explicit override wins over the mode preset
    assert load_config(mode="a", overrides=["async_training.trigger_parameter_sync_step=3"]).async_training.trigger_parameter_sync_step == 3


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
    with pytest.raises(ConfigError, match="learning_rate"):
        load_config(path)
