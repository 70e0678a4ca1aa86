"""Conformance against real templates and tokenizers: Qwen3 (hybrid thinking), Qwen2.5, Llama 3.3.

The ground truth is `tokenizer.apply_chat_template` of the final conversation, one shot. Every test drives
the proxy through the OpenAI SDK as an agent would, with scripted completions.
"""

from __future__ import annotations

import json
import os

import pytest
from arl_proxy_helpers import TOOLS, check_segments, check_trajectory, one_shot, sampled_tokens

from arl.proxy.testing import Scripted

PARSER = {"qwen3": "hermes", "qwen25": "hermes", "llama": "llama3_json"}


def call_text(kind: str, calls: list[tuple[str, dict]], content: str = "", think: str | None = None) -> str:
    """What the model would emit for `calls` in this family's format."""
    if kind == "llama":
        return ";".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
    body = "\n".join(
        f'<tool_call>\n{{"name": "{n}", "arguments": {json.dumps(a)}}}\n</tool_call>' for n, a in calls
    )
    text = (content + "\n" if content else "") + body
    return f"<think>\n{think}\n</think>\n\n{text}" if think is not None else text


def answer_text(kind: str, text: str, think: str | None = None) -> str:
    return f"<think>\n{think}\n</think>\n\n{text}" if think is not None and kind == "qwen3" else text


def tool_msg(agent, content: str, i: int = 0) -> dict:
    call = agent.messages[-1]["tool_calls"][i]
    return {"role": "tool", "tool_call_id": call["id"], "content": content}


def assert_exact(agent, traj, tools=None, **template_kwargs) -> None:
    """prompt + response equals the one-shot rendering; every turn's prompt was a prefix of it."""
    full = traj.prompt_ids + traj.response_ids
    assert full == one_shot(agent.proxy.codec.tokenizer, agent.messages, tools, **template_kwargs)
    check_trajectory(traj, agent.gen)


def assert_no_rebuild_turns(agent, traj) -> None:
    """Without rewrites, each turn's prompt + sampled tokens is a prefix of the final sequence, and the
    mask-1 tokens are exactly all sampled tokens."""
    full = traj.prompt_ids + traj.response_ids
    for call in agent.gen.calls:
        seen = call.prompt_ids + call.output.token_ids
        assert full[: len(seen)] == seen
    assert sampled_tokens(traj) == [t for c in agent.gen.calls for t in c.output.token_ids]
    assert traj.rebuilds == 0


async def test_single_turn(any_tok, make_agent):
    kind, tok = any_tok
    agent = await make_agent(tok, tool_parser=PARSER[kind])
    agent.messages = [
        {"role": "system", "content": "You are a helpful assistant.\n"},
        {"role": "user", "content": "Say hello.\n\n"},
    ]
    # Qwen3 in thinking mode always opens with a think block (its template renders one on the last turn).
    text = answer_text(kind, "Hello! How can I help you today?", "A greeting.")
    resp = await agent.turn(text)
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].message.content == text
    traj = agent.pop()
    assert traj.prompt_ids == one_shot(tok, agent.messages[:2], add_generation_prompt=True)
    assert traj.num_turns == 1 and traj.finish_reason == "stop"
    assert_exact(agent, traj)
    assert_no_rebuild_turns(agent, traj)
    # The end-of-turn tail the engine never emitted (Qwen: "\n" after <|im_end|>) is there with mask 0.
    tail = agent.proxy.codec.eos_tail_ids
    if tail:
        assert traj.response_ids[-len(tail) :] == tail and traj.response_mask[-len(tail) :] == [0] * len(tail)


