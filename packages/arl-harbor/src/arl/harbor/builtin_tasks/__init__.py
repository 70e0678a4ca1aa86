"""Built-in Harbor tasks for agent training without a download: small file and shell tasks whose
verifiers need no network, runnable in the local sandbox (`environment/local_setup.sh` seeds the files).

`write_builtin_tasks(root)` writes every task directory under `root` (Harbor's layout: task.toml,
instruction.md, environment/, tests/test.sh writing /logs/verifier/reward.txt, solution/solve.sh for the
oracle) and returns their paths. Each task has one checkable answer, so the reward is 1 or 0.
`demonstration(task)` is what a model should answer, turn by turn, as the arl shell agent expects it
(hermes tool calls to `bash`), for a supervised warm-start.
`random_tasks(count, seed=...)` draws instances of four families (write-number, write-word, copy-file,
make-dir) with random file names, numbers and words: the task set of `apps/train --preset agent`,
where a policy has to read the instruction to earn the reward.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BuiltinTask:
    """One task: what the agent is told, how the sandbox is seeded, how it is checked and solved."""

    name: str
    instruction: str
    setup: str  # bash run in the sandbox before the agent (seeds /app)
    check: str  # a bash condition that holds exactly when the task is solved
    solution: str  # bash that solves it (the oracle)


TASKS: tuple[BuiltinTask, ...] = (
    BuiltinTask(
        "hello-file",
        "Create a file /app/hello.txt whose only content is the line: Hello, world!",
        "mkdir -p /app",
        '[ "$(cat /app/hello.txt 2>/dev/null)" = "Hello, world!" ]',
        "echo 'Hello, world!' > /app/hello.txt",
    ),
    BuiltinTask(
        "count-lines",
        "Count the lines of /app/data.txt and write the number (digits only) to /app/answer.txt.",
        "mkdir -p /app && seq 1 17 > /app/data.txt",
        '[ "$(tr -d " \\n" < /app/answer.txt 2>/dev/null)" = "17" ]',
        "wc -l < /app/data.txt | tr -d ' ' > /app/answer.txt",
    ),
    BuiltinTask(
        "sum-numbers",
        "/app/numbers.txt holds one integer per line. Write their sum (digits only) to /app/answer.txt.",
        "mkdir -p /app && printf '3\\n14\\n25\\n8\\n' > /app/numbers.txt",
        '[ "$(tr -d " \\n" < /app/answer.txt 2>/dev/null)" = "50" ]',
        "awk '{s+=$1} END {print s}' /app/numbers.txt > /app/answer.txt",
    ),
    BuiltinTask(
        "copy-file",
        "Copy /app/src.txt to /app/dst.txt.",
        "mkdir -p /app && echo 'arl copy check 42' > /app/src.txt",
        "cmp -s /app/src.txt /app/dst.txt",
        "cp /app/src.txt /app/dst.txt",
    ),
    BuiltinTask(
        "make-dir",
        "Create the directory /app/out and an empty file /app/out/done inside it.",
        "mkdir -p /app",
        "[ -d /app/out ] && [ -f /app/out/done ]",
        "mkdir -p /app/out && touch /app/out/done",
    ),
)


def write_task(root: Path, task: BuiltinTask, *, agent_timeout_sec: float = 120.0) -> Path:
    """Write one task directory under `root`; returns its path."""
    path = root / task.name
    for sub in ("environment", "tests", "solution"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    (path / "task.toml").write_text(
        'schema_version = "1.4"\n\n[metadata]\n\n[verifier]\ntimeout_sec = 30.0\n\n'
        f"[agent]\ntimeout_sec = {float(agent_timeout_sec)}\n\n"
        '[environment]\nbuild_timeout_sec = 60.0\nworkdir = "/app"\n'
    )
    (path / "instruction.md").write_text(task.instruction + "\n")
    (path / "environment" / "Dockerfile").write_text("FROM debian:bookworm-slim\nWORKDIR /app\n")
    scripts = {
        path / "environment" / "local_setup.sh": task.setup,
        path / "tests" / "test.sh": f"if {task.check}; then\n  echo 1 > /logs/verifier/reward.txt\n"
        "else\n  echo 0 > /logs/verifier/reward.txt\nfi",
        path / "solution" / "solve.sh": task.solution,
    }
    for script, body in scripts.items():
        script.write_text("#!/bin/bash\n" + body + "\n")
        script.chmod(0o755)
    return path


def write_builtin_tasks(
    root: str | Path,
    *,
    agent_timeout_sec: float = 120.0,
    tasks: tuple[BuiltinTask, ...] | list[BuiltinTask] = TASKS,
) -> list[Path]:
    """Write `tasks` (default: every built-in task) under `root` (created if missing); returns the
    task directories."""
    folder = Path(root)
    folder.mkdir(parents=True, exist_ok=True)
    return [write_task(folder, t, agent_timeout_sec=agent_timeout_sec) for t in tasks]


def demonstration(task: BuiltinTask) -> list[str]:
    """The assistant turns that solve `task` with the arl shell agent: a hermes `bash` call running the
    oracle's command, then a short final answer."""
    call = {"name": "bash", "arguments": {"command": task.solution}}
    return [f"<tool_call>\n{json.dumps(call)}\n</tool_call>", "Done."]


