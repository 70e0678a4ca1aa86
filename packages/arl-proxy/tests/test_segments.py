"""Segments: every sampled token trained exactly once when templates or agents rewrite earlier turns.

Five-turn tool sessions through the OpenAI SDK with scripted completions, on real templates: Qwen3 with
thinking off (the empty think block of each earlier turn disappears), Qwen3 with thinking on and a new user
message each turn (earlier reasoning disappears), agents that truncate earlier tool output each turn
(Qwen3, Qwen2.5, Llama 3.3), and sessions that never diverge (one segment, identical to segments off).
`check_segments` holds every segment against the engine's own record and the one-shot template rendering.
"""

from __future__ import annotations

import msgspec
import pytest
from arl_proxy_helpers import TOOLS, Agent, check_segments, divergences, sampled_tokens
from test_conformance import PARSER, answer_text, call_text, tool_msg

from arl.proxy.testing import Scripted

TURNS = 5
OFF = {"chat_template_kwargs": {"enable_thinking": False}}


async def _tool_session(
    agent: Agent,
    kind: str,
    *,
    think: bool,
    user_each_turn: bool = False,
    truncate_old_output: bool = False,
    extra_body=None,
    versions: bool = False,
) -> None:
    """A 5-turn tool session: 4 tool calls with results, then an answer."""
    agent.messages = [
        {"role": "system", "content": "You are a shell agent."},
        {"role": "user", "content": "Find the largest file."},
    ]
    for t in range(TURNS):
        reason = f"Step {t}: look closer." if think else None
        if t < TURNS - 1:
            text = call_text(
                kind, [("bash", {"cmd": f"ls -l dir{t}"})], "" if kind == "qwen3" else f"Step {t}.", reason
            )
        else:
            text = answer_text(kind, "The largest file is dir3/big.bin.", reason)
        await agent.turn(
            Scripted(text, weight_version=10 + t) if versions else text, tools=TOOLS, extra_body=extra_body
        )
        if t == TURNS - 1:
            break
        if truncate_old_output:  # an agent condensing its context: earlier tool output shortened
            for m in agent.messages:
                if m["role"] == "tool" and not m["content"].endswith("[truncated]"):
                    m["content"] = m["content"][:8] + " [truncated]"
        agent.messages.append(tool_msg(agent, f"-rw-r--r-- 1 u u {1000 * (t + 1)} big{t}.bin\n" * 3))
        if user_each_turn:
            agent.messages.append({"role": "user", "content": f"Good. Now check dir{t + 1}."})