@pytest.mark.parametrize("mode", ["window", "full"])
async def test_multi_turn_tool_use(any_tok, make_agent, mode):
    kind, tok = any_tok
    agent = await make_agent(tok, tool_parser=PARSER[kind], incremental_check=mode)
    think = "I need to look around first." if kind == "qwen3" else None
    agent.messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test in the repo."},
    ]
    r = await agent.turn(call_text(kind, [("bash", {"cmd": "ls -la"})], "Let me look.", think), tools=TOOLS)
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.tool_calls[0].function.name == "bash"
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"cmd": "ls -la"}
    agent.messages.append(tool_msg(agent, "total 8\nfoo.py\ntest_foo.py\n"))
    await agent.turn(
        call_text(kind, [("read_file", {"path": "foo.py", "limit": 20})], "", think), tools=TOOLS
    )
    agent.messages.append(tool_msg(agent, "def add(a, b):\n    return a - b\n\n"))
    await agent.turn(
        call_text(
            kind, [("bash", {"cmd": "sed -i 's/-/+/' foo.py && pytest -q"})], "The sign is wrong.", think
        ),
        tools=TOOLS,
    )
    agent.messages.append(tool_msg(agent, "1 passed in 0.01s."))
    await agent.turn(answer_text(kind, "Fixed: add() now adds.", think), tools=TOOLS)
    traj = agent.pop()
    assert traj.num_turns == 4 and traj.finish_reason == "stop"
    assert_exact(agent, traj, TOOLS)
    assert_no_rebuild_turns(agent, traj)


@pytest.mark.parametrize("kind", ["qwen3", "qwen25"])
async def test_parallel_calls_grouped_results(kind, qwen3_tok, qwen25_tok, make_agent):
    tok = qwen3_tok if kind == "qwen3" else qwen25_tok
    agent = await make_agent(tok, tool_parser="hermes")
    agent.messages = [{"role": "user", "content": "Read both files."}]
    r = await agent.turn(
        call_text(
            kind,
            [
                ("read_file", {"path": "a.py"}),
                ("read_file", {"path": "b.py"}),
                ("bash", {"cmd": "wc -l a.py b.py"}),
            ],
            "Reading both.",
        ),
        tools=TOOLS,
    )
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["read_file", "read_file", "bash"]
    assert len({c.id for c in calls}) == 3
    assert r.choices[0].message.content == "Reading both."
    agent.messages += [
        tool_msg(agent, "print('a')\n", 0),
        tool_msg(agent, "print('b')\n", 1),
        tool_msg(agent, "1 a.py\n1 b.py\n2 total", 2),
    ]
    await agent.turn(answer_text(kind, "Both files print one line.", "Easy."), tools=TOOLS)
    traj = agent.pop()
    assert_exact(agent, traj, TOOLS)
    assert_no_rebuild_turns(agent, traj)
    # The three tool results were one batch: one generation prompt between the two sampled turns.
    second_prompt = agent.gen.calls[1].prompt_ids
    assert tok.decode(second_prompt).count("<tool_response>") == 3


@pytest.mark.parametrize("kind", ["qwen3", "qwen25"])
async def test_content_none_vs_empty(kind, qwen3_tok, qwen25_tok, make_agent):
    tok = qwen3_tok if kind == "qwen3" else qwen25_tok
    results = []
    for echo in (None, ""):
        agent = await make_agent(tok, tool_parser="hermes")
        agent.messages = [{"role": "user", "content": "List files."}]
        r = await agent.turn(call_text(kind, [("bash", {"cmd": "ls"})]), tools=TOOLS)
        assert r.choices[0].message.content is None
        agent.messages[-1]["content"] = echo  # the agent echoes content as null or as ""
        agent.messages.append(tool_msg(agent, "a.txt"))
        agent.messages.append({"role": "user", "content": None})  # null user content renders as ""
        await agent.turn(answer_text(kind, "There is a.txt.", "One file."), tools=TOOLS)
        traj = agent.pop()
        assert_exact(agent, traj, TOOLS)
        assert_no_rebuild_turns(agent, traj)
        results.append(traj.prompt_ids + traj.response_ids)
    assert results[0] == results[1]