# ----- randomised instances (the agent preset's task set and its warm-start demonstrations) -----

# Few choices per slot: a policy that ignores the instruction solves a family by chance (1 in 4 to 1 in 16),
# one that reads it always; the gap is what RL has to close after a short warm start. (With any 2-digit
# number, 1 in 360 for write-number, RL never sampled a right answer to learn from: that family stayed at
# its warm-start rate while the others were already near 90%.)
_NAMES = ("answer", "result", "output", "notes")
_WORDS = ("hello", "world", "green", "blue")
_NUMBERS = ("17", "42", "64", "90")
FAMILIES = ("write-number", "write-word", "copy-file", "make-dir")


def random_task(rng: random.Random, family: str | None = None, *, index: int = 0) -> BuiltinTask:
    """One instance of a task family with random file names and contents, so a policy must read the
    instruction to solve it (nothing is solvable from the family alone). `index` only names the task."""
    family = family or rng.choice(FAMILIES)
    a, b = rng.sample(_NAMES, 2)
    name = f"{family}-{index:04d}"
    if family == "write-number":
        n = rng.choice(_NUMBERS)
        return BuiltinTask(
            name,
            f"Write the number {n} to /app/{a}.txt.",
            "mkdir -p /app",
            f'[ "$(tr -d " \\n" < /app/{a}.txt 2>/dev/null)" = "{n}" ]',
            f"echo {n} > /app/{a}.txt",
        )
    if family == "write-word":
        w = rng.choice(_WORDS)
        return BuiltinTask(
            name,
            f"Create a file /app/{a}.txt whose only content is the line: {w}",
            "mkdir -p /app",
            f'[ "$(cat /app/{a}.txt 2>/dev/null)" = "{w}" ]',
            f"echo {w} > /app/{a}.txt",
        )
    if family == "copy-file":
        return BuiltinTask(
            name,
            f"Copy /app/{a}.txt to /app/{b}.txt.",
            f"mkdir -p /app && echo 'arl {rng.randint(0, 999)}' > /app/{a}.txt",
            f"cmp -s /app/{a}.txt /app/{b}.txt",
            f"cp /app/{a}.txt /app/{b}.txt",
        )
    if family == "make-dir":
        return BuiltinTask(
            name,
            f"Create the directory /app/{a} and an empty file /app/{a}/{b} inside it.",
            "mkdir -p /app",
            f"[ -d /app/{a} ] && [ -f /app/{a}/{b} ]",
            f"mkdir -p /app/{a} && touch /app/{a}/{b}",
        )
    raise ValueError(f"unknown task family {family!r}; choose one of {FAMILIES}")


def random_tasks(count: int, *, seed: int = 0, families: tuple[str, ...] = FAMILIES) -> list[BuiltinTask]:
    """`count` random instances, the families in turn (deterministic from `seed`)."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    rng = random.Random(seed)
    return [random_task(rng, families[i % len(families)], index=i) for i in range(count)]
