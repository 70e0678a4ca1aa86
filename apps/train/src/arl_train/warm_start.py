"""The agent preset's warm start: random shell-task instances, their demonstrations, a supervised pass
(SFT) of the tiny model on them, then a short pass that teaches it a careless habit for RL to unlearn.

`uv run apps/train --preset agent` calls `prepare_agent_run`: it writes `warm_start.tasks` random
instances of the built-in task families (`arl.harbor.builtin_tasks.random_tasks`: file names, numbers
and words drawn at random, so the policy must read the instruction) as Harbor task dirs and builds the
tiny model. Then two passes:

1. **Demonstrations** (`warm_start.steps` AdamW steps at `warm_start.lr`) of *other* random instances
   (drawn with another seed). A demonstration is the conversation the arl shell agent has with the model
   when it solves the task (system prompt and `bash` tool rendered by the chat template, a hermes tool
   call running the oracle's command, its output, then "Done."); the loss covers the assistant tokens
   only (each turn up to and including `<|im_end|>`), exactly the tokens the policy samples during RL.
   300 steps bring every seed to its plateau (first-turn success ~0.6 at temperature 1).
2. **Weakening** (`weaken_to`): steps on *slipped* demonstrations (`slipped`: a path without its .txt,
   a directory where a file was asked) at `weaken_lr`, one at a time, until the policy's first-turn
   success on the RL tasks (`first_turn_success`, measured after every step) falls to `weaken_to`.

Why the second pass: where the first pass stops decides everything. Its success moves by ±0.3 from one
step to the next at the end (seed 0: 0.45 at step 230, 0.17 at 240, 0.47 at 250), so a fixed step count
started RL anywhere between 0.13 and 0.70, and from a policy at its plateau twelve RL steps show no
rise; stopped early instead (success 0.2–0.4 on the way up), plain GRPO does not raise it in twelve
steps either: the missing skill (copying names and numbers) is slow to learn. A habit picked up in a few
small steps is what RL undoes within twelve (apps/train/BENCHMARKS.md, "Agent preset"), so every seed
starts at the same measured success with a known behaviour to correct.

Everything is deterministic: the run's `seed` (or `warm_start.seed`) fixes the RL tasks, the
demonstrations, the base model's initialisation, the batches and the success checks' samples, and the
passes run with `torch.use_deterministic_algorithms` on a fixed number of threads (`warm_start.threads`),
so one seed gives the same warm-started weights every time.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from arl_train.config import ConfigError, load_config
from arl_train.sections import WarmStartConfig
from arl_train.tiny_model import build_tiny_model
from arl_train.validation import check_machine

# The chat the shell agent (arl.harbor.shell_agent) holds: what a demonstration renders through.
_TOOL_OUTPUT = "\n[exit code 0]"


def demonstration_messages(task: Any) -> list[dict[str, Any]]:
    """The shell agent's conversation solving `task` (a `BuiltinTask`), as chat messages."""
    from arl.harbor.shell_agent import SYSTEM_PROMPT

    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "bash", "arguments": {"command": task.solution}},
    }
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.instruction.strip()},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": _TOOL_OUTPUT},
        {"role": "assistant", "content": "Done."},
    ]


def slipped(task: Any) -> Any:
    """`task` with the command a careless agent would run: the last `.txt` dropped from a path, or, for
    make-dir, the file made as a directory. The task's check fails on it (tests/test_warm_start.py)."""
    import dataclasses

    command = task.solution
    if "touch " in command:
        wrong = command.replace("touch ", "mkdir -p ")
    elif ".txt" in command:
        head, _, tail = command.rpartition(".txt")
        wrong = head + tail
    else:
        raise ValueError(f"no slip defined for task {task.name!r} ({command!r})")
    return dataclasses.replace(task, solution=wrong)


