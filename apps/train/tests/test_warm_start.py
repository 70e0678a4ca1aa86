"""The agent preset's warm start: random task instances, demonstrations masked to the assistant's
tokens, and a supervised pass whose loss goes down."""

from __future__ import annotations

import json

import pytest
import torch

from arl.harbor.builtin_tasks import FAMILIES, random_task, random_tasks
from arl_train.config import load_config
from arl_train.warm_start import encode_demonstration, supervised_pass


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
        '<tool_call>\n{"name": "bash", "arguments": {"command": "'
        + task.solution
        + '"}}\n</tool_call><|im_end|>'
        "Done.<|im_end|>"
    )
    # The instruction and the tool output are context (mask 0); the prompt ends with the generation prompt.
    start = mask.index(1)
    prompt = tokenizer.decode(ids[:start])
    assert task.instruction in prompt and prompt.endswith("<|im_start|>assistant\n")


def test_supervised_pass_lowers_the_loss_and_saves_a_model(tiny, tokenizer, tmp_path):
    torch.set_num_threads(1)
    examples = [encode_demonstration(tokenizer, t) for t in random_tasks(32, seed=4)]
    losses = supervised_pass(
        tiny, tmp_path / "sft", examples, steps=12, batch_size=8, lr=3e-3, log=lambda _: None
    )
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3, losses
    assert (tmp_path / "sft" / "config.json").is_file() and (tmp_path / "sft" / "tokenizer.json").is_file()


def warm_start_config(overrides):
    """The `[warm_start]` section as the one config parser reads it."""
    return load_config(overrides=overrides).warm_start


def test_warm_start_is_a_section_of_the_one_config(tmp_path):
    cfg = load_config(overrides=["warm_start.steps=5", "rollout.n=2", "warm_start.lr=0.01"])
    assert cfg.warm_start.steps == 5 and cfg.warm_start.lr == 0.01 and cfg.rollout.n == 2
    from arl_train.config import ConfigError

    with pytest.raises(ConfigError, match=r"unknown config key 'warm_start\.nope'"):
        warm_start_config(["warm_start.nope=1"])
    with pytest.raises(ConfigError, match=r"invalid config: warm_start\.steps: Expected `int` >= 1"):
        warm_start_config(["warm_start.steps=0"])
    path = tmp_path / "agent.toml"
    # a table of a config file, like any section
    path.write_text("[warm_start]\nsteps = 7\nweaken_to = 0.1\n")
    assert (load_config(path).warm_start.steps, load_config(path).warm_start.weaken_to) == (7, 0.1)
    assert load_config(path, ["warm_start.weaken_to=null"]).warm_start.weaken_to is None


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


def test_weakening_target_is_checked():
    from arl_train.config import ConfigError

    assert warm_start_config(["warm_start.weaken_to=0.3"]).weaken_to == 0.3
    assert warm_start_config(["warm_start.weaken_to=null"]).weaken_to is None
    with pytest.raises(ConfigError, match="weaken_to"):
        warm_start_config(["warm_start.weaken_to=1.5"])


class _ScriptedPolicy:
    """Stands in for the model: `generate` appends, to every row, the turn `reply(task)` writes for the task
    whose instruction the row's prompt holds (what `first_turn_success` must score), shorter turns padded
    on the right as generate pads finished rows."""

    def __init__(self, tokenizer, tasks, reply):
        self.tokenizer, self.tasks, self.reply = tokenizer, tasks, reply

    def generate(self, input_ids, *, pad_token_id, **_):
        turns = []
        for row in input_ids:
            text = self.tokenizer.decode(row)
            task = next(t for t in self.tasks if t.instruction.strip() in text)
            turns.append(self.tokenizer(self.reply(task), add_special_tokens=False)["input_ids"])
        width = max(len(t) for t in turns)
        padded = torch.tensor([t + [pad_token_id] * (width - len(t)) for t in turns])
        return torch.cat([input_ids, padded], dim=1)


def test_first_turn_success_counts_exactly_the_oracle_calls(tokenizer):
    from arl.harbor.agents.scripts import hermes_call
    from arl_train.warm_start import first_turn_success, slipped

    tasks = random_tasks(8, seed=9)

    def call(command):
        return hermes_call(command) + "<|im_end|>"

    def half_right(task):  # the oracle on the first four tasks, their slip on the others
        return call(task.solution if tasks.index(task) < 4 else slipped(task).solution)

    assert (
        first_turn_success(
            _ScriptedPolicy(tokenizer, tasks, lambda t: call(t.solution)), tokenizer, tasks, samples=3, seed=0
        )
        == 1.0
    )
    assert (
        first_turn_success(_ScriptedPolicy(tokenizer, tasks, half_right), tokenizer, tasks, samples=3, seed=0)
        == 0.5
    )
    no_call = _ScriptedPolicy(tokenizer, tasks, lambda t: t.solution + "<|im_end|>")  # the command as prose
    assert first_turn_success(no_call, tokenizer, tasks, samples=2, seed=0) == 0.0
    broken = _ScriptedPolicy(
        tokenizer, tasks, lambda t: '<tool_call>\n{"name": "bash", "arguments": {"command"<|im_end|>'
    )
    assert first_turn_success(broken, tokenizer, tasks, samples=2, seed=0) == 0.0


def test_the_weakening_pass_stops_at_its_target(tmp_path):
    """Demonstrations, then slipped steps until the measured first-turn success is at most weaken_to; the
    record keeps every check and both passes' losses."""
    from arl_train.warm_start import WarmStartConfig, prepare_agent_run

    cfg = WarmStartConfig(
        tasks=4, examples=8, steps=2, batch_size=2, weaken_to=0.0, weaken_max_steps=3, check_samples=1
    )
    prepare_agent_run(tmp_path / "w", cfg, run_seed=1, log=lambda _: None)
    record = json.loads((tmp_path / "w" / "warm_start.json").read_text())
    phases = [phase for phase, _, _ in record["first_turn_success"]]
    assert phases[0] == "demonstrations" and set(phases[1:]) == {"weakening"}
    assert record["first_turn_success"][-1][2] == 0.0 and len(record["weaken_losses"]) == len(phases) - 1
    assert (tmp_path / "w" / "model_sft" / "config.json").is_file()


def test_supervised_pass_is_deterministic_by_seed(tiny, tokenizer, tmp_path):
    """The same seed gives the same losses and byte-identical weights (what pins the preset's starting
    reward); another seed other batches. Threads differ from the pass's own on purpose: it pins them."""
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    examples = [encode_demonstration(tokenizer, t) for t in random_tasks(16, seed=6)]

    def sft(name: str, seed: int) -> tuple[list[float], dict]:
        losses = supervised_pass(
            tiny,
            tmp_path / name,
            examples,
            steps=4,
            batch_size=4,
            lr=3e-3,
            seed=seed,
            threads=2,
            log=lambda _: None,
        )
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
