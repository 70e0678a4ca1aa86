"""The SWE agent checks: a scripted policy drives a real agent through arl-proxy on a SWE task.

`run_check(task_dir, agent=..., script=..., env=...)` runs one Harbor trial through `HarborAgentLoop`
with `arl.proxy.testing.ScriptedGenerator` as the engine, replaying `arl.harbor.agents.scripts`' turns
for the agent, and returns a `CheckResult`: the reward, whether it is what the script must get (oracle
1.0, nop 0.0, edit-tests below 1.0), and the token-exactness problems found in the proxy's record
(`token_exact_problems`). Used by the tests and by `benchmarks/swe_agent_checks.py`.
"""

from __future__ import annotations

import glob
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arl.harbor.agents import agent_settings
from arl.harbor.agents.scripts import script_completions

ENVS = ("local", "docker")


def expected_ok(script: str, reward: float | None) -> bool:
    """Whether `reward` is what `script` must get: oracle 1.0, nop 0.0, edit-tests and every `attack:<name>`
    below 1.0. A failed trial (`reward` None) is never ok: an error the agent caused must be its kept 0."""
    if reward is None:
        return False
    if script == "oracle":
        return reward == 1.0
    if script == "nop":
        return reward == 0.0
    return reward < 1.0


@dataclass
class CheckResult:
    """One agent × script × environment run on one task."""

    task_id: str
    agent: str
    script: str
    env: str
    reward: float | None
    rewards: dict[str, float]
    ok: bool
    failed: bool
    failure_kind: str
    error: str
    num_turns: int
    generator_calls: int
    segments: int
    wall_s: float
    timings: dict[str, float]
    token_problems: list[str] = field(default_factory=list)
    trial_dir: str = ""
    # Attempts discarded by the failure policy before this one (sandbox failures are retried).
    retried: bool = False


def harbor_config_fields(
    agent: str,
    env: str,
    *,
    trials_dir: Path,
    mini_venv: Path | None = None,
    trial_timeout_sec: float | None = None,
    max_turns: int = 20,
) -> dict[str, Any]:
    """`HarborConfig` fields for `agent` in `env` ("local" sandbox or Harbor's "docker")."""
    if env not in ENVS:
        raise ValueError(f"unknown env {env!r}; choose one of {ENVS}")
    fields: dict[str, Any] = {
        "trials_dir": str(trials_dir),
        "model_name": "Qwen/Qwen3-0.6B",
        "trial_timeout_sec": trial_timeout_sec,
        **agent_settings(agent),
    }
    agent_kwargs: dict[str, Any] = {}
    env_kwargs: dict[str, Any] = {}
    if agent == "shell":
        agent_kwargs["max_turns"] = max_turns
    elif agent == "terminus-2":
        fields["max_turns"] = max_turns
    elif agent == "mini-swe-agent":
        agent_kwargs["step_limit"] = max_turns
        if env == "local":
            if mini_venv is None:
                raise ValueError("mini-swe-agent in the local sandbox needs mini_venv (a host venv)")
            from arl.harbor.agents.mini_swe import local_sandbox_kwargs

            extra = local_sandbox_kwargs(mini_venv)
            agent_kwargs.update(extra["agent_kwargs"])
            env_kwargs.update(extra["environment_kwargs"])
        else:
            env_kwargs["auto_mounting"] = True  # the proxy bridge's socket lives in the bound /logs/agent
    if env == "docker":
        # The project's docker environment: Harbor's, with no-network as compose's network_mode none
        # (Harbor's own rejects no-network tasks without its Docker Hub sidecar) and images built once.
        from arl.harbor.docker_environment import DOCKER_IMPORT_PATH

        fields["environment_import_path"] = DOCKER_IMPORT_PATH
    fields["agent_kwargs"] = agent_kwargs
    fields["environment_kwargs"] = env_kwargs
    return fields