async def test_truncation_by_length(any_tok, make_agent):
    kind, tok = any_tok
    agent = await make_agent(tok, tool_parser=PARSER[kind])
    agent.messages = [{"role": "user", "content": "Tell me a long story."}]
    r = await agent.turn("Once upon a time there was a little robot who lived in a quiet lab", max_tokens=6)
    assert r.choices[0].finish_reason == "length"
    assert len(agent.gen.calls[0].output.token_ids) == 6
    agent.messages.append({"role": "user", "content": "Go on."})
    await agent.turn(answer_text(kind, "It learned to count.", "Continue the story."))
    traj = agent.pop()
    assert_exact(agent, traj)
    assert_no_rebuild_turns(agent, traj)
    # The end-of-turn token the truncated turn never sampled is backfilled with mask 0.
    first_end = len(agent.gen.calls[0].prompt_ids) - len(traj.prompt_ids) + 6
    eot = agent.proxy.codec.eot_id
    assert traj.response_ids[first_end] == eot and traj.response_mask[first_end] == 0


async def test_stop_strings(any_tok, make_agent):
    kind, tok = any_tok
    agent = await make_agent(tok, tool_parser=PARSER[kind])
    agent.messages = [{"role": "user", "content": "What is six times seven?"}]
    r = await agent.turn("The answer is 42.<END> and some text after", stop=["<END>"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == "The answer is 42."
    agent.messages.append({"role": "user", "content": "Thanks."})
    await agent.turn(answer_text(kind, "You are welcome.", "Polite."), stop=["<END>"])
    traj = agent.pop()
    assert_exact(agent, traj)
    check_trajectory(traj, agent.gen)
    assert traj.rebuilds == 0
    # The tokens of the stop string were sampled but are in no prompt: they are not in the trajectory.
    assert "<END>" not in tok.decode(traj.response_ids)


@pytest.mark.parametrize("segments", [True, False])
async def test_qwen3_thinking_off(segments, qwen3_tok, make_agent):
    kwargs = {"enable_thinking": False}
    agent = await make_agent(qwen3_tok, tool_parser="hermes", segments=segments)
    agent.messages = [{"role": "user", "content": "Say hi."}]
    await agent.turn("Hi!", extra_body={"chat_template_kwargs": kwargs})
    assert qwen3_tok.decode(agent.gen.calls[0].prompt_ids).endswith("<think>\n\n</think>\n\n")
    traj = agent.proxy.get_trajectory(agent.session.id)
    assert_exact(agent, traj, **kwargs)
    assert_no_rebuild_turns(agent, traj)
    assert len(traj.segments) == 1
    # A second turn: the template drops the empty think block of the earlier turn -> rebuilt, still exact.
    agent.messages.append({"role": "user", "content": "And bye."})
    await agent.turn("Bye!", extra_body={"chat_template_kwargs": kwargs})
    traj = agent.pop()
    assert traj.rebuilds == 1
    assert_exact(agent, traj, **kwargs)
    # The last segment (the flat fields) holds only the tokens sampled in the final context.
    assert sampled_tokens(traj) == agent.gen.calls[1].output.token_ids
    if segments:
        # Turn 1 is trained in its own segment, exactly as the model saw it (with the empty think block).
        assert len(traj.segments) == 2
        first = traj.segments[0]
        assert (
            first.prompt_ids + first.response_ids
            == agent.gen.calls[0].prompt_ids
            + agent.gen.calls[0].output.token_ids
            + agent.proxy.codec.eos_tail_ids
        )
        check_segments(traj, agent)
    else:
        # One sequence: turn 1's tokens are lost to training (mask 0 in the rebuilt text).
        assert len(traj.segments) == 1
        assert sum(s.num_sampled for s in traj.segments) == len(agent.gen.calls[1].output.token_ids)


async def test_qwen3_thinking_on_tool_loop_then_new_user_turn(qwen3_tok, make_agent, tmp_path):
    agent = await make_agent(qwen3_tok, tool_parser="hermes", trajectory_dir=str(tmp_path))
    agent.messages = [{"role": "user", "content": "How many files are there?"}]
    await agent.turn(call_text("qwen3", [("bash", {"cmd": "ls | wc -l"})], "", "Count them."), tools=TOOLS)
    agent.messages.append(tool_msg(agent, "3"))
    r = await agent.turn(answer_text("qwen3", "There are 3 files.", "The tool said 3."), tools=TOOLS)
    assert r.choices[0].message.content.startswith("<think>\nThe tool said 3.\n</think>")
    traj = agent.proxy.get_trajectory(agent.session.id)
    assert traj.rebuilds == 0  # reasoning inside one query's tool loop is kept by the template
    assert_exact(agent, traj, TOOLS)
    # A new user query: Qwen3's template drops the reasoning of the earlier turns -> rebuild.
    agent.messages.append({"role": "user", "content": "And how many lines?"})
    await agent.turn(answer_text("qwen3", "I cannot tell without a tool.", "No tool run yet."), tools=TOOLS)
    traj = agent.pop()
    assert traj.rebuilds == 1
    assert_exact(agent, traj, TOOLS)
    assert "Count them." not in qwen3_tok.decode(traj.response_ids)
    # Turn 1 kept its tokens up to where the rewritten text diverges (<think> is dropped at once, so none);
    # the last turn is fully sampled.
    assert (
        sampled_tokens(traj)[-len(agent.gen.calls[2].output.token_ids) :]
        == agent.gen.calls[2].output.token_ids
    )
    dumps = sorted(os.listdir(tmp_path))
    assert "rebuild_001.json" in dumps and "proxy_trajectory.json" in dumps
    debug = json.loads((tmp_path / "rebuild_001.json").read_text())
    assert debug["reason"] == "template rewrote earlier turns"
    assert len(debug["new_messages"]) == len(agent.messages) - 1
    # The tool loop (turns 1-2) is one segment, the new query another: all three turns trained once.
    assert len(traj.segments) == 2
    check_segments(traj, agent)


@pytest.mark.parametrize("segments", [True, False])
@pytest.mark.parametrize(
    "edit", ["edit_tool_result", "drop_message", "reorder", "change_tools", "edit_system"]
)
async def test_history_rewrite(edit, segments, any_tok, make_agent, tmp_path):
    kind, tok = any_tok
    agent = await make_agent(tok, tool_parser=PARSER[kind], trajectory_dir=str(tmp_path), segments=segments)
    agent.messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Inspect the repo."},
    ]
    await agent.turn(call_text(kind, [("bash", {"cmd": "ls"})], "Listing."), tools=TOOLS)
    agent.messages.append(tool_msg(agent, "a.py\nb.py"))
    await agent.turn(call_text(kind, [("read_file", {"path": "a.py"})]), tools=TOOLS)
    agent.messages.append(tool_msg(agent, "x = 1\n"))
    await agent.turn(call_text(kind, [("read_file", {"path": "b.py"})]), tools=TOOLS)
    agent.messages.append(tool_msg(agent, "y = 2\n"))
    tools = TOOLS
    m = agent.messages
    if edit == "edit_tool_result":  # messages: sys, user, a1, t1, a2, t2, a3, t3
        m[5] = {**m[5], "content": "x = 1  # (output truncated by the agent)\n"}
    elif edit == "drop_message":
        m.insert(2, {"role": "user", "content": "Be brief."})
        m.pop(3)  # drop the first assistant reply and its tool result (an agent condensing history)
        m.pop(3)
    elif edit == "reorder" and kind != "llama":
        m[3], m[5] = {**m[3], "content": m[5]["content"]}, {**m[5], "content": m[3]["content"]}
    elif edit == "reorder":  # Llama renders tool results without ids: swap two tool contents all the same
        m[3], m[5] = {**m[3], "content": m[5]["content"]}, {**m[5], "content": m[3]["content"]}
    elif edit == "change_tools":
        tools = TOOLS[:1] + [
            {"type": "function", "function": {**TOOLS[1]["function"], "description": "Read."}}
        ]
    elif edit == "edit_system":
        m[0] = {"role": "system", "content": "You are a careful coding agent."}
    await agent.turn(answer_text(kind, "Done inspecting.", "Enough."), tools=tools)
    traj = agent.pop()
    assert traj.rebuilds == 1
    assert_exact(agent, traj, tools)
    assert "rebuild_001.json" in os.listdir(tmp_path)
    last = agent.gen.calls[-1].output.token_ids
    assert sampled_tokens(traj)[-len(last) :] == last
    if segments:
        # Turns 1-3 in one segment, the rewritten last turn in another; every sampled token trained once.
        assert len(traj.segments) == 2
        check_segments(traj, agent)
        assert sampled_tokens(traj) == last
        return
    first = agent.gen.calls[0].output.token_ids
    if edit in ("edit_tool_result", "reorder"):
        # Edits after turn 1: turn 1's tokens keep mask 1 and their sampled log probs.
        assert sampled_tokens(traj)[: len(first)] == first
        lps = [lp for lp, mk in zip(traj.response_logprobs, traj.response_mask) if mk][: len(first)]
        assert lps == agent.gen.calls[0].output.log_probs
    if edit in ("edit_system", "change_tools", "drop_message"):
        # Everything the model sampled before the changed part is no longer in its context: mask 0.
        assert sampled_tokens(traj) == last


@pytest.mark.parametrize("segments", [True, False])
async def test_retry_resends_earlier_request(segments, qwen3_tok, make_agent):
    """An agent that retries a turn (drops the last reply and its tool result) keeps the shared prefix."""
    agent = await make_agent(qwen3_tok, tool_parser="hermes", segments=segments)
    agent.messages = [{"role": "user", "content": "Go."}]
    await agent.turn(call_text("qwen3", [("bash", {"cmd": "ls"})]), tools=TOOLS)
    agent.messages.append(tool_msg(agent, "a"))
    before = list(agent.messages)
    await agent.turn(call_text("qwen3", [("bash", {"cmd": "cat a"})]), tools=TOOLS)
    agent.messages = before  # retry turn 2
    await agent.turn(answer_text("qwen3", "Nothing to do.", "Retry."), tools=TOOLS)
    traj = agent.pop()
    assert traj.rebuilds == 1
    assert_exact(agent, traj, TOOLS)
    calls = agent.gen.calls
    if segments:
        # The abandoned turn 2 stays trained in the first segment; the retry starts the second one.
        assert len(traj.segments) == 2
        check_segments(traj, agent)
        assert sampled_tokens(traj) == calls[2].output.token_ids
    else:
        assert sampled_tokens(traj) == calls[0].output.token_ids + calls[2].output.token_ids


@pytest.mark.parametrize("segments", [True, False])
async def test_resumed_history(segments, any_tok, make_agent):
    """A first request that already holds earlier turns (a resumed conversation) is tokenized whole, exactly as
    one shot; with segments, later turns then render the prompt, the last turn and the new messages only, not
    the whole history again."""
    kind, tok = any_tok
    agent = await make_agent(tok, tool_parser=PARSER[kind], segments=segments)
    agent.messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test in the repo."},
    ]
    for k in range(6):
        call = {
            "id": f"call_{k}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"cmd": f"grep -rn f_{k} src/"})},
        }
        agent.messages += [
            {"role": "assistant", "content": f"Looking at part {k}.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{k}", "content": f"src/m{k}.py: def f_{k}(): ..."},
        ]
    resumed = len(agent.messages)
    codec, rendered = agent.proxy.codec, []
    render = codec.render
    codec.render = lambda messages, *args: rendered.append(len(messages)) or render(messages, *args)
    think = "Next step." if kind == "qwen3" else None
    await agent.turn(
        call_text(kind, [("bash", {"cmd": "pytest -q"})], "Running the tests.", think), tools=TOOLS
    )
    first_renders, rendered[:] = list(rendered), []
    agent.messages.append(tool_msg(agent, "1 failed"))
    await agent.turn(call_text(kind, [("read_file", {"path": "src/m0.py"})], "", think), tools=TOOLS)
    agent.messages.append(tool_msg(agent, "def f_0(): return 1"))
    await agent.turn(answer_text(kind, "Found it.", think), tools=TOOLS)
    traj = agent.pop()
    assert agent.gen.calls[0].prompt_ids == one_shot(
        tok, agent.messages[:resumed], TOOLS, add_generation_prompt=True
    )
    assert_exact(agent, traj, TOOLS)
    assert_no_rebuild_turns(agent, traj)
    assert first_renders[0] == resumed
    if segments:
        assert len(traj.segments) == 1 and max(rendered) == 2 + 1 + 1  # prompt, last reply, new tool result
    else:
        assert max(rendered) > resumed


