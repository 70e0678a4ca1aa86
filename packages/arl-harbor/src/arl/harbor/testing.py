"""Test helpers: write tiny Harbor task directories that run in the local sandbox in about a second.

The default task asks for `/app/hello.txt` containing "Hello, world!"; its verifier writes 1 or 0 to
/logs/verifier/reward.txt and its oracle solution writes the file. Knobs make broken variants for
failure-policy tests (a failing or slow environment setup, a slow verifier, short timeouts).
"""

from __future__ import annotations

import json
from pathlib import Path

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
) -> Path:
    """Writes a Harbor task directory under `root` and returns its path.

    `local_setup` becomes environment/local_setup.sh, which `LocalSandboxEnvironment` runs at start
    (e.g. "exit 1" for an environment that cannot start, "sleep 30" for a start timeout).
    `extra_rewards` makes the verifier write reward.json with these keys besides "reward".
    """
    task = root / name
    (task / "environment").mkdir(parents=True, exist_ok=True)
    (task / "tests").mkdir(exist_ok=True)
    (task / "solution").mkdir(exist_ok=True)
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n\n[metadata]\n\n'
        f"[verifier]\ntimeout_sec = {float(verifier_timeout_sec)}\n\n"
        f"[agent]\ntimeout_sec = {float(agent_timeout_sec)}\n\n"
        f'[environment]\nbuild_timeout_sec = {float(build_timeout_sec)}\nworkdir = "/app"\n'
    )
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
