"""Standalone mode: `arl-proxy serve` in front of a vLLM-style `/v1/completions` server, sessions over HTTP.

The upstream here is a stand-in for vLLM (token-id prompts, `return_token_ids`, completions-API log probs)
that samples with `ScriptedGenerator`; the proxy runs as its real CLI in a subprocess.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import aiohttp
from aiohttp import web
from arl_proxy_helpers import TOOLS, one_shot, qwen3_path
from openai import AsyncOpenAI

from arl.proxy import SamplingParams, UpstreamGenerator
from arl.proxy.testing import ScriptedGenerator


def fake_vllm(gen: ScriptedGenerator, seen: list[dict]) -> web.Application:
    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "upstream-model", "object": "model"}]})

    async def completions(request):
        body = await request.json()
        seen.append(body)
        assert isinstance(body["prompt"], list) and body["return_token_ids"] is True
        sp = SamplingParams(
            max_tokens=body["max_tokens"], stop_token_ids=body["stop_token_ids"], stop=body.get("stop", [])
        )
        out = await gen.generate(body.get("user", ""), body["prompt"], sp)
        return web.json_response(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "text": "",
                        "token_ids": out.token_ids,
                        "finish_reason": out.stop_reason,
                        "logprobs": {"tokens": [], "token_logprobs": out.log_probs, "top_logprobs": None},
                    }
                ],
            }
        )

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


async def serve_upstream(runner: web.AppRunner) -> int:
    """Start the stand-in upstream on a port the OS picks; returns the port."""
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner.addresses[0][1]


async def served_url(proc: asyncio.subprocess.Process, log: Path, timeout_s: float = 120.0) -> str:
    """The address `arl-proxy serve --port 0` prints once it listens (interpreter start + tokenizer load:
    slow on a busy 2-core CI machine)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        found = re.search(r"arl-proxy serving on (http://\S+)", log.read_text() if log.is_file() else "")
        if found:
            return found.group(1)
        assert proc.returncode is None, f"arl-proxy serve exited {proc.returncode}:\n{log.read_text()}"
        assert asyncio.get_running_loop().time() < deadline, (
            f"arl-proxy serve did not start:\n{log.read_text()}"
        )
        await asyncio.sleep(0.1)


async def test_upstream_generator(qwen3_tok):
    gen = ScriptedGenerator(qwen3_tok, ["Hi."])
    seen: list[dict] = []
    runner = web.AppRunner(fake_vllm(gen, seen))
    port = await serve_upstream(runner)
    try:
        async with UpstreamGenerator(f"http://127.0.0.1:{port}") as up:
            assert up.model == "upstream-model"
            out = await up.generate(
                "sess-1", [1, 2, 3], SamplingParams(max_tokens=9, stop_token_ids=[151645])
            )
        assert (
            out.token_ids == gen.calls[0].output.token_ids and out.log_probs == gen.calls[0].output.log_probs
        )
        assert out.stop_reason == "stop" and seen[0]["user"] == "sess-1" and seen[0]["prompt"] == [1, 2, 3]
    finally:
        await runner.cleanup()


async def test_cli_serve_end_to_end(qwen3_tok, tmp_path):
    gen = ScriptedGenerator(
        qwen3_tok,
        [
            '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>',
            "<think>\nok\n</think>\n\nTwo files.",
        ],
    )
    seen: list[dict] = []
    runner = web.AppRunner(fake_vllm(gen, seen))
    up_port = await serve_upstream(runner)
    log = tmp_path / "proxy.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "arl.proxy.cli",
            "serve",
            "--tokenizer",
            qwen3_path(),
            "--upstream",
            f"http://127.0.0.1:{up_port}",
            "--tool-parser",
            "hermes",
            "--port",
            "0",
            "--api-key",
            "k",
            "--trajectory-root",
            str(tmp_path),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    auth = {"Authorization": "Bearer k"}
    try:
        base = await served_url(proc, log)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            async with http.get(f"{base}/health") as r:
                assert r.status == 200
            async with http.post(f"{base}/sessions", headers=auth) as r:
                info = await r.json()
            assert info["base_url"] == f"{base}/sessions/{info['id']}/v1"
            client = AsyncOpenAI(base_url=info["base_url"], api_key="k", max_retries=0)
            messages = [{"role": "user", "content": "List files."}]
            r1 = await client.chat.completions.create(model="x", messages=messages, tools=TOOLS)
            messages.append(r1.choices[0].message.model_dump(exclude_none=True))
            messages.append(
                {"role": "tool", "tool_call_id": messages[-1]["tool_calls"][0]["id"], "content": "a\nb"}
            )
            r2 = await client.chat.completions.create(model="x", messages=messages, tools=TOOLS)
            messages.append(r2.choices[0].message.model_dump(exclude_none=True))
            async with http.get(f"{base}/sessions/{info['id']}/trajectory", headers=auth) as r:
                peek = await r.json()
            async with http.delete(f"{base}/sessions/{info['id']}", headers=auth) as r:
                traj = await r.json()
            async with http.delete(f"{base}/sessions/{info['id']}", headers=auth) as r:
                assert r.status == 404
        assert peek == traj
        assert traj["num_turns"] == 2 and traj["rebuilds"] == 0
        assert traj["prompt_ids"] + traj["response_ids"] == one_shot(qwen3_tok, messages, TOOLS)
        assert [t for t, m in zip(traj["response_ids"], traj["response_mask"]) if m] == (
            gen.calls[0].output.token_ids + gen.calls[1].output.token_ids
        )
        assert seen[0]["user"] == seen[1]["user"]  # one stable request id per session
        assert (tmp_path / info["id"] / "proxy_trajectory.json").is_file()
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
        await runner.cleanup()