async def test_qwen3_thinking_off_every_turn_diverges(qwen3_tok, make_agent):
    agent = await make_agent(qwen3_tok, tool_parser="hermes")
    await _tool_session(agent, "qwen3", think=False, extra_body=OFF)
    traj = agent.pop()
    assert divergences(agent.gen) == TURNS - 1  # each turn drops the previous turn's empty think block
    assert len(traj.segments) == TURNS and traj.rebuilds == TURNS - 1
    check_segments(traj, agent)
    # Each segment is one turn as the model saw it: its prompt ends with the empty think block.
    for seg in traj.segments:
        assert qwen3_tok.decode(seg.prompt_ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert traj.num_sampled == sum(len(c.output.token_ids) for c in agent.gen.calls)


async def test_qwen3_thinking_on_new_query_every_turn(qwen3_tok, make_agent):
    agent = await make_agent(qwen3_tok, tool_parser="hermes")
    await _tool_session(agent, "qwen3", think=True, user_each_turn=True)
    traj = agent.pop()
    assert divergences(agent.gen) == TURNS - 1  # each new query drops the reasoning of earlier turns
    assert len(traj.segments) == TURNS
    check_segments(traj, agent)
    # The reasoning the model produced is trained, each in the segment where it was sampled.
    for t, seg in enumerate(traj.segments):
        trained_text = qwen3_tok.decode(sampled_tokens(seg))
        assert f"Step {t}: look closer." in trained_text
        assert all(f"Step {u}: look closer." not in qwen3_tok.decode(seg.prompt_ids) for u in range(TURNS))


async def test_qwen3_thinking_on_tool_loop_is_one_segment(qwen3_tok, make_agent):
    """Within one query Qwen3 keeps the reasoning of the tool loop: no rewrite, one segment."""
    agent = await make_agent(qwen3_tok, tool_parser="hermes")
    await _tool_session(agent, "qwen3", think=True)
    traj = agent.pop()
    assert divergences(agent.gen) == 0 and traj.rebuilds == 0
    assert len(traj.segments) == 1
    check_segments(traj, agent)


@pytest.mark.parametrize(
    ("kind", "think"), [("qwen3", True), ("qwen3", False), ("qwen25", False), ("llama", False)]
)
async def test_agent_truncates_old_output_every_turn(
    kind, think, qwen3_tok, qwen25_tok, llama_tok, make_agent
):
    tok = {"qwen3": qwen3_tok, "qwen25": qwen25_tok, "llama": llama_tok}[kind]
    agent = await make_agent(tok, tool_parser=PARSER[kind])
    await _tool_session(
        agent,
        kind,
        think=think,
        truncate_old_output=True,
        extra_body=OFF if kind == "qwen3" and not think else None,
    )
    traj = agent.pop()
    # Turn 2 only appends; from turn 3 on the agent shortens the tool output it had appended before (with
    # Qwen3's thinking off, turn 2 diverges too: the empty think block of turn 1 is dropped).
    expected = TURNS - 1 if kind == "qwen3" and not think else TURNS - 2
    assert divergences(agent.gen) == expected
    assert len(traj.segments) == expected + 1
    check_segments(traj, agent)


@pytest.mark.parametrize("kind", ["qwen25", "llama"])
async def test_growing_session_is_one_segment_as_before(kind, qwen25_tok, llama_tok, make_agent):
    """Qwen2.5 and Llama 3.3 never rewrite a growing session: one segment, identical to segments off."""
    tok = {"qwen25": qwen25_tok, "llama": llama_tok}[kind]
    trajs = []
    for segments in (True, False):
        agent = await make_agent(tok, tool_parser=PARSER[kind], segments=segments)
        await _tool_session(agent, kind, think=False, versions=True)
        traj = agent.pop()
        assert divergences(agent.gen) == 0 and traj.rebuilds == 0
        assert len(traj.segments) == 1
        check_segments(traj, agent)
        trajs.append(traj)
    on, off = (msgspec.to_builtins(t) for t in trajs)
    for d in (on, off):  # session and tool-call ids are random
        d.pop("session_id")
        d.pop("messages")
    assert on == off
    seg = trajs[0].segments[0]
    assert seg.weight_versions == trajs[0].weight_versions
    assert sorted({v for v in seg.weight_versions if v >= 0}) == [10 + t for t in range(TURNS)]


async def test_versions_follow_their_segment(qwen3_tok, make_agent):
    agent = await make_agent(qwen3_tok, tool_parser="hermes")
    await _tool_session(agent, "qwen3", think=False, extra_body=OFF, versions=True)
    traj = agent.pop()
    check_segments(traj, agent)
    for t, seg in enumerate(traj.segments):
        assert seg.weight_versions is not None and len(seg.weight_versions) == len(seg.response_ids)
        assert [v for v, m in zip(seg.weight_versions, seg.response_mask) if m] == [10 + t] * seg.num_sampled
        assert all(v == -1 for v, m in zip(seg.weight_versions, seg.response_mask) if not m)


async def test_segments_off_loses_middle_turns(qwen3_tok, make_agent):
    """The same thinking-off session with segments off: only the last turn's tokens keep mask 1."""
    agent = await make_agent(qwen3_tok, tool_parser="hermes", segments=False)
    await _tool_session(agent, "qwen3", think=False, extra_body=OFF)
    traj = agent.pop()
    assert len(traj.segments) == 1
    assert sampled_tokens(traj) == agent.gen.calls[-1].output.token_ids
    assert traj.generated_tokens == sum(len(c.output.token_ids) for c in agent.gen.calls)
    assert traj.trained_share == len(agent.gen.calls[-1].output.token_ids) / traj.generated_tokens < 0.3


async def test_trajectory_json_round_trip(qwen3_tok, make_agent):
    agent = await make_agent(qwen3_tok, tool_parser="hermes")
    await _tool_session(agent, "qwen3", think=False, extra_body=OFF)
    traj = agent.pop()
    from arl.proxy import Trajectory

    again = msgspec.json.decode(msgspec.json.encode(traj), type=Trajectory)
    assert again == traj and len(again.segments) == TURNS


async def test_versions_reported_only_after_a_rewrite(qwen3_tok, make_agent):
    """A generator that starts reporting weight versions after the first segment closed: the earlier
    segment gets -1 per token (no version known), the later ones their versions."""
    agent = await make_agent(qwen3_tok, tool_parser="hermes")
    agent.messages = [{"role": "user", "content": "Say hi."}]
    await agent.turn("Hi!", extra_body=OFF)
    agent.messages.append({"role": "user", "content": "Again."})
    await agent.turn(Scripted("Hi again!", weight_version=2), extra_body=OFF)
    mid = agent.proxy.get_trajectory(agent.session.id)
    traj = agent.pop()
    assert mid.segments == traj.segments and len(traj.segments) == 2
    first, second = traj.segments
    assert first.weight_versions == [-1] * len(first.response_ids)
    assert [v for v, m in zip(second.weight_versions, second.response_mask) if m] == [2] * second.num_sampled
