"""Test helpers: write tiny Harbor task directories that run in the local sandbox in about a second.

Also a minimal SWE task following issue 31's contract (`write_swe_task`) and, re-exported from
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

from arl.harbor.agents.scripts import AGENTS as SWE_AGENTS  # noqa: F401 - re-exported test doubles
from arl.harbor.agents.scripts import SCRIPTS as SWE_SCRIPTS  # noqa: F401
from arl.harbor.agents.scripts import read_task, script_completions  # noqa: F401

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

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


# ----- a minimal SWE task (issue 31's contract) ------------------------------------------------------

SWE_BUGGY = '''"""A tiny calculator."""


def add(a, b):
    return a - b


def mul(a, b):
    return a * b
'''
SWE_FIXED = SWE_BUGGY.replace("return a - b", "return a + b")
SWE_TESTS = '''from calc import add, mul


def test_add():
    assert add(2, 3) == 5


def test_mul():
    assert mul(2, 3) == 6
'''
SWE_INSTRUCTION = """`calc.add` returns wrong results.

Running the test suite, `tests/test_calc.py::test_add` fails:

    assert add(2, 3) == 5
    AssertionError: assert -1 == 5

`add(a, b)` should return the sum of its arguments. Fix the package in /testbed (do not change the tests).
"""
# The verifier's test runner: stdlib only (the local sandbox's Python has no pytest), same reward keys
# as the contract's pytest verifier: reward 1.0 iff every listed test passes, plus the pass fractions.
SWE_RUNNER = '''import importlib.util, json, sys, traceback
config, out = json.load(open(sys.argv[1])), sys.argv[2]
sys.path.insert(0, "/testbed")
modules = {}
def passed(node):
    path, *names = node.split("::")
    try:
        if path not in modules:
            spec = importlib.util.spec_from_file_location(path.replace("/", "_")[:-3], "/testbed/" + path)
            modules[path] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(modules[path])
        obj = modules[path]
        for name in names:
            obj = getattr(obj() if isinstance(obj, type) else obj, name)
        obj()
        return True
    except Exception:
        traceback.print_exc()
        return False
f2p = [passed(n) for n in config["fail_to_pass"]]
p2p = [passed(n) for n in config["pass_to_pass"]]
frac = lambda xs: sum(xs) / len(xs) if xs else 1.0
json.dump({"reward": float(all(f2p) and all(p2p)), "fail_to_pass": frac(f2p), "pass_to_pass": frac(p2p)},
          open(out, "w"))
print("fail_to_pass", f2p, "pass_to_pass", p2p)
'''
SWE_TEST_SH = """#!/bin/bash
# Restore the pristine tests (an agent that edited them gains nothing), then run FAIL_TO_PASS + PASS_TO_PASS.
command -v python3 >/dev/null || { echo "verifier: python3 is not installed" >&2; exit 2; }
mkdir -p /logs/verifier
cp -a /tests/pristine/. /testbed/
cd /testbed && python3 /tests/run_tests.py /tests/config.json /logs/verifier/reward.json
"""


def _unified_patch(path: str, before: str, after: str) -> str:
    import difflib

    body = difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{path}", f"b/{path}")
    return f"diff --git a/{path} b/{path}\n" + "".join(body)


def write_swe_task(
    root: Path,
    name: str = "calc-add",
    *,
    base_image: str = "arl-swe-base:bookworm",
    agent_timeout_sec: float = 300.0,
    verifier_timeout_sec: float = 60.0,
    build_timeout_sec: float = 600.0,
    memory_mb: int = 2048,
) -> Path:
    """Writes a minimal SWE task following issue 31's contract and returns its directory.

    A one-module package at /testbed (a git repo of one commit) whose `add` subtracts;
    FAIL_TO_PASS `tests/test_calc.py::test_add`, PASS_TO_PASS `tests/test_calc.py::test_mul`;
    `solution/fix.patch` is the reverse patch. `environment/Dockerfile` builds `FROM base_image`;
    `environment/local_setup.sh` unpacks the same testbed at /testbed in the local sandbox (the host's
    python3 runs it; the verifier needs no pytest).
    """
    import base64
    import io
    import subprocess
    import tarfile

    task = root / name
    env, tests, solution = task / "environment", task / "tests", task / "solution"
    testbed = env / "testbed"
    for d in (testbed / "calc", testbed / "tests", tests / "pristine" / "tests", solution):
        d.mkdir(parents=True, exist_ok=True)
    (testbed / "calc" / "__init__.py").write_text(SWE_BUGGY)
    (testbed / "tests" / "test_calc.py").write_text(SWE_TESTS)
    (tests / "pristine" / "tests" / "test_calc.py").write_text(SWE_TESTS)
    git = ["git", "-C", str(testbed), "-c", "user.name=arl", "-c", "user.email=arl@localhost"]
    subprocess.run([*git[:3], "init", "-q"], check=True, timeout=30)
    subprocess.run([*git, "add", "-A"], check=True, timeout=30)
    subprocess.run([*git, "commit", "-q", "-m", "testbed"], check=True, timeout=30)
    f2p, p2p = ["tests/test_calc.py::test_add"], ["tests/test_calc.py::test_mul"]
    (tests / "config.json").write_text(json.dumps(
        {"fail_to_pass": f2p, "pass_to_pass": p2p, "package": "calc", "version": "0",
         "function": "calc.add"}))
    (tests / "run_tests.py").write_text(SWE_RUNNER)
    patch = _unified_patch("calc/__init__.py", SWE_BUGGY, SWE_FIXED)
    (solution / "fix.patch").write_text(patch)
    (task / "instruction.md").write_text(SWE_INSTRUCTION)
    (task / "task.toml").write_text(
        f'schema_version = "1.4"\n\n[metadata]\npackage = "calc"\n\n'
        f"[verifier]\ntimeout_sec = {float(verifier_timeout_sec)}\n\n"
        f"[agent]\ntimeout_sec = {float(agent_timeout_sec)}\n\n"
        f"[environment]\nbuild_timeout_sec = {float(build_timeout_sec)}\ncpus = 1\nmemory_mb = {memory_mb}\n"
        f'workdir = "/testbed"\nnetwork_mode = "no-network"\n'
    )
    (env / "Dockerfile").write_text(f"FROM {base_image}\nCOPY testbed /testbed\nWORKDIR /testbed\n")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(testbed, arcname=".")
    blob = base64.b64encode(buffer.getvalue()).decode()
    (env / "local_setup.sh").write_text(
        "#!/bin/bash\nset -e\nmkdir -p /testbed\n"
        f"base64 -d > /tmp/testbed.tgz <<'EOF'\n{blob}\nEOF\n"
        "tar -xzf /tmp/testbed.tgz -C /testbed && rm /tmp/testbed.tgz\n"
    )
    solve = "#!/bin/bash\ncd /testbed && patch -p1 < /solution/fix.patch\n"
    for path, text in ((tests / "test.sh", SWE_TEST_SH), (solution / "solve.sh", solve)):
        path.write_text(text)
        path.chmod(0o755)
    return task
