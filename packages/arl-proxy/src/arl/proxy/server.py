"""`ChatProxy`: the aiohttp server that speaks OpenAI chat completions and records token-exact trajectories.

Routes (every session's base URL is `http://HOST:PORT/sessions/<id>/v1`):

- `POST /sessions/{id}/v1/chat/completions`  chat completions (JSON or SSE with `stream: true`)
- `GET  /sessions/{id}/v1/models`, `GET /v1/models`  the served model
- `GET  /health`  liveness and the count of dropped turns (no auth)
- with `ProxyConfig.admin_routes` (the standalone server): `POST /sessions` opens a session,
  `GET /sessions/{id}/trajectory` reads its trajectory so far, `DELETE /sessions/{id}` pops it.

A turn is recorded only once its reply is delivered in full (JSON body, or every SSE chunk and `[DONE]`
written). A client gone earlier gets its generation aborted and its turn dropped: the session stays as it
was, so the agent may retry the turn, and the drop is counted (`ChatProxy.dropped_turns`,
`Trajectory.dropped_turns`) and logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
import os
import secrets
import socket
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from arl.proxy.chat import ChatCodec
from arl.proxy.completion import Reply, build_reply
from arl.proxy.config import ProxyConfig
from arl.proxy.disconnect import DisconnectWatcher, client_gone
from arl.proxy.errors import (
    ContextLengthError,
    GeneratorError,
    GeneratorTimeoutError,
    InvalidMessagesError,
    NotFoundError,
    ProxyError,
    RequestTooLargeError,
    SessionClosedError,
    UnauthorizedError,
    UnknownSessionError,
)
from arl.proxy.generator import Generator
from arl.proxy.messages import normalize_messages
from arl.proxy.openai_format import completion_body, logprobs_block, models_body, stream_chunks
from arl.proxy.request import ChatRequest, decode_chat_request
from arl.proxy.session import Session, new_session_id
from arl.proxy.tool_parsers import get_parser
from arl.proxy.trajectory import PromptPlan, TrajectoryBuilder, _write_json
from arl.proxy.types import SamplingParams, SessionInfo, TokenOutput, Trajectory

log = logging.getLogger(__name__)

_IO_TIMEOUT_S = 120.0  # reading a request body, writing a reply (a client that stops reading is gone)
_ABORT_WAIT_S = 10.0  # how long a cancelled (aborted) generate call may take to end


@dataclass(slots=True)
class TurnTiming:
    """What one turn cost inside the proxy (seconds): `overhead` is everything but waiting for the generator."""

    turn: int  # 1-based turn index within its session
    overhead: float
    tokenize: float
    generate: float
    prompt_tokens: int
    rebuilt: bool


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, content_type="application/json")


def _sse(payload: Any) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


def raise_gc_threshold(threshold: int) -> None:
    """Raise the garbage collector's first-generation threshold to `threshold` for the whole process (0, or
    a higher one already set, leaves it): fewer full collections, each a pause of every session
    (`ProxyConfig.gc_threshold`)."""
    first, second, third = gc.get_threshold()
    if threshold > first:
        gc.set_threshold(threshold, second, third)


class ChatProxy:
    """OpenAI-compatible chat endpoint in front of a `Generator`, one token-exact trajectory per session."""

    def __init__(self, tokenizer: Any, generator: Generator, config: ProxyConfig | None = None) -> None:
        self.config = config if config is not None else ProxyConfig()
        self.codec = ChatCodec(tokenizer, self.config.chat_template, self.config.extra_stop_token_ids)
        self.generator = generator
        self._parser = get_parser(self.config.tool_parser)
        limit = self.config.max_context_len
        if limit is None:
            mml = getattr(tokenizer, "model_max_length", None)
            limit = int(mml) if isinstance(mml, (int, float)) and 0 < mml < 10**8 else None
        self.max_context_len: int | None = limit
        if self.config.tokenize_threads < 0:
            raise ValueError(f"tokenize_threads must be >= 0, got {self.config.tokenize_threads}")
        if self.config.tokenize_inline_chars < 0:
            raise ValueError(f"tokenize_inline_chars must be >= 0, got {self.config.tokenize_inline_chars}")
        # Long texts are tokenized here, off the event loop (see `_encode`). Only a tokenizer that releases the
        # GIL gains from it: a slow one would hold the loop off as long as it ran inline, and add the hand-off.
        self._tokenize_pool = (
            ThreadPoolExecutor(self.config.tokenize_threads, thread_name_prefix="arl-proxy-tok")
            if self.config.tokenize_threads and self.codec.encode_releases_gil
            else None
        )
        self._sessions: dict[str, Session] = {}
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        # Per-turn timings, newest last (for benchmarks and monitoring).
        self.timings: deque[TurnTiming] = deque(maxlen=1_000_000)
        # Turns not recorded because the client was gone before their reply was delivered, all sessions.
        self.dropped_turns = 0
        self._watcher = DisconnectWatcher()

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind `config.host:config.port` (port 0 = any free port) and start serving."""
        if self._runner is not None:
            return
        raise_gc_threshold(self.config.gc_threshold)
        runner = web.AppRunner(self.build_app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        server = site._server  # aiohttp exposes the bound sockets only here
        sockets = getattr(server, "sockets", None) or []
        self._port = sockets[0].getsockname()[1] if sockets else self.config.port
        self._runner = runner

    async def stop(self) -> None:
        """Stop serving; open sessions stay readable with `pop_session`."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        await self._watcher.stop()

    async def _plan(
        self,
        builder: TrajectoryBuilder,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any],
    ) -> PromptPlan:
        """`builder.plan`, rendering on the event loop and tokenizing each text where `_encode` puts it."""
        steps = builder.plan_steps(messages, tools, template_kwargs)
        try:
            text = next(steps)
            while True:
                text = steps.send(await self._encode(text))
        except StopIteration as done:
            return done.value

    async def _encode(self, text: str) -> list[int]:
        """Token ids of `text`: a short text on the event loop, a long one in the tokenize pool.

        A turn's new messages (a few hundred tokens) tokenize in well under a millisecond, less than a hand-off
        to a thread costs. Handing every turn to threads that held the GIL (through 518b2cf) made the loop wait
        for them: 64 sessions x 30 turns on 2 cores took 17 ms of tokenization per turn instead of 0.35 ms.
        A long text (a resumed history's first render, a rebuild) would hold the loop for tens of ms; in the
        pool the tokenizer releases the GIL, so the loop serves other sessions meanwhile. Rendering stays on
        the loop: Jinja holds the GIL wherever it runs, and a 30k-token history renders in ~2 ms.
        """
        if self._tokenize_pool is None or len(text) < self.config.tokenize_inline_chars:
            return self.codec.encode(text)
        return await asyncio.get_running_loop().run_in_executor(self._tokenize_pool, self.codec.encode, text)

    async def __aenter__(self) -> ChatProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("ChatProxy.start() has not been awaited")
        return self._port

    @property
    def base_url(self) -> str:
        """`http://HOST:PORT` as agents should reach it."""
        host = self.config.advertise_host
        if host is None:
            host = self.config.host
            if host in ("0.0.0.0", "::", ""):
                try:
                    host = socket.gethostbyname(socket.gethostname())
                except OSError:
                    host = "127.0.0.1"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    # -- sessions --------------------------------------------------------------------------------
    def open_session(self, trajectory_dir: str | None = None) -> SessionInfo:
        """Open a session; its `base_url` is the OpenAI base URL the agent uses."""
        sid = new_session_id()
        builder = TrajectoryBuilder(
            self.codec, check=self.config.incremental_check, segmented=self.config.segments
        )
        self._sessions[sid] = Session(sid, builder, trajectory_dir)
        return SessionInfo(
            id=sid, base_url=f"{self.base_url}/sessions/{sid}/v1", trajectory_dir=trajectory_dir
        )

    def get_trajectory(self, session_id: str) -> Trajectory:
        """The trajectory of an open session so far (the session stays open)."""
        return self._session(session_id).builder.trajectory(session_id)

    def pop_session(self, session_id: str) -> Trajectory:
        """Close a session and return its trajectory (also written to `trajectory_dir` when given)."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise UnknownSessionError(f"no open session {session_id!r}")
        session.closed = True
        traj = session.builder.trajectory(session_id)
        if session.trajectory_dir:
            _write_json(
                os.path.join(session.trajectory_dir, "proxy_trajectory.json"), msgspec.to_builtins(traj)
            )
        return traj

    @property
    def session_ids(self) -> list[str]:
        return list(self._sessions)

    def _session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise UnknownSessionError(f"no open session {session_id!r}")
        return session

    # -- app -------------------------------------------------------------------------------------
    def build_app(self) -> web.Application:
        """The aiohttp application (for embedding in another server)."""
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=[self._middleware])
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/sessions/{sid}/v1/models", self._session_models)
        app.router.add_post("/sessions/{sid}/v1/chat/completions", self._chat)
        if self.config.admin_routes:
            app.router.add_post("/sessions", self._admin_open)
            app.router.add_get("/sessions/{sid}/trajectory", self._admin_get)
            app.router.add_delete("/sessions/{sid}", self._admin_pop)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            if request.path != "/health":
                self._check_auth(request)
            return await handler(request)
        except ProxyError as exc:
            return _json(exc.to_openai(), exc.status)
        except web.HTTPRequestEntityTooLarge:
            err = RequestTooLargeError(
                f"request body is over the limit of {self.config.max_body_bytes} bytes"
            )
            return _json(err.to_openai(), err.status)
        except web.HTTPException as exc:
            if exc.status >= 400:
                err = NotFoundError(f"{request.method} {request.path}: {exc.reason}")
                err.status = exc.status
                return _json(err.to_openai(), exc.status)
            raise
        except Exception as exc:  # a bug must not take the server or other sessions down
            log.exception("internal error on %s", request.path)
            err = ProxyError(f"internal error: {type(exc).__name__}: {exc}")
            return _json(err.to_openai(), 500)

    def _check_auth(self, request: web.Request) -> None:
        key = self.config.api_key
        if key is None:
            return
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise UnauthorizedError("missing or wrong bearer token")

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise RequestTooLargeError(
                f"request body of {request.content_length} bytes is over the limit of {limit} bytes"
            )
        async with asyncio.timeout(_IO_TIMEOUT_S):
            return await request.read()

    async def _health(self, request: web.Request) -> web.Response:
        return _json({"status": "ok", "sessions": len(self._sessions), "dropped_turns": self.dropped_turns})

    async def _models(self, request: web.Request) -> web.Response:
        return _json(models_body(self.config.model_name, self.max_context_len))

    async def _session_models(self, request: web.Request) -> web.Response:
        self._session(request.match_info["sid"])
        return await self._models(request)

    async def _admin_open(self, request: web.Request) -> web.Response:
        info = self.open_session()
        root = self.config.trajectory_root
        if root:
            self._sessions[info.id].trajectory_dir = info.trajectory_dir = os.path.join(root, info.id)
        return _json(msgspec.to_builtins(info))

    async def _admin_get(self, request: web.Request) -> web.Response:
        return _json(msgspec.to_builtins(self.get_trajectory(request.match_info["sid"])))

    async def _admin_pop(self, request: web.Request) -> web.Response:
        return _json(msgspec.to_builtins(self.pop_session(request.match_info["sid"])))

    # -- chat ------------------------------------------------------------------------------------
    def _sampling_params(self, req: ChatRequest, prompt_len: int) -> SamplingParams:
        limit = self.max_context_len
        room = limit - prompt_len if limit is not None else None
        max_tokens = req.requested_max_tokens or self.config.default_max_tokens or room or 16384
        if room is not None:
            max_tokens = min(max_tokens, room)
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=-1 if req.top_k is None else req.top_k,
            seed=req.seed,
            stop_token_ids=list(self.codec.stop_token_ids),
            stop=req.stop_list,
            top_logprobs=(req.top_logprobs or 0) if req.logprobs else 0,
        )

    async def _generate(self, session_id: str, prompt_ids: list[int], sp: SamplingParams) -> TokenOutput:
        try:
            async with asyncio.timeout(self.config.generate_timeout_s):
                out = await self.generator.generate(session_id, prompt_ids, sp)
        except TimeoutError:
            raise GeneratorTimeoutError(
                f"generator gave no answer within {self.config.generate_timeout_s} s"
            ) from None
        except ProxyError:
            raise
        except Exception as exc:
            raise GeneratorError(f"generator failed: {type(exc).__name__}: {exc}") from exc
        if len(out.log_probs) != len(out.token_ids):
            raise GeneratorError(
                f"generator returned {len(out.token_ids)} tokens but {len(out.log_probs)} log probs"
            )
        return out

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        t_start = time.perf_counter()
        session = self._session(request.match_info["sid"])
        req = decode_chat_request(await self._read_body(request))
        messages = normalize_messages(req.messages)
        if messages[-1]["role"] == "assistant":
            raise InvalidMessagesError(
                "the last message is an assistant message; continuing a reply is not supported",
                param=f"messages[{len(messages) - 1}]",
            )
        template_kwargs = {**self.config.chat_template_kwargs, **(req.chat_template_kwargs or {})}
        model = req.model or self.config.model_name
        completion_id = "chatcmpl-" + secrets.token_hex(12)
        async with session.lock:
            if session.closed:
                raise SessionClosedError(f"session ended: {session.closed_reason or 'closed'}")
            t0 = time.perf_counter()
            plan = await self._plan(session.builder, messages, req.tools, template_kwargs)
            t_tok = time.perf_counter() - t0
            turn_index = session.builder.num_turns + 1
            prompt_len = len(plan.prompt_ids)
            if self.max_context_len is not None and prompt_len >= self.max_context_len:
                raise ContextLengthError(
                    f"the prompt is {prompt_len} tokens, over the context limit of "
                    f"{self.max_context_len} tokens",
                    param="messages",
                )
            sp = self._sampling_params(req, prompt_len)
            stream: web.StreamResponse | None = None
            # The turn is recorded only once its whole reply is written; a client gone before that leaves the
            # session as it was, so the agent can retry the same turn. The commit follows the last write with
            # no await in between: nothing on this event loop (a `pop_session` after the agent got its reply,
            # the agent's next request) can run between delivery and commit.
            try:
                if req.stream:
                    stream = await self._open_stream(request, completion_id, model)
                t_gen0 = time.perf_counter()
                try:
                    out = await self._generate_while_connected(request, session.id, plan.prompt_ids, sp)
                except ProxyError as exc:
                    if stream is None:
                        raise
                    with contextlib.suppress(_ClientGone):
                        await self._stream_write(stream, _sse(exc.to_openai()) + b"data: [DONE]\n\n")
                    return stream
                t_gen = time.perf_counter() - t_gen0
                # On the loop: decoding a reply holds the GIL wherever it runs (16k tokens: ~1 ms).
                reply = build_reply(
                    self.codec, out, sp.stop, self._parser if req.tools_enabled else None, req.tools
                )
                logprobs = logprobs_block(self.codec, reply, sp.top_logprobs) if req.logprobs else None
                if stream is None:
                    body = completion_body(
                        completion_id=completion_id,
                        model=model,
                        reply=reply,
                        prompt_ids=plan.prompt_ids,
                        logprobs=logprobs,
                        return_token_ids=bool(req.return_token_ids),
                    )
                    response: web.StreamResponse = _json(body)
                    await self._send(request, response)
                    self._record(session, plan, reply, turn_index)
                else:
                    include_usage = bool(req.stream_options and req.stream_options.include_usage)
                    chunks = stream_chunks(
                        completion_id=completion_id,
                        model=model,
                        reply=reply,
                        prompt_ids=plan.prompt_ids,
                        logprobs=logprobs,
                        return_token_ids=bool(req.return_token_ids),
                        include_usage=include_usage,
                    )
                    payload = b"".join(_sse(c) for c in chunks) + b"data: [DONE]\n\n"
                    await self._stream_write(stream, payload)
                    self._record(session, plan, reply, turn_index)
                    response = stream
            except _ClientGone as gone:
                self._drop_turn(request, session, turn_index, str(gone))
                return (
                    stream if stream is not None else web.Response(status=499, reason="Client Closed Request")
                )
            except (
                asyncio.CancelledError
            ):  # a server with handler_cancellation cancels a lost client's handler
                self._drop_turn(
                    request,
                    session,
                    turn_index,
                    "the request handler was cancelled before the reply was delivered",
                )
                raise
        total = time.perf_counter() - t_start
        self.timings.append(TurnTiming(turn_index, total - t_gen, t_tok, t_gen, prompt_len, plan.rebuilt))
        return response

    async def _generate_while_connected(
        self, request: web.Request, session_id: str, prompt_ids: list[int], sp: SamplingParams
    ) -> TokenOutput:
        """`_generate`, aborted as soon as the client is gone: cancelling `Generator.generate` is the seam's
        abort (the engine stops decoding the request), awaited so no engine request outlives its turn."""
        if client_gone(request):
            raise _ClientGone("the client disconnected before generation")
        gen = asyncio.ensure_future(self._generate(session_id, prompt_ids, sp))
        gen.add_done_callback(_retrieve)
        gone = self._watcher.watch(request)
        try:
            await asyncio.wait((gen, gone), return_when=asyncio.FIRST_COMPLETED)
            if not gen.done():
                raise _ClientGone("the client disconnected during generation (generation aborted)")
            return gen.result()
        finally:
            self._watcher.unwatch(gone)
            if not gen.done():  # the client is gone, or this handler was cancelled
                gen.cancel()
                done, _ = await asyncio.wait((gen,), timeout=_ABORT_WAIT_S)
                if not done:
                    log.warning("the generator did not end an aborted request within %.0f s", _ABORT_WAIT_S)

    def _record(self, session: Session, plan: PromptPlan, reply: Reply, turn_index: int) -> None:
        """Commit a delivered turn to the session, on the event loop and at once (see `_chat`)."""
        try:
            session.builder.commit(
                plan, reply.turn, reply.canonical_message(), reply.finish_reason, session.trajectory_dir
            )
        except Exception:
            # The agent got a reply the trajectory cannot hold: end the session rather than record a wrong one.
            log.exception(
                "session %s…: recording delivered turn %d failed; session closed", session.id[:8], turn_index
            )
            session.closed = True
            session.closed_reason = f"internal error recording turn {turn_index}"
        else:
            self._after_turn(session, reply)

    def _drop_turn(self, request: web.Request, session: Session, turn_index: int, why: str) -> None:
        """A turn whose reply did not reach the client in full: the session stays as it was (the agent may
        retry the same turn); count it and say so."""
        session.builder.dropped_turns += 1
        self.dropped_turns += 1
        transport = request.transport
        if transport is not None and not transport.is_closing():
            transport.abort()  # the rest of this reply must not arrive: the agent may not see an unrecorded turn
        log.warning(
            "session %s…: turn %d not recorded: %s (dropped turns: %d in this session, %d in all)",
            session.id[:8],
            turn_index,
            why,
            session.builder.dropped_turns,
            self.dropped_turns,
        )

    def _after_turn(self, session: Session, reply: Reply) -> None:
        if reply.tool_calls:
            session.consecutive_no_tool = 0
            return
        session.consecutive_no_tool += 1
        limit = self.config.max_consecutive_no_tool
        if limit is not None and session.consecutive_no_tool >= limit:
            session.closed = True
            session.closed_reason = f"{limit} assistant turns in a row without a tool call"
            session.builder.finish_reason = "max_consecutive_no_tool"

    async def _open_stream(self, request: web.Request, completion_id: str, model: str) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await self._send(request, resp, eof=False)
        first = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        await self._stream_write(resp, _sse(first))
        return resp

    async def _send(self, request: web.Request, resp: web.StreamResponse, eof: bool = True) -> None:
        """Send `resp`'s headers (and with `eof`, its body and end) now rather than after the handler returns,
        so the turn is recorded only once it is out; `_ClientGone` if the client cannot take it."""
        try:
            async with asyncio.timeout(_IO_TIMEOUT_S):
                await resp.prepare(request)
                if eof:
                    await resp.write_eof()
        except (ConnectionError, TimeoutError) as exc:
            raise _ClientGone(f"the reply could not be sent ({type(exc).__name__}: {exc})") from None

    async def _stream_write(self, resp: web.StreamResponse, data: bytes) -> None:
        try:
            async with asyncio.timeout(_IO_TIMEOUT_S):
                await resp.write(data)
        except (ConnectionError, TimeoutError) as exc:
            raise _ClientGone(f"the stream could not be written ({type(exc).__name__}: {exc})") from None


class _ClientGone(Exception):
    """The client went away (or stopped reading) before its reply was delivered in full."""


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark an abandoned generation's outcome as seen (no 'exception was never retrieved' noise)."""
    if not task.cancelled():
        task.exception()
