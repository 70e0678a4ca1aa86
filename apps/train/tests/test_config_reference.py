"""docs/reference/config.md is generated from the config structs and must match them."""

import msgspec

from arl_train.config_reference import REFERENCE, render
from arl_train.sections import AppConfig


def test_the_committed_reference_is_current():
    assert REFERENCE.is_file(), "run `uv run python -m arl_train.config_reference`"
    assert REFERENCE.read_text() == render(), (
        f"{REFERENCE} is stale: run `uv run python -m arl_train.config_reference` and commit it"
    )


def test_every_section_and_key_is_documented():
    text = render()
    for section in msgspec.structs.fields(AppConfig):
        if isinstance(section.type, type) and issubclass(section.type, msgspec.Struct):
            assert f"## [{section.name}]" in text
            for f in msgspec.structs.fields(section.type):
                assert f"| `{f.name}` |" in text, f"{section.name}.{f.name}"
    # a key the app takes from a package carries the package's comment, its origin and the app's default
    row = next(line for line in text.splitlines() if line.startswith("| `optimizer_offload_overlap` |"))
    assert "TrainerConfig.optimizer_offload_overlap" in row and "*App default* true" in row
    assert "settle_optimizer_offload" in row  # the trainer's own comment
    assert "| `actor.lr` | `actor.optim.lr` |" in text  # the moved keys
