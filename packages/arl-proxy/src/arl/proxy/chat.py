"""Rendering chat templates and tokenizing text exactly as `apply_chat_template` does, for any fast tokenizer.

`ChatCodec` wraps a Hugging Face tokenizer: it renders a conversation to text with the same Jinja
environment and variables as `tokenizer.apply_chat_template(..., tokenize=False)`, encodes text with
`add_special_tokens=False` (the rendered text already holds BOS, so no double BOS; with a fast tokenizer
through a call that releases the GIL, see `ChatCodec.encode`), and probes the
template once for its end-of-turn token and the text the template writes after it (the "EOS tail",
e.g. the `\\n` after `<|im_end|>`), which an engine stops before and the proxy backfills.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from arl.proxy.errors import TemplateRenderError

_PROBE_USER = "arl-probe-user-7f3a"
_PROBE_ASSISTANT = "arl-probe-assistant-7f3a"


def _compile(template: str) -> Any:
    """Compile with transformers' own cached environment; fall back to an identical one."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        return _compile_jinja_template(template)
    except ImportError:  # pragma: no cover - depends on the transformers version
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(
            x: Any,
            ensure_ascii: bool = False,
            indent: Any = None,
            separators: Any = None,
            sort_keys: bool = False,
        ) -> str:
            return json.dumps(
                x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
            )

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(template)


class ChatCodec:
    """Chat-template rendering and exact tokenization for one tokenizer (generic, not model specific)."""

    def __init__(
        self, tokenizer: Any, chat_template: str | None = None, extra_stop_token_ids: list[int] | None = None
    ) -> None:
        self.tokenizer = tokenizer
        template = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
        if isinstance(template, dict):  # some tokenizers keep named templates
            template = template.get("default") or next(iter(template.values()))
        if not isinstance(template, str) or not template:
            raise ValueError("the tokenizer has no chat template; pass ProxyConfig.chat_template")
        self.template_source = template
        self._template = _compile(template)
        self._special_vars = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        # HF tokenizers' batch calls run the Rust work with the GIL released (`encode` of one text holds it
        # throughout), and `encode_batch_fast` skips the character offsets `encode` computes and nothing here
        # reads: the same ids for ~30% less work (packages/arl-proxy/BENCHMARKS.md). A batch of one text.
        self._encode_batch = getattr(self._backend, "encode_batch_fast", None) or getattr(
            self._backend, "encode_batch", None
        )
        added = [t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values()]
        # Every added token is split out before BPE, so a cut right after one never changes tokenization.
        self.added_tokens: list[str] = sorted(set(added), key=len, reverse=True)
        self._added_re = re.compile("|".join(re.escape(t) for t in self.added_tokens)) if added else None
        self.eot_text, self.eot_id, self.eos_tail = self._probe()
        self.eos_tail_ids = self.encode(self.eos_tail) if self.eos_tail else []
        stop: list[int] = []
        for tid in [self.eot_id, getattr(tokenizer, "eos_token_id", None), *(extra_stop_token_ids or [])]:
            if isinstance(tid, int) and tid not in stop:
                stop.append(tid)
        # The template's end-of-turn token comes first: generators that append one stop token use it.
        self.stop_token_ids: list[int] = stop

    # -- rendering ---------------------------------------------------------------------------------
    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The text `apply_chat_template(messages, tools, add_generation_prompt, tokenize=False)` gives."""
        kwargs = {**self._special_vars, **(template_kwargs or {})}
        try:
            return self._template.render(
                messages=messages,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )
        except Exception as exc:  # jinja2 TemplateError, TypeError from the template, ...
            raise TemplateRenderError(f"chat template failed: {type(exc).__name__}: {exc}") from exc

    # -- tokens ------------------------------------------------------------------------------------
    @property
    def encode_releases_gil(self) -> bool:
        """Whether `encode` lets other threads run Python meanwhile (a fast tokenizer; a slow one holds the GIL)."""
        return self._encode_batch is not None

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` without added BOS/EOS (what apply_chat_template(tokenize=True) produces)."""
        if not text:
            return []
        if self._encode_batch is not None:
            return self._encode_batch([text], add_special_tokens=False)[0].ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`, without the tokenizer's space clean-up (so texts line up with rendered text)."""
        if not ids:
            return ""
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.tokenizer.decode(
            ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def token_text(self, token_id: int) -> str:
        """The text of one token (for OpenAI logprobs entries)."""
        return self.decode([token_id])

    def last_added_token_end(self, text: str, limit: int) -> int:
        """End offset of the last added (special) token that ends at or before `limit`, or 0."""
        if self._added_re is None:
            return 0
        end = 0
        for m in self._added_re.finditer(text, 0, limit):
            end = m.end()
        return end

    # -- probing -----------------------------------------------------------------------------------
    def _probe(self) -> tuple[str | None, int | None, str]:
        """Find the end-of-turn token of an assistant turn and the text the template writes after it."""
        convo = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_ASSISTANT}]
        try:
            text = self.render(convo, None, add_generation_prompt=False)
        except TemplateRenderError:
            text = ""
        at = text.rfind(_PROBE_ASSISTANT)
        if at >= 0 and self._added_re is not None:
            m = self._added_re.search(text, at + len(_PROBE_ASSISTANT))
            if m is not None:
                ids = self.encode(m.group(0))
                if len(ids) == 1:
                    return m.group(0), ids[0], text[m.end() :]
        eos = getattr(self.tokenizer, "eos_token", None)
        eos_id = getattr(self.tokenizer, "eos_token_id", None)
        return (eos if isinstance(eos, str) else None), (eos_id if isinstance(eos_id, int) else None), ""