async def test_llama_single_bos(llama_tok, make_agent):
    agent = await make_agent(llama_tok, tool_parser="llama3_json")
    agent.messages = [{"role": "user", "content": "Hi."}]
    await agent.turn("Hello.")
    agent.messages.append({"role": "user", "content": "Bye."})
    await agent.turn("Goodbye.")
    traj = agent.pop()
    bos = llama_tok.bos_token_id
    assert traj.prompt_ids[0] == bos
    assert (traj.prompt_ids + traj.response_ids).count(bos) == 1
    assert all(c.prompt_ids.count(bos) == 1 for c in agent.gen.calls)
    # Llama 3 ends turns with <|eot_id|>, not the tokenizer's eos <|end_of_text|>; nothing follows it.
    assert agent.proxy.codec.eot_text == "<|eot_id|>" and agent.proxy.codec.eos_tail == ""
    assert agent.gen.calls[0].output.token_ids[-1] == llama_tok.convert_tokens_to_ids("<|eot_id|>")
    assert_exact(agent, traj)


async def test_llama_parallel_calls_are_a_template_error(llama_tok, make_agent):
    agent = await make_agent(llama_tok, tool_parser="llama3_json")
    agent.messages = [{"role": "user", "content": "Two things."}]
    await agent.turn(call_text("llama", [("bash", {"cmd": "ls"}), ("bash", {"cmd": "pwd"})]), tools=TOOLS)
    assert len(agent.messages[-1]["tool_calls"]) == 2
    agent.messages += [tool_msg(agent, "a", 0), tool_msg(agent, "/", 1)]
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        await agent.turn("x", tools=TOOLS)
    assert "single tool-calls" in str(err.value)


