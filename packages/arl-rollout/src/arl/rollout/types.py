"""Wire types of arl-rollout: a task as read from a dataset, and one agent loop's result."""

from __future__ import annotations

from typing import Any

import msgspec

from arl.proxy.types import Segment


class Task(msgspec.Struct, kw_only=True):
    """One row of a dataset: what to ask, and what a verifier needs to score the answer.

    `messages` is an OpenAI-style chat (list of {"role", "content"} dicts). `reward_fn` names a
    verifier registered in `arl.rollout.rewards` (e.g. "digits"); agent loops that score by other means
    (a Harbor trial's verifier) ignore it. `agent` names the agent loop that runs the task.
    """

    id: str
    messages: list[dict[str, Any]]
    ground_truth: Any = None
    reward_fn: str = "exact"
    agent: str = "single_turn"
    # Task-specific inputs, e.g. {"harbor_task_path": "..."} for a Harbor trial.
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class AgentResult(msgspec.Struct, kw_only=True):
    """What one agent loop run produced: a token-exact trajectory and its reward.

    Field meanings match `arl.proxy.Trajectory` and `arl.queue.Response`; prompt_ids are kept per
    result because an agent may render the prompt itself (tools, system prompt).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    weight_versions: list[int]
    reward: float
    finish_reason: str = "stop"
    num_turns: int = 1
    rewards: dict[str, float] = msgspec.field(default_factory=dict)
    # MoE routing per response token (layers x top-k ids; [] where the trainer routes), None if not recorded.
    routed_experts: list[list[list[int]]] | None = None
    # Seconds per phase (e.g. "generate", "environment_setup", "verifier"), for metrics.
    timings: dict[str, float] = msgspec.field(default_factory=dict)
    # True when the agent could not produce a trainable trajectory (e.g. sandbox failed); not trained on.
    failed: bool = False
    error: str = ""
    # How the run ended when it did not end cleanly (e.g. "sandbox", "context_length"; "" = ok), so the
    # rollouter counts failed and zeroed trajectories by kind.
    failure_kind: str = ""
    # Every token-exact segment of the trajectory, in order, when the loop recorded them through arl-proxy
    # (the fields above are then the first one); [] = one segment, the fields above.
    segments: list[Segment] = msgspec.field(default_factory=list)
    # Tokens the engine sampled into the trajectory (None = the mask-1 tokens of the fields above).
    sampled_tokens: int | None = None
    # Tool calls the agent made, and times the proxy had to rebuild the token sequence (history rewritten).
    tool_calls: int = 0
    rebuilds: int = 0
    # Turns the proxy generated but did not record because the reply never reached the agent (it
    # disconnected mid-stream): nothing of them is in the trajectory; counted so a dashboard shows them.
    dropped_turns: int = 0
    # Signs of reward hacking the grading saw, by name, > 0 when seen (e.g. Harbor SWE trials:
    # "protected_touched", "leftover_processes", "change_refused", "agent_broke_verifier", "runner_tampered");
    # counted per trial, so a dashboard shows a policy drifting toward hacking before it succeeds.
    tells: dict[str, float] = msgspec.field(default_factory=dict)