def encode_demonstration(tokenizer: Any, task: Any) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one demonstration: mask 1 on every assistant turn's tokens up to and
    including its `<|im_end|>`, 0 on the system prompt, instruction, tool output and template text."""
    from arl.harbor.shell_agent import BASH_TOOL

    messages = demonstration_messages(task)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def render(msgs: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        text = tokenizer.apply_chat_template(
            msgs, tools=[BASH_TOOL], tokenize=False, add_generation_prompt=generation_prompt
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    ids = render(messages, False)
    mask = [0] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(render(messages[:i], True))
        if ids[:start] != render(messages[:i], True):
            raise ValueError("the chat template does not render a conversation as an extension of its prefix")
        end = ids.index(eos, start)
        mask[start : end + 1] = [1] * (end + 1 - start)
    return ids, mask


def sft_loss(model: Any, batch: list[tuple[list[int], list[int]]], pad_id: int) -> Any:
    """Mean next-token cross entropy over the masked (assistant) tokens of a right-padded batch."""
    import torch

    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.float32)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (tokens, m) in enumerate(batch):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(m)] = torch.tensor(m, dtype=torch.float32)
        attn[row, : len(tokens)] = 1
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    targets, weights = ids[:, 1:], mask[:, 1:]
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
    ).view_as(weights)
    return (nll * weights).sum() / weights.sum().clamp(min=1.0)


def first_turn_prompt(tokenizer: Any, task: Any) -> list[int]:
    """Token ids of what the shell agent sends first for `task`: system prompt, `bash` tool, instruction,
    and the generation prompt of the assistant's first turn."""
    from arl.harbor.shell_agent import BASH_TOOL, SYSTEM_PROMPT

    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.instruction.strip()},
    ]
    text = tokenizer.apply_chat_template(
        messages, tools=[BASH_TOOL], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def runs_the_oracle(task: Any, turn: str) -> bool:
    """Whether the assistant turn `turn` (text up to its `<|im_end|>`) calls `bash` with exactly the task's
    oracle command, read by the proxy's own hermes parser as in a run (what the task's check accepts)."""
    from arl.harbor.shell_agent import BASH_TOOL
    from arl.proxy.tool_parsers import parse_hermes

    calls = parse_hermes(turn.split("<|im_end|>")[0], [BASH_TOOL]).tool_calls
    try:
        arguments = json.loads(calls[0].arguments) if calls else None
    except json.JSONDecodeError:
        return False
    return isinstance(arguments, dict) and arguments.get("command") == task.solution


def first_turn_success(
    model: Any, tokenizer: Any, tasks: list[Any], *, samples: int, seed: int, max_tokens: int = 48
) -> float:
    """Share of `samples` first assistant turns per task, sampled at temperature 1, that run exactly the
    task's oracle command (`runs_the_oracle`): what the policy solves on its first try (the RL reward is at
    least this). Seeded: the same model gives the same share."""
    import torch

    if not tasks:
        raise ValueError("first_turn_success needs at least one task")
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # Every task's samples in one generate call, prompts padded on the left: one decode loop instead of
    # one per task (the decode steps of a tiny model are mostly per-step overhead).
    rows = [task for task in tasks for _ in range(samples)]  # the task of each row
    rendered = [first_turn_prompt(tokenizer, task) for task in tasks]  # once per task
    prompts = [prompt for prompt in rendered for _ in range(samples)]
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            eos_token_id=end_of_turn,
            pad_token_id=pad,
        )
    turns = [tokenizer.decode(row) for row in out[:, width:]]
    solved = sum(runs_the_oracle(task, turn) for task, turn in zip(rows, turns))
    return solved / (samples * len(tasks))


@contextlib.contextmanager
def _deterministic(threads: int) -> Iterator[None]:
    """Deterministic torch kernels on `threads` intra-op threads; the process's settings come back after."""
    import torch

    before = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1])


