"""`arl-proxy serve`: the standalone proxy in front of a running vLLM/SGLang server.

    arl-proxy serve --tokenizer PATH --upstream http://127.0.0.1:8000 [--tool-parser hermes]

Sessions are opened and trajectories fetched over HTTP (see the package README for the routes).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from arl.proxy.config import ProxyConfig
from arl.proxy.server import ChatProxy
from arl.proxy.upstream import UpstreamGenerator


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="arl-proxy", description="Token-exact OpenAI-compatible chat proxy.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve in front of a vLLM/SGLang /v1/completions server")
    s.add_argument("--tokenizer", required=True, help="tokenizer folder or hub id (with a chat template)")
    s.add_argument("--upstream", required=True, help="base URL of the engine, e.g. http://127.0.0.1:8000")
    s.add_argument("--upstream-model", default=None, help="model name at the upstream (default: its first)")
    s.add_argument("--upstream-api-key", default=None)
    s.add_argument("--tool-parser", default=None, choices=["hermes", "qwen3_coder", "llama3_json"])
    s.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0 to serve other hosts)")
    s.add_argument("--port", type=int, default=8100)
    s.add_argument("--api-key", default=None, help="require this bearer token on every request")
    s.add_argument("--model-name", default="arl-policy", help="model name the proxy reports")
    s.add_argument("--max-context-len", type=int, default=None)
    s.add_argument("--max-consecutive-no-tool", type=int, default=None)
    s.add_argument("--chat-template", default=None, help="file with a Jinja chat template to use instead")
    s.add_argument("--trajectory-root", default=None, help="write per-session debug JSON under this folder")
    s.add_argument("--incremental-check", default="window", choices=["window", "full"])
    return p


async def _serve(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    template = None
    if args.chat_template:
        with open(args.chat_template, encoding="utf-8") as f:
            template = f.read()
    config = ProxyConfig(
        host=args.host,
        port=args.port,
        tool_parser=args.tool_parser,
        api_key=args.api_key,
        model_name=args.model_name,
        max_context_len=args.max_context_len,
        max_consecutive_no_tool=args.max_consecutive_no_tool,
        chat_template=template,
        trajectory_root=args.trajectory_root,
        incremental_check=args.incremental_check,
        admin_routes=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with UpstreamGenerator(
        args.upstream, model=args.upstream_model, api_key=args.upstream_api_key
    ) as gen:
        async with ChatProxy(tokenizer, gen, config) as proxy:
            print(
                f"arl-proxy serving on {proxy.base_url} (upstream {gen.base_url}, model {gen.model})",
                flush=True,
            )
            await stop.wait()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
