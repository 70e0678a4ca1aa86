"""The agent preset's warm start: random task instances, demonstrations masked to the assistant's
tokens, and a supervised pass whose loss goes down."""

from __future__ import annotations

import pytest
import torch
from arl.harbor.builtin_tasks import FAMILIES, random_task, random_tasks
from arl_train.warm_start import encode_demonstration, supervised_pass, warm_start_config


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from arl_train.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def tokenizer(tiny):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny))


def test_random_tasks_vary_and_cover_every_family():
    tasks = random_tasks(40, seed=1)
    assert {t.name.rsplit("-", 1)[0] for t in tasks} == set(FAMILIES)
    assert len({t.instruction for t in tasks}) >= 20  # names and numbers drawn at random
    assert random_tasks(40, seed=1) == tasks and random_tasks(40, seed=2) != tasks
    for t in tasks:  # what the oracle runs is named in the instruction
        assert all(word in t.instruction for word in t.solution.split() if word.startswith("/app/"))
    with pytest.raises(ValueError, match="unknown task family"):
        import random

        random_task(random.Random(0), "no-such-family")


def test_demonstration_masks_exactly_the_assistant_turns(tokenizer):
    task = random_tasks(1, seed=3, families=("write-number",))[0]
    ids, mask = encode_demonstration(tokenizer, task)
    assert len(ids) == len(mask)
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert trained == (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "' + task.solution + '"}}\n</tool_call><|im_end|>'
        "Done.<|im_end|>"
    )
    # The instruction and the tool output are context (mask 0); the prompt ends with the generation prompt.
    start = mask.index(1)
    prompt = tokenizer.decode(ids[:start])
    assert task.instruction in prompt and prompt.endswith("<|im_start|>assistant\n")


def test_supervised_pass_lowers_the_loss_and_saves_a_model(tiny, tokenizer, tmp_path):
    torch.set_num_threads(1)
    examples = [encode_demonstration(tokenizer, t) for t in random_tasks(32, seed=4)]
    losses = supervised_pass(tiny, tmp_path / "sft", examples, steps=12, batch_size=8, lr=3e-3, log=lambda _: None)
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3, losses
    assert (tmp_path / "sft" / "config.json").is_file() and (tmp_path / "sft" / "tokenizer.json").is_file()


def test_warm_start_overrides():
    cfg = warm_start_config(["warm_start.steps=5", "rollout.n=2", "warm_start.lr=0.01"])
    assert cfg.steps == 5 and cfg.lr == 0.01
    from arl_train.config import ConfigError

    with pytest.raises(ConfigError, match="warm_start"):
        warm_start_config(["warm_start.nope=1"])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_slipped_demonstration_fails_the_tasks_own_check(family, tmp_path):
    import subprocess

    from arl_train.warm_start import slipped

    task = random_tasks(1, seed=5, families=(family,))[0]

    def solved(command: str, where) -> bool:  # the task's setup, a command and its check, under `where`
        here = lambda text: text.replace("/app", str(where))  # noqa: E731
        script = f"set -e\n{here(task.setup)}\n{here(command)}\nset +e\n{here(task.check)}\n"
        return subprocess.run(["bash", "-c", script], capture_output=True).returncode == 0

    assert solved(task.solution, tmp_path / "oracle")
    wrong = slipped(task)
    assert wrong.solution != task.solution and wrong.instruction == task.instruction
    assert not solved(wrong.solution, tmp_path / "slip")


def test_slip_rate_is_checked():
    from arl_train.config import ConfigError

    assert warm_start_config(["warm_start.slip_rate=0.25"]).slip_rate == 0.25
    with pytest.raises(ConfigError, match="slip_rate"):
        warm_start_config(["warm_start.slip_rate=1.5"])


def test_supervised_pass_is_deterministic_by_seed(tiny, tokenizer, tmp_path):
    """The same seed gives the same losses and byte-identical weights (what pins the preset's starting
    reward); another seed other batches. Threads differ from the pass's own on purpose: it pins them."""
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    examples = [encode_demonstration(tokenizer, t) for t in random_tasks(16, seed=6)]

    def sft(name: str, seed: int) -> tuple[list[float], dict]:
        losses = supervised_pass(tiny, tmp_path / name, examples, steps=4, batch_size=4, lr=3e-3, seed=seed,
                                 threads=2, log=lambda _: None)
        return losses, load_file(str(tmp_path / name / "model.safetensors"))

    (la, wa), (lb, wb), (lc, _) = sft("a", 3), sft("b", 3), sft("c", 4)
    assert la == lb and lc != la
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert torch.get_num_threads() == 1 and not torch.are_deterministic_algorithms_enabled()


def test_the_run_seed_reaches_the_warm_start(tmp_path):
    """`seed=N` alone reseeds the warm start (tasks, demonstrations, base model); warm_start.seed wins."""
    import json

    from arl_train.warm_start import WarmStartConfig, prepare_agent_run

    cfg = WarmStartConfig(tasks=4, examples=4, steps=1, batch_size=2)
    assert warm_start_config([]).seed is None
    tasks_dir, _ = prepare_agent_run(tmp_path / "s7", cfg, run_seed=7, log=lambda _: None)
    assert json.loads((tmp_path / "s7" / "warm_start.json").read_text())["key"]["config"]["seed"] == 7
    written = sorted((p / "instruction.md").read_text().strip() for p in tasks_dir.iterdir())
    assert written == sorted(t.instruction for t in random_tasks(4, seed=7))
    prepare_agent_run(tmp_path / "s8", msgspec_replace(cfg, seed=8), run_seed=7, log=lambda _: None)
    assert json.loads((tmp_path / "s8" / "warm_start.json").read_text())["key"]["config"]["seed"] == 8


def msgspec_replace(cfg, **changes):
    import msgspec

    return msgspec.structs.replace(cfg, **changes)