def supervised_pass(
    model_dir: Path | str,
    out_dir: Path | str,
    examples: list[tuple[list[int], list[int]]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int = 0,
    threads: int = 2,
    stop: Callable[[int, Any], bool] | None = None,
    log: Callable[[str], None] = print,
) -> list[float]:
    """Train the model in `model_dir` on `examples` for up to `steps` AdamW steps; save it (with its
    tokenizer) to `out_dir`. After each step, `stop(steps done, model)` may end the pass early (it runs
    under its own RNG state, so it does not change the batches). Returns the loss of every step run.
    Deterministic: the same arguments give the same losses and weights (seeded batches, deterministic
    kernels on `threads` threads)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not examples:
        raise ValueError("the supervised pass needs at least one example")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, foreach=False)
    rng = random.Random(seed)
    order: list[int] = []
    losses: list[float] = []
    started = time.monotonic()
    with torch.random.fork_rng(devices=[]), _deterministic(threads):
        torch.manual_seed(seed)
        for step in range(steps):
            if len(order) < batch_size:
                order += rng.sample(range(len(examples)), len(examples))
            batch = [examples[i] for i in order[:batch_size]]
            del order[:batch_size]
            loss = sft_loss(model, batch, tokenizer.pad_token_id)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(float(loss.detach()))
            if step % 10 == 0 or step == steps - 1:
                log(
                    f"arl: warm start step {step + 1}/{steps} loss {losses[-1]:.3f} "
                    f"({time.monotonic() - started:.0f}s)"
                )
            if stop is not None:
                model.eval()
                with torch.random.fork_rng(devices=[]):
                    done = stop(step + 1, model)
                model.train()
                if done:
                    break
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    for name in ("generation_config.json",):
        src = Path(model_dir) / name
        if src.is_file():
            (out / name).write_text(src.read_text())
    return losses


def prepare_agent_run(
    out_dir: Path | str,
    cfg: WarmStartConfig,
    *,
    model_seed: int = 0,
    run_seed: int = 0,
    log: Callable[[str], None] = print,
) -> tuple[Path, Path]:
    """Write the RL task set and the warm-started model under `out_dir`; returns (tasks dir, model dir).
    `cfg.seed` (`run_seed` when None) seeds everything; the base model is built from `model_seed + seed`.

    Reuses both when `out_dir/warm_start.json` records the same config (a resumed or repeated run)."""
    seed = run_seed if cfg.seed is None else cfg.seed
    cfg = msgspec.structs.replace(cfg, seed=seed)
    from arl.harbor.builtin_tasks import random_tasks, write_builtin_tasks

    root = Path(out_dir).resolve()
    tasks_dir, model_dir, record = root / "tasks", root / "model_sft", root / "warm_start.json"
    key = {"config": msgspec.to_builtins(cfg), "model_seed": model_seed}
    if (
        record.is_file()
        and json.loads(record.read_text()).get("key") == key
        and (model_dir / "config.json").is_file()
    ):
        log(f"arl: warm start reused from {model_dir}")
        return tasks_dir, model_dir
    rl_tasks = random_tasks(cfg.tasks, seed=seed)
    write_builtin_tasks(tasks_dir, tasks=rl_tasks)
    base = build_tiny_model(
        root / "model_base",
        seed=model_seed + seed,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
    )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base))
    # Other draws than the RL tasks (a different seed); with few choices per slot, instructions recur.
    demos = random_tasks(cfg.examples, seed=seed + 1)
    examples = [encode_demonstration(tokenizer, t) for t in demos]
    log(
        f"arl: warm start: {len(examples)} demonstrations (~{len(examples[0][0])} tokens each), "
        f"{cfg.steps} steps, seed {seed}, {len(rl_tasks)} RL tasks in {tasks_dir}"
    )
    checks: list[tuple[str, int, float]] = []

    def check(phase: str, step: int, model: Any) -> float:
        success = first_turn_success(model, tokenizer, rl_tasks, samples=cfg.check_samples, seed=seed)
        checks.append((phase, step, success))
        log(f"arl: warm start {phase} step {step}: first-turn success {success:.3f}")
        return success

    def measure_at_the_end(step: int, model: Any) -> bool:
        if step == cfg.steps:
            check("demonstrations", step, model)
        return False

    weaken = cfg.weaken_to is not None
    losses = supervised_pass(
        base,
        root / "model_demo" if weaken else model_dir,
        examples,
        steps=cfg.steps,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        seed=seed,
        threads=cfg.threads,
        stop=measure_at_the_end,
        log=log,
    )
    weaken_losses: list[float] = []
    if weaken:
        slips = [encode_demonstration(tokenizer, slipped(t)) for t in demos]
        weaken_losses = supervised_pass(
            root / "model_demo",
            model_dir,
            slips,
            steps=cfg.weaken_max_steps,
            batch_size=cfg.batch_size,
            lr=cfg.weaken_lr,
            seed=seed,
            threads=cfg.threads,
            stop=lambda step, model: check("weakening", step, model) <= cfg.weaken_to,
            log=lambda _: None,
        )
        if checks[-1][2] > cfg.weaken_to:
            raise ValueError(
                f"warm_start: first-turn success still {checks[-1][2]:.3f} after "
                f"weaken_max_steps={cfg.weaken_max_steps} slipped steps (weaken_to={cfg.weaken_to}); "
                f"raise warm_start.weaken_max_steps or warm_start.weaken_lr"
            )
    record.write_text(
        json.dumps(
            {"key": key, "losses": losses, "weaken_losses": weaken_losses, "first_turn_success": checks}
        )
        + "\n"
    )
    return tasks_dir, model_dir


AGENT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "agent.toml"


def load_agent_config(
    path: Path | None, overrides: list[str], mode: str | None = None, log: Callable[[str], None] = print
) -> Any:
    """The agent preset's `AppConfig`: `path` (default configs/agent.toml) and `overrides` (its
    `[warm_start]` section among them), with the warm start run (or reused) and its task set and model
    folder filled in as data.source/model.path."""
    path = path or AGENT_CONFIG
    config = load_config(path, overrides, mode)
    check_machine(config)
    if not config.model.path.startswith("builtin:tiny"):
        raise ConfigError(
            f"--preset agent warm-starts the built-in tiny model; model.path={config.model.path!r}"
        )
    tasks_dir, model_dir = prepare_agent_run(
        config.output.dir, config.warm_start, model_seed=config.model.seed, run_seed=config.seed, log=log
    )
    return load_config(path, [*overrides, f"model.path={model_dir}", f"data.source=harbor:{tasks_dir}"], mode)
