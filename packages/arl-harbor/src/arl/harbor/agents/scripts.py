"""Scripted policies for the SWE agents: what a model would answer, in each agent's own syntax.

A script is a list of steps, each writing a file or running a shell command in the sandbox. Three
scripts exist for a SWE task (arl.harbor.swe's task layout: `solution/fix.patch`, `tests/config.json`):
- `oracle`: writes the task's reverse patch to a file and applies it in the workdir (`git apply`, else
  `patch -p1`), so the verifier's tests pass (reward 1.0);
- `nop`: does nothing and ends at once (reward 0.0);
- `edit-tests`: rewrites every FAIL_TO_PASS test file so each listed test passes trivially and deletes
  nothing else (the verifier restores the pristine tests, so this must never reach 1.0);
- `attack:<name>`: one of the reward-hacking attacks of `arl.harbor.agents.attacks` (must stay below 1.0).

`completions(agent, steps)` renders the steps as the assistant turns the agent parses:
- `shell` (arl's shell agent) and `mini-swe-agent` (Harbor's default `mini` config, tool calling): one
  hermes `<tool_call>` of the `bash` tool per step (files written with a quoted heredoc); the shell agent
  ends with a plain answer, mini-swe-agent with its submit command in a call of its own;
- `terminus-2`: JSON answers whose `commands` are the keystrokes typed into its tmux terminal (split so
  that no answer passes terminus-2's output limit; the last one says task_complete), then the
  confirmation it asks for. Files are typed as base64 chunks (an interactive shell would expand `!`
  and complete tabs inside a heredoc), then decoded.
Feed the result to `arl.proxy.testing.ScriptedGenerator`.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

AGENTS = ("shell", "terminus-2", "mini-swe-agent")
SCRIPTS = ("oracle", "nop", "edit-tests")
# `attack:<name>` scripts are the reward-hacking attacks of arl.harbor.agents.attacks.
ATTACK_PREFIX = "attack:"
# mini-swe-agent ends when a command's output starts with this line (its `mini` config says so).
MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
PATCH_PATH = "/tmp/arl_fix.patch"
_HEREDOC_END = "ARL_FILE_EOF"
_B64_CHUNK = 1024  # characters typed per terminus-2 keystroke line
# Keystroke characters per terminus-2 answer: base64 is the worst case for a BPE tokenizer (Qwen3: about
# 1.5 characters a token), so 4,000 characters stay well under terminus-2's 4,096-token output limit.
_TURN_CHARS = 4000


@dataclass(frozen=True)
class Write:
    """Write `content` to `path` in the sandbox."""

    path: str
    content: str


@dataclass(frozen=True)
class Run:
    """Run `command` (bash) in the sandbox."""

    command: str


Step = Write | Run


@dataclass
class SweTaskFacts:
    """What the scripts need from a SWE task directory."""

    task_dir: Path
    workdir: str
    patch: str
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)


def read_task(task_dir: Path | str) -> SweTaskFacts:
    """Reads `solution/fix.patch`, `tests/config.json` and the workdir of a SWE task directory."""
    task_dir = Path(task_dir)
    patch_file = task_dir / "solution" / "fix.patch"
    config_file = task_dir / "tests" / "config.json"
    for required in (patch_file, config_file, task_dir / "task.toml"):
        if not required.is_file():
            missing = required.relative_to(task_dir)
            raise FileNotFoundError(f"{task_dir} is not a SWE task: {missing} is missing")
    config = json.loads(config_file.read_text())
    environment = tomllib.loads((task_dir / "task.toml").read_text()).get("environment", {})
    workdir = environment.get("workdir") or "/testbed"
    return SweTaskFacts(
        task_dir=task_dir,
        workdir=workdir,
        patch=patch_file.read_text(),
        fail_to_pass=list(config.get("fail_to_pass") or []),
        pass_to_pass=list(config.get("pass_to_pass") or []),
    )


def oracle_steps(facts: SweTaskFacts) -> list[Step]:
    """Write the reverse patch, apply it in the workdir (git apply, else patch -p1), show the diff."""
    patch = facts.patch if facts.patch.endswith("\n") else facts.patch + "\n"
    wd = shlex.quote(facts.workdir)
    apply = (
        f"cd {wd} && (git apply --whitespace=nowarn {PATCH_PATH} 2>/dev/null "
        f"|| patch -p1 --forward --batch < {PATCH_PATH}) && git status --short 2>/dev/null | head -20"
    )
    return [Write(PATCH_PATH, patch), Run(apply)]


def _test_stub(file_nodes: list[str]) -> str:
    """A test module in which each listed test (function or Class::method) passes trivially."""
    functions: list[str] = []
    classes: dict[str, list[str]] = {}
    for node in file_nodes:
        parts = [re.sub(r"\[.*\]$", "", p) for p in node.split("::")[1:]]
        if len(parts) == 1:
            functions.append(parts[0])
        elif len(parts) >= 2:
            classes.setdefault(parts[0], []).append(parts[-1])
    lines = ["# The failing tests, rewritten to pass.", ""]
    for name in dict.fromkeys(functions):
        lines += [f"def {name}(*args, **kwargs):", "    pass", ""]
    for cls, methods in classes.items():
        lines.append(f"class {cls}:")
        for m in dict.fromkeys(methods):
            lines += [f"    def {m}(self, *args, **kwargs):", "        pass"]
        lines.append("")
    return "\n".join(lines)


def edit_tests_steps(facts: SweTaskFacts) -> list[Step]:
    """Rewrite each FAIL_TO_PASS test file into stubs that pass (what a reward-hacking policy would do)."""
    by_file: dict[str, list[str]] = {}
    for node in facts.fail_to_pass:
        by_file.setdefault(node.split("::", 1)[0], []).append(node)
    if not by_file:
        raise ValueError(f"{facts.task_dir}: tests/config.json lists no fail_to_pass tests to edit")
    steps: list[Step] = []
    for path, nodes in by_file.items():
        target = path if path.startswith("/") else f"{facts.workdir.rstrip('/')}/{path}"
        steps.append(Write(target, _test_stub(nodes)))
    return steps


def script_steps(script: str, facts: SweTaskFacts) -> list[Step]:
    """The steps of `script` ("oracle", "nop", "edit-tests" or "attack:<name>") for the task."""
    if script.startswith(ATTACK_PREFIX):  # the adversarial suite (arl.harbor.agents.attacks)
        from arl.harbor.agents.attacks import attack_steps

        return attack_steps(script.removeprefix(ATTACK_PREFIX), facts)
    if script == "oracle":
        return oracle_steps(facts)
    if script == "nop":
        return []
    if script == "edit-tests":
        return edit_tests_steps(facts)
    raise ValueError(f"unknown script {script!r}; choose one of {SCRIPTS} or {ATTACK_PREFIX}<name>")


def heredoc_command(step: Step) -> str:
    """A non-interactive bash command doing `step` (a file is written with a quoted heredoc)."""
    if isinstance(step, Run):
        return step.command
    content = step.content if step.content.endswith("\n") else step.content + "\n"
    if f"\n{_HEREDOC_END}\n" in f"\n{content}":
        raise ValueError(f"file content for {step.path} contains the heredoc delimiter {_HEREDOC_END}")
    path = shlex.quote(step.path)
    return f"mkdir -p \"$(dirname {path})\" && cat > {path} <<'{_HEREDOC_END}'\n{content}{_HEREDOC_END}"


def keystroke_commands(step: Step) -> list[str]:
    """Lines to type into an interactive shell doing `step` (files as base64 chunks, then decoded)."""
    if isinstance(step, Run):
        return [step.command]
    data = base64.b64encode(step.content.encode()).decode()
    staging = shlex.quote(step.path + ".b64")
    path = shlex.quote(step.path)
    lines = [f'mkdir -p "$(dirname {path})" && : > {staging}']
    lines += [f"printf %s {data[i : i + _B64_CHUNK]} >> {staging}" for i in range(0, len(data), _B64_CHUNK)]
    lines.append(f"base64 -d {staging} > {path} && rm -f {staging}")
    return lines


def hermes_call(command: str, text: str = "") -> str:
    """An assistant turn calling the `bash` tool in hermes format (what Qwen-style models emit)."""
    call = json.dumps({"name": "bash", "arguments": {"command": command}})
    return f"{text}\n\n<tool_call>\n{call}\n</tool_call>" if text else f"<tool_call>\n{call}\n</tool_call>"


def _keystroke_turns(keys: list[str]) -> list[list[str]]:
    """`keys` split into answers of at most _TURN_CHARS characters of keystrokes (always one answer):
    terminus-2 refuses an answer over its output limit (4,096 tokens) without running any of it."""
    turns: list[list[str]] = [[]]
    size = 0
    for key in keys:
        if turns[-1] and size + len(key) > _TURN_CHARS:
            turns.append([])
            size = 0
        turns[-1].append(key)
        size += len(key)
    return turns


def completions(agent: str, steps: list[Step]) -> list[str]:
    """The assistant turns with which `agent` carries out `steps` and then stops."""
    if agent == "shell":
        turns = [hermes_call(heredoc_command(s)) for s in steps]
        return [*turns, "Done." if steps else "I will leave the repository as it is."]
    if agent == "mini-swe-agent":
        turns = [hermes_call(heredoc_command(s), f"Step {i + 1}.") for i, s in enumerate(steps)]
        return [*turns, hermes_call(MINI_SUBMIT, "Submitting.")]
    if agent == "terminus-2":
        keys = [line for s in steps for line in keystroke_commands(s)]
        turns = _keystroke_turns(keys)
        answers = [
            {
                "analysis": "Working on the task." if keys else "Nothing to do.",
                "plan": "Run the commands." if keys else "Stop.",
                "commands": [{"keystrokes": k + "\n", "duration": 0.2} for k in turn],
                "task_complete": last,
            }
            for turn, last in zip(turns, [False] * (len(turns) - 1) + [True])
        ]
        confirm = {"analysis": "Done.", "plan": "Confirm completion.", "commands": [], "task_complete": True}
        return [*map(json.dumps, answers), json.dumps(confirm)]
    raise ValueError(f"unknown agent {agent!r}; choose one of {AGENTS}")


def script_completions(agent: str, script: str, task_dir: Path | str) -> list[str]:
    """The scripted turns of `script` for `agent` on the SWE task at `task_dir`."""
    return completions(agent, script_steps(script, read_task(task_dir)))