async def test_max_consecutive_no_tool(qwen3_tok, make_agent):
    import openai

    agent = await make_agent(qwen3_tok, tool_parser="hermes", max_consecutive_no_tool=2)
    agent.messages = [{"role": "user", "content": "Work."}]
    await agent.turn("Thinking about it.", tools=TOOLS)
    agent.messages.append({"role": "user", "content": "Use a tool."})
    await agent.turn(call_text("qwen3", [("bash", {"cmd": "ls"})]), tools=TOOLS)  # resets the count
    agent.messages.append(tool_msg(agent, "a"))
    await agent.turn("Still thinking.", tools=TOOLS)
    agent.messages.append({"role": "user", "content": "Go on."})
    await agent.turn("Hmm.", tools=TOOLS)  # second in a row: the session ends after this reply
    agent.messages.append({"role": "user", "content": "Go on."})
    with pytest.raises(openai.APIStatusError) as err:
        await agent.turn("never generated", tools=TOOLS)
    assert err.value.status_code == 409 and "session_closed" in str(err.value.body)
    traj = agent.pop()
    assert traj.num_turns == 4 and traj.finish_reason == "max_consecutive_no_tool"


async def test_weight_versions_and_routed_experts(qwen3_tok, make_agent):
    agent = await make_agent(qwen3_tok)
    agent.messages = [{"role": "user", "content": "Hi."}]
    await agent.turn(Scripted("Hello.", weight_version=3, routed_experts=True))
    agent.messages.append({"role": "user", "content": "Again."})
    await agent.turn(Scripted("Hello again.", weight_version=4, routed_experts=True))
    traj = agent.pop()
    assert traj.weight_versions is not None and traj.routed_experts is not None
    assert len(traj.weight_versions) == len(traj.response_ids) == len(traj.routed_experts)
    for m, v, e in zip(traj.response_mask, traj.weight_versions, traj.routed_experts):
        assert (v in (3, 4) and len(e) == 2) if m else (v == -1 and e == [])
    assert [v for v, m in zip(traj.weight_versions, traj.response_mask) if m] == (
        [3] * len(agent.gen.calls[0].output.token_ids) + [4] * len(agent.gen.calls[1].output.token_ids)
    )