def _plain_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages as a template renders them: the OpenAI keys, tool call arguments parsed."""
    out = []
    for m in messages:
        if m.get("role") not in ("system", "user", "assistant", "tool"):
            continue
        msg: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                args = c["function"].get("arguments")
                if isinstance(args, str):
                    args = json.loads(args)
                calls.append(
                    {
                        "type": "function",
                        "id": c.get("id"),
                        "function": {"name": c["function"]["name"], "arguments": args},
                    }
                )
            msg["tool_calls"] = calls
        if m.get("tool_call_id"):
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def token_exact_problems(
    tokenizer: Any,
    calls: list[Any],
    segments: list[Any],
    sent_messages: list[dict[str, Any]] | None,
    tools: list[dict[str, Any]] | None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[str]:
    """What breaks token-exactness, [] when nothing does.

    - every token the engine sampled (`calls[i].output.token_ids`) is in exactly one segment with mask 1,
      in order, with its log prob; mask-0 tokens carry log prob 0.0;
    - each segment's prompt is the prompt of a generation call;
    - with `sent_messages` (the conversation as the agent sent it, from its own log): the prompt of call
      i is the chat template's rendering of the messages before the agent's i-th assistant turn.
    """
    problems: list[str] = []
    sampled = [t for c in calls for t in c.output.token_ids]
    logprobs = [lp for c in calls for lp in c.output.log_probs]
    seg_tokens = [t for s in segments for t, m in zip(s.response_ids, s.response_mask, strict=True) if m]
    seg_lps = [lp for s in segments for lp, m in zip(s.response_logprobs, s.response_mask, strict=True) if m]
    if seg_tokens != sampled:
        problems.append(f"mask-1 tokens ({len(seg_tokens)}) are not the sampled tokens ({len(sampled)})")
    elif seg_lps != logprobs:
        problems.append("mask-1 log probs differ from the sampled log probs")
    masked = [
        lp for s in segments for lp, m in zip(s.response_logprobs, s.response_mask, strict=True) if not m
    ]
    if any(lp != 0.0 for lp in masked):
        problems.append("a mask-0 token carries a non-zero log prob")
    prompts = [c.prompt_ids for c in calls]
    for i, s in enumerate(segments):
        if s.prompt_ids not in prompts:
            problems.append(f"segment {i}'s prompt is no generation call's prompt")
    if sent_messages is not None:
        messages = _plain_messages(sent_messages)
        starts = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        if len(starts) < len(calls):
            problems.append(
                f"the agent's log has {len(starts)} assistant turns for {len(calls)} generation calls"
            )
        for i, (call, k) in enumerate(zip(calls, starts, strict=False)):
            text = tokenizer.apply_chat_template(
                messages[:k],
                tools=tools or None,
                add_generation_prompt=True,
                tokenize=False,
                **(chat_template_kwargs or {}),
            )
            rendered = list(tokenizer.encode(text, add_special_tokens=False))
            if rendered != call.prompt_ids:
                first = next(
                    (j for j, (a, b) in enumerate(zip(rendered, call.prompt_ids)) if a != b),
                    min(len(rendered), len(call.prompt_ids)),
                )
                problems.append(
                    f"turn {i}: the prompt ({len(call.prompt_ids)} tokens) is not the rendering "
                    f"of the messages the agent sent ({len(rendered)} tokens; first difference "
                    f"at {first}: "
                    f"{tokenizer.decode(call.prompt_ids[first : first + 20])!r} vs "
                    f"{tokenizer.decode(rendered[first : first + 20])!r})"
                )
    return problems


def agent_messages(agent: str, trial_dir: Path) -> list[dict[str, Any]] | None:
    """The conversation as the agent itself logged it (None for agents that log none we can read)."""
    if agent == "shell":
        path = trial_dir / "agent" / "arl_shell_messages.json"
        return json.loads(path.read_text()) if path.is_file() else None
    if agent == "mini-swe-agent":
        path = trial_dir / "agent" / "mini-swe-agent.trajectory.json"
        return json.loads(path.read_text()).get("messages") if path.is_file() else None
    return None


async def run_check(
    task_dir: Path,
    *,
    agent: str,
    script: str,
    env: str,
    tokenizer: Any,
    trials_dir: Path,
    mini_venv: Path | None = None,
    task_id: str | None = None,
    trial_timeout_sec: float | None = None,
    config_overrides: dict[str, Any] | None = None,
    max_attempts: int = 1,
) -> CheckResult:
    """Runs `script` for `agent` on the SWE task at `task_dir` in `env` (see the module docstring)."""
    import msgspec

    from arl.harbor import HarborAgentLoop, HarborConfig
    from arl.proxy.testing import ScriptedGenerator
    from arl.proxy.types import SamplingParams
    from arl.rollout.types import Task

    task_dir = Path(task_dir)
    task_id = task_id or task_dir.name
    run_dir = Path(trials_dir) / f"{agent}-{script}-{env}-{task_id}"[:120]
    fields = harbor_config_fields(
        agent, env, trials_dir=run_dir, mini_venv=mini_venv, trial_timeout_sec=trial_timeout_sec
    )
    for key, value in (config_overrides or {}).items():  # kwargs dicts are merged, the rest replaced
        merge = key in ("agent_kwargs", "environment_kwargs") and isinstance(value, dict)
        fields[key] = {**fields.get(key, {}), **value} if merge else value
    fields["policy"] = {"max_attempts": max_attempts, "retry_backoff_sec": 0.0, **fields.get("policy", {})}
    config = msgspec.convert(fields, HarborConfig)
    generator = ScriptedGenerator(tokenizer, list(script_completions(agent, script, task_dir)))
    loop = HarborAgentLoop(config, tokenizer=tokenizer)
    task = Task(id=task_id, messages=[], agent="harbor", metadata={"harbor_task_path": str(task_dir)})
    started = time.monotonic()
    params = SamplingParams(max_tokens=4096, temperature=1.0)
    result = await loop.run(task, generator, params, f"check-{task_id}")
    wall = time.monotonic() - started
    trial_dirs = sorted(glob.glob(str(run_dir / "*" / "proxy" / "proxy_trajectory.json")))
    trial_dir = Path(trial_dirs[-1]).parent.parent if trial_dirs else None
    problems: list[str] = []
    if not result.failed and generator.calls:
        from arl.proxy.types import Segment

        segments = list(result.segments) or [
            Segment(
                prompt_ids=result.prompt_ids,
                response_ids=result.response_ids,
                response_mask=result.response_mask,
                response_logprobs=result.response_logprobs,
            )
        ]
        tools, sent = None, None
        if trial_dir is not None:
            recorded = json.loads((trial_dir / "proxy" / "proxy_trajectory.json").read_text())
            tools = recorded.get("tools")
            # The agent's own log where it keeps one (shell, mini-swe-agent), else the proxy's record of
            # the last request (terminus-2 keeps no message log).
            sent = agent_messages(agent, trial_dir) or recorded.get("messages")
        problems = token_exact_problems(
            tokenizer,
            generator.calls,
            segments,
            sent,
            tools,
            config.proxy_settings().get("chat_template_kwargs"),
        )
    reward = None if result.failed else result.reward
    return CheckResult(
        task_id=task_id,
        agent=agent,
        script=script,
        env=env,
        reward=reward,
        rewards=dict(result.rewards or {}),
        ok=expected_ok(script, reward) and not problems,
        failed=result.failed,
        failure_kind=result.failure_kind,
        error=result.error,
        num_turns=result.num_turns,
        generator_calls=len(generator.calls),
        segments=max(1, len(result.segments)) if generator.calls else 0,
        wall_s=wall,
        timings=dict(result.timings or {}),
        token_problems=problems,
        trial_dir=str(trial_dir or run_dir),
        retried="retried" in (result.timings or {}) and not result.failed,
    )
