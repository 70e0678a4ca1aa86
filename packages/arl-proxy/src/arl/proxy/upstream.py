"""`UpstreamGenerator`: a `Generator` that forwards token ids to a running vLLM/SGLang `/v1/completions`.

The prompt goes as token ids (`"prompt": [ids]`), and the sampled token ids come back through vLLM's
`return_token_ids` (`choices[0].token_ids`) with their log probs (`choices[0].logprobs.token_logprobs`),
so nothing is decoded and re-encoded on the way. `request_id` is sent as the `X-Request-Id` header and
as `user`, so a load balancer in front can keep a session on one replica.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from arl.proxy.errors import GeneratorError
from arl.proxy.types import SamplingParams, TokenOutput

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


class UpstreamGenerator:
    """Forwards generation to an OpenAI-compatible completions server that accepts token-id prompts."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 1800.0,
        connect_timeout_s: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the HTTP client and, when no model was named, take the first one the server lists."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
        if self.model is None:
            async with asyncio.timeout(self._timeout.total or 60):
                async with self._session.get(f"{self.base_url}/models") as resp:
                    if resp.status != 200:
                        raise GeneratorError(f"upstream /models answered {resp.status}: {await resp.text()}")
                    data = await resp.json()
            self.model = data["data"][0]["id"]

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def __aenter__(self) -> UpstreamGenerator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def payload(self, prompt_ids: list[int], sp: SamplingParams) -> dict[str, Any]:
        """The `/v1/completions` request body for one generation."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt_ids,
            "max_tokens": sp.max_tokens,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "logprobs": max(1, sp.top_logprobs),
            "return_token_ids": True,
            "stop_token_ids": sp.stop_token_ids,
            "skip_special_tokens": False,
            "include_stop_str_in_output": False,
        }
        if sp.top_k > 0:
            body["top_k"] = sp.top_k
        if sp.seed is not None:
            body["seed"] = sp.seed
        if sp.stop:
            body["stop"] = sp.stop
        return body

    @staticmethod
    def parse(data: dict[str, Any], top_logprobs: int) -> TokenOutput:
        """A TokenOutput from a `/v1/completions` response."""
        try:
            choice = data["choices"][0]
            ids = [int(t) for t in choice["token_ids"]]
            lp_block = choice.get("logprobs") or {}
            lps = [float(x) if x is not None else 0.0 for x in (lp_block.get("token_logprobs") or [])]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise GeneratorError(
                f"upstream response lacks token ids/log probs ({exc!r}); does the server "
                "support return_token_ids?"
            ) from None
        if len(lps) != len(ids):
            lps = (lps + [0.0] * len(ids))[: len(ids)]
        reason = _FINISH.get(choice.get("finish_reason") or "stop", "stop")
        return TokenOutput(token_ids=ids, log_probs=lps, stop_reason=reason)  # type: ignore[arg-type]

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams
    ) -> TokenOutput:
        if self._session is None:
            await self.start()
        assert self._session is not None
        body = self.payload(prompt_ids, sampling_params)
        body["user"] = request_id
        async with asyncio.timeout(self._timeout.total):
            async with self._session.post(
                f"{self.base_url}/completions", json=body, headers={"X-Request-Id": request_id}
            ) as resp:
                if resp.status != 200:
                    raise GeneratorError(f"upstream answered {resp.status}: {(await resp.text())[:500]}")
                data = await resp.json()
        return self.parse(data, sampling_params.top_logprobs)
