"""Test helpers: write tiny Harbor task directories that run in the local sandbox in about a second.

Also a real SWE task of a tiny package, written by the task-set builder's writer (`write_swe_task`) and,
re-exported from
`arl.harbor.agents.scripts`, the scripted policies (oracle / nop / edit-tests) in each SWE agent's syntax
(`script_completions(agent, script, task_dir)`, for `arl.proxy.testing.ScriptedGenerator`).

The default task asks for `/app/hello.txt` containing "Hello, world!"; its verifier writes 1 or 0 to
/logs/verifier/reward.txt and its oracle solution writes the file. Knobs make broken variants for
failure-policy tests (a failing or slow environment setup, a slow verifier, short timeouts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from arl.harbor.agents.scripts import AGENTS as SWE_AGENTS  # noqa: F401 - re-exported test doubles
from arl.harbor.agents.scripts import SCRIPTS as SWE_SCRIPTS  # noqa: F401
from arl.harbor.agents.scripts import read_task, script_completions  # noqa: F401

HELLO_INSTRUCTION = "Create a file /app/hello.txt whose only content is the line: Hello, world!\n"
HELLO_TEST = """#!/bin/bash
if [ "$(cat /app/hello.txt 2>/dev/null)" = "Hello, world!" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
HELLO_SOLUTION = "#!/bin/bash\necho 'Hello, world!' > /app/hello.txt\n"


def write_hello_task(
    root: Path,
    name: str = "hello",
    *,
    agent_timeout_sec: float = 60.0,
    verifier_timeout_sec: float = 30.0,
    build_timeout_sec: float = 60.0,
    local_setup: str | None = None,
    test_script: str = HELLO_TEST,
    solution_script: str = HELLO_SOLUTION,
    instruction: str = HELLO_INSTRUCTION,
    extra_rewards: dict[str, float] | None = None,
    verifier_mode: str | None = None,
    tests_image: bool = False,
    cpus: float | None = None,
    memory_mb: int | None = None,
) -> Path:
    """Writes a Harbor task directory under `root` and returns its path.

    `local_setup` becomes environment/local_setup.sh, which `LocalSandboxEnvironment` runs at start
    (e.g. "exit 1" for an environment that cannot start, "sleep 30" for a start timeout).
    `extra_rewards` makes the verifier write reward.json with these keys besides "reward".
    `verifier_mode="separate"` runs the verifier in an environment of its own (Harbor's separate mode):
    the agent's /app/hello.txt reaches it as a declared artifact; `tests_image` also gives tests/ a
    Dockerfile (the verifier image is built from tests/, which Harbor then does not upload).
    `cpus`/`memory_mb` become the task's [environment] limits.
    """
    task = root / name
    (task / "environment").mkdir(parents=True, exist_ok=True)
    (task / "tests").mkdir(exist_ok=True)
    (task / "solution").mkdir(exist_ok=True)
    artifacts = 'artifacts = ["/app/hello.txt"]\n\n' if verifier_mode == "separate" else ""
    mode = f'environment_mode = "{verifier_mode}"\n' if verifier_mode else ""
    limits = (f"cpus = {cpus}\n" if cpus else "") + (f"memory_mb = {memory_mb}\n" if memory_mb else "")
    (task / "task.toml").write_text(
        f'schema_version = "1.4"\n{artifacts}\n[metadata]\n\n'
        f"[verifier]\ntimeout_sec = {float(verifier_timeout_sec)}\n{mode}\n"
        f"[agent]\ntimeout_sec = {float(agent_timeout_sec)}\n\n"
        f'[environment]\nbuild_timeout_sec = {float(build_timeout_sec)}\nworkdir = "/app"\n{limits}'
    )
    if tests_image:
        (task / "tests" / "Dockerfile").write_text("FROM debian:bookworm-slim\nCOPY . /tests/\n")
    (task / "instruction.md").write_text(instruction)
    (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm-slim\nWORKDIR /app\n")
    if local_setup is not None:
        (task / "environment" / "local_setup.sh").write_text("#!/bin/bash\n" + local_setup + "\n")
    if extra_rewards:
        rewards = json.dumps(extra_rewards)
        test_script = test_script.replace(
            "> /logs/verifier/reward.txt", "> /logs/verifier/reward.txt.tmp"
        ) + (
            f"r=$(cat /logs/verifier/reward.txt.tmp); rm -f /logs/verifier/reward.txt.tmp\n"
            f'python3 -c \'import json,sys; d=json.loads(sys.argv[1]); d["reward"]=float(sys.argv[2]); '
            f"print(json.dumps(d))' '{rewards}' \"$r\" > /logs/verifier/reward.json\n"
        )
    for path, text in (
        (task / "tests" / "test.sh", test_script),
        (task / "solution" / "solve.sh", solution_script),
    ):
        path.write_text(text)
        path.chmod(0o755)
    return task


SCRIPTED_AGENT_IMPORT_PATH = "arl.harbor.testing:ScriptedAgent"


class ScriptedAgent(BaseAgent):
    """A Harbor agent that calls no model: it runs `script` (bash) in the sandbox as the agent phase.

    Select it with `HarborConfig(agent_import_path=SCRIPTED_AGENT_IMPORT_PATH,
    agent_kwargs={"script": "..."})`. What the script printed and its exit code are written to the
    trial's agent log dir as `scripted.json` (for tests that check what an attempt could do).
    """

    CALLS_MODEL = False

    def __init__(self, *args: Any, script: str = "true", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.script = script

    @staticmethod
    def name() -> str:
        return "arl-scripted"

    def version(self) -> str:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        pass

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        result = await environment.exec(self.script)
        (self.logs_dir / "scripted.json").write_text(
            json.dumps({"stdout": result.stdout, "stderr": result.stderr, "return_code": result.return_code})
        )


# ----- a real SWE task of a tiny package -------------------------------------------------------------


def write_swe_task(
    root: Path,
    name: str = "tinycalc__clamp",
    *,
    base_image: str = "arl-swe-base:bookworm",
    agent_timeout_sec: float = 300.0,
    verifier_timeout_sec: float = 60.0,
    venv: Path | None = None,
    cache: Path | None = None,
) -> Path:
    """Writes a SWE task of `arl.harbor.swe.testing`'s tinycalc package with the builder's own writer (so
    it is graded exactly as a built set's tasks are) and returns its directory: `clamp` returns the wrong
    bound; FAIL_TO_PASS `test_clamp_high` / `test_clamp_low`, PASS_TO_PASS `test_clamp_inside` /
    `test_counter`. See `arl.harbor.swe.testing.write_tinycalc_task` for `venv` and `cache`."""
    from arl.harbor.swe.testing import write_tinycalc_task

    return write_tinycalc_task(
        root,
        name=name,
        base_image=base_image,
        agent_timeout_sec=agent_timeout_sec,
        verifier_timeout_sec=verifier_timeout_sec,
        venv=venv,
        cache=cache,
    )
