"""Tokenizer handling is generic: a tiny byte-level BPE with ChatML special tokens, as the rollout side uses."""

from __future__ import annotations

from arl_proxy_helpers import check_trajectory, one_shot


async def test_tiny_chatml_tokenizer(tiny_tok, make_agent):
    agent = await make_agent(tiny_tok)
    codec = agent.proxy.codec
    assert codec.eot_text == "<|im_end|>" and codec.eos_tail == "\n"
    # The template's end-of-turn token is the first stop token; the tokenizer's EOS is a stop token too.
    assert codec.stop_token_ids[0] == tiny_tok.convert_tokens_to_ids("<|im_end|>")
    assert tiny_tok.eos_token_id in codec.stop_token_ids
    agent.messages = [
        {"role": "system", "content": "Hello world."},
        {"role": "user", "content": "The agent runs ls.\n\n"},
    ]
    await agent.turn("Done! The agent runs cat.")
    agent.messages.append({"role": "user", "content": "Hello world.\n"})
    await agent.turn("Done.")
    traj = agent.pop()
    assert traj.prompt_ids + traj.response_ids == one_shot(tiny_tok, agent.messages)
    assert traj.rebuilds == 0
    check_trajectory(traj, agent.gen)
