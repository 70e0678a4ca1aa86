"""The token-exact trajectory of one session: incremental tokenization, EOS-tail backfill, rebuilds.

A trajectory is a list of segments, each a piece of the rendered conversation text with its token ids:
template segments (prompt, tool/user messages, generation prompts, backfilled tails; mask 0) and sampled
segments (exactly the tokens the engine sampled; mask 1 with their log probs). Segment texts joined give
the text the template renders for the conversation, and every cut between segments lies right after an
added (special) token or at a turn boundary, so tokenizing the pieces equals tokenizing the whole.

Per request, `plan()` either extends the sequence (the agent only appended messages: render, check the
already-recorded text is a prefix of the rendering, tokenize only the new text) or rebuilds it (history
was rewritten: render the whole conversation, keep old segments whose text still matches and, at the
first difference, the tokens shared with the old sequence, with their mask and log probs; everything after
that is template text with mask 0). `commit()` then appends the sampled tokens and, when the engine stopped
on the end-of-turn token, the template's tail after it (mask 0).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from arl.proxy.chat import ChatCodec
from arl.proxy.types import Trajectory


@dataclass(slots=True)
class Segment:
    """A piece of the conversation text and its tokens; `mask[i] == 1` only for sampled tokens."""

    text: str
    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    versions: list[int] | None = None
    experts: list[list[list[int]]] | None = None

    @property
    def sampled(self) -> bool:
        return any(self.mask)

    @classmethod
    def template(cls, text: str, ids: list[int]) -> Segment:
        n = len(ids)
        return cls(text, ids, [0] * n, [0.0] * n)


@dataclass(slots=True)
class PromptPlan:
    """What one request adds to the trajectory before generation; applied by `commit` once it succeeds."""

    keep: int  # how many existing segments stay
    new: list[Segment]  # segments appended after them (the prompt's new part)
    prompt_ids: list[int]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    template_kwargs: dict[str, Any]
    rebuilt: bool
    head: tuple[list[dict[str, Any]], bool] | None = None  # new (head messages, window usable)
    debug: dict[str, Any] | None = None


@dataclass(slots=True)
class SampledTurn:
    """The tokens one generation contributes to the trajectory."""

    ids: list[int]
    logprobs: list[float]
    ended_on_eot: bool  # the engine stopped on the template's end-of-turn token: backfill the tail
    versions: list[int] | None = None
    experts: list[list[list[int]]] | None = None


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n
    while lo < hi:  # binary search on slices compares in C
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class TrajectoryBuilder:
    """Incrementally builds the token-exact sequence of one session (not thread-safe; one turn at a time)."""

    codec: ChatCodec
    check: Literal["window", "full"] = "window"
    segments: list[Segment] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    snapshot: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    head: list[dict[str, Any]] = field(default_factory=list)  # messages rendered as segments[0]
    window_ok: bool = False
    last_sampled: int = -1  # index of the sampled segment of the snapshot's last (assistant) message
    rebuilds: int = 0
    num_turns: int = 0
    finish_reason: str | None = None
    saw_versions: bool = False
    saw_experts: bool = False

    # -- planning ----------------------------------------------------------------------------------
    def plan(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
             template_kwargs: dict[str, Any]) -> PromptPlan:
        """Work out the prompt for `messages` without changing the builder."""
        if not self.segments:
            text = self.codec.render(messages, tools, True, template_kwargs)
            seg = Segment.template(text, self.codec.encode(text))
            return PromptPlan(0, [seg], list(seg.ids), messages, tools, template_kwargs, False,
                              head=(messages, True))
        n = len(self.snapshot)
        appended = (
            len(messages) > n
            and tools == self.tools
            and template_kwargs == self.template_kwargs
            and messages[:n] == self.snapshot
        )
        if appended:
            plan = self._extend(messages, tools, template_kwargs)
            if plan is not None:
                return plan
        return self._rebuild(messages, tools, template_kwargs, appended)

    def _extend(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                template_kwargs: dict[str, Any]) -> PromptPlan | None:
        delta = messages[len(self.snapshot):]
        if self.check == "window" and self.window_ok and self.last_sampled > 0:
            window = [*self.head, self.snapshot[-1], *delta]
            rendered = self.codec.render(window, tools, True, template_kwargs)
            recorded = self.segments[0].text + "".join(s.text for s in self.segments[self.last_sampled:])
        else:
            rendered = self.codec.render(messages, tools, True, template_kwargs)
            recorded = "".join(s.text for s in self.segments)
        if not rendered.startswith(recorded):
            return None
        new_text = rendered[len(recorded):]
        keep = len(self.segments)
        if not self.segments[-1].sampled:  # a backfilled tail: tokenize it together with what follows
            keep -= 1
            new_text = self.segments[-1].text + new_text
        seg = Segment.template(new_text, self.codec.encode(new_text))
        dropped = sum(len(s.ids) for s in self.segments[keep:])
        prompt_ids = self.ids[: len(self.ids) - dropped] + seg.ids
        return PromptPlan(keep, [seg], prompt_ids, messages, tools, template_kwargs, False)

    def _rebuild(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 template_kwargs: dict[str, Any], appended: bool) -> PromptPlan:
        codec = self.codec
        text = codec.render(messages, tools, True, template_kwargs)
        # 1. Old segments whose text is still there, in order; a template segment is kept only as the
        #    prompt or before a kept sampled segment (so the re-tokenized rest starts after a cut that
        #    the one-shot tokenization also has).
        pos, kept = 0, 0
        for seg in self.segments:
            if not text.startswith(seg.text, pos):
                break
            pos += len(seg.text)
            kept += 1
        while kept > 1 and not self.segments[kept - 1].sampled:
            kept -= 1
            pos -= len(self.segments[kept].text)
        new: list[Segment] = []
        head: tuple[list[dict[str, Any]], bool] | None = None
        if kept == 0:
            # 2. The prompt itself changed: the new prompt is the messages before the first assistant turn.
            first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
            head_msgs = messages[:first]
            head_text = codec.render(head_msgs, tools, True, template_kwargs) if head_msgs else ""
            if head_text and text.startswith(head_text):
                prompt_text, window_ok = head_text, True
            else:
                # The template renders the generation prompt differently inside the conversation (e.g. Qwen3
                # without thinking drops the empty think block of earlier turns): end the prompt with the
                # head's last message, else right after the last special token both renderings share.
                closed = codec.render(head_msgs, tools, False, template_kwargs) if head_msgs else ""
                if closed and text.startswith(closed):
                    cut = len(closed)
                else:
                    cut = codec.last_added_token_end(text, _common_prefix_len(text, head_text))
                prompt_text, window_ok = (text[:cut] if cut else text), False
            new.append(Segment.template(prompt_text, codec.encode(prompt_text)))
            pos = len(prompt_text)
            head = (head_msgs, window_ok)
        # 3. The rest as one batch (the tokenizer splits at special tokens, so this equals tokenizing
        #    prompt, assistant turns and runs of tool/user messages one by one); the tokens it shares with
        #    the old sequence right where they diverge keep their mask and log probs.
        rest = text[pos:]
        rest_ids = codec.encode(rest)
        offset = sum(len(s.ids) for s in self.segments[:kept])
        shared = self._shared_sampled_prefix(rest, rest_ids, kept, offset) if kept else None
        if shared is not None:
            new.append(shared)
            rest = rest[len(shared.text):]
            rest_ids = rest_ids[len(shared.ids):]
        if rest or not new:
            new.append(Segment.template(rest, rest_ids))
        kept_ids = self.ids[:offset]
        prompt_ids = kept_ids + [t for s in new for t in s.ids]
        debug = self._debug(messages, tools, template_kwargs, text, appended, kept)
        return PromptPlan(kept, new, prompt_ids, messages, tools, template_kwargs, True, head=head, debug=debug)

    def _shared_sampled_prefix(self, rest: str, rest_ids: list[int], kept: int, offset: int) -> Segment | None:
        """Tokens at the divergence point that equal the old ones (same ids, same context) and were sampled."""
        old_ids = self.ids[offset:]
        c = 0
        limit = min(len(old_ids), len(rest_ids))
        while c < limit and old_ids[c] == rest_ids[c]:
            c += 1
        if c == 0:
            return None
        mask, lps, vers, exps = self._flat_from(kept, c)
        if not any(mask):
            return None
        while c > 0:  # the piece's text must be an exact prefix of the rest (no split UTF-8 character)
            piece = self.codec.decode(rest_ids[:c])
            if rest.startswith(piece):
                break
            c -= 1
        if c == 0 or not any(mask[:c]):
            return None
        return Segment(piece, rest_ids[:c], mask[:c], lps[:c], vers[:c] if vers is not None else None,
                       exps[:c] if exps is not None else None)

    def _flat_from(self, first: int, count: int) -> tuple[list[int], list[float], list[int] | None, Any]:
        mask: list[int] = []
        lps: list[float] = []
        vers: list[int] = []
        exps: list[list[list[int]]] = []
        for seg in self.segments[first:]:
            if len(mask) >= count:
                break
            mask += seg.mask
            lps += seg.logprobs
            vers += seg.versions if seg.versions is not None else [-1] * len(seg.ids)
            exps += seg.experts if seg.experts is not None else [[] for _ in seg.ids]
        return (mask[:count], lps[:count], vers[:count] if self.saw_versions else None,
                exps[:count] if self.saw_experts else None)

    def _debug(self, messages: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any], text: str,
               appended: bool, kept: int) -> dict[str, Any]:
        old_text = "".join(s.text for s in self.segments)
        at = _common_prefix_len(old_text, text)
        first_diff = next((i for i, (a, b) in enumerate(zip(self.snapshot, messages)) if a != b),
                          min(len(self.snapshot), len(messages)))
        return {
            "time": time.time(),
            "reason": "template rewrote earlier turns" if appended else "messages or tools changed",
            "tools_changed": tools != self.tools,
            "template_kwargs_changed": kwargs != self.template_kwargs,
            "first_differing_message": first_diff,
            "old_messages": self.snapshot,
            "new_messages": messages,
            "text_diverges_at": at,
            "old_text_from_divergence": old_text[at: at + 2000],
            "new_text_from_divergence": text[at: at + 2000],
            "segments_kept": kept,
            "old_num_tokens": len(self.ids),
        }

    # -- committing --------------------------------------------------------------------------------
    def commit(self, plan: PromptPlan, turn: SampledTurn, assistant: dict[str, Any], finish_reason: str,
               trajectory_dir: str | None = None) -> None:
        """Apply `plan` and append the sampled tokens (and the backfilled tail) of one generation."""
        if plan.rebuilt:
            self.rebuilds += 1
            if trajectory_dir and plan.debug is not None:
                _write_json(os.path.join(trajectory_dir, f"rebuild_{self.rebuilds:03d}.json"), plan.debug)
        if plan.head is not None:
            self.head, self.window_ok = plan.head
        del self.segments[plan.keep:]
        self.segments.extend(plan.new)
        self.ids = plan.prompt_ids
        n = len(turn.ids)
        if turn.versions is not None:
            self.saw_versions = True
        if turn.experts is not None:
            self.saw_experts = True
        sampled = Segment(self.codec.decode(turn.ids), list(turn.ids), [1] * n, list(turn.logprobs),
                          list(turn.versions) if turn.versions is not None else None,
                          list(turn.experts) if turn.experts is not None else None)
        self.segments.append(sampled)
        self.last_sampled = len(self.segments) - 1
        self.ids = self.ids + sampled.ids
        if turn.ended_on_eot and self.codec.eos_tail:
            tail = Segment.template(self.codec.eos_tail, list(self.codec.eos_tail_ids))
            self.segments.append(tail)
            self.ids += tail.ids
        self.snapshot = [*plan.messages, assistant]
        self.tools = plan.tools
        self.template_kwargs = plan.template_kwargs
        self.num_turns += 1
        self.finish_reason = finish_reason

    # -- output ------------------------------------------------------------------------------------
    def trajectory(self, session_id: str) -> Trajectory:
        """The trajectory so far: segment 0 is the prompt, the rest the response."""
        prompt = self.segments[0].ids if self.segments else []
        rest = self.segments[1:]
        response_ids = [t for s in rest for t in s.ids]
        mask = [m for s in rest for m in s.mask]
        logprobs = [lp if m else 0.0 for s in rest for lp, m in zip(s.logprobs, s.mask)]
        versions = None
        if self.saw_versions:
            versions = [v for s in rest for v in (s.versions if s.versions is not None else [-1] * len(s.ids))]
            versions = [v if m else -1 for v, m in zip(versions, mask)]
        experts = None
        if self.saw_experts:
            experts = [e for s in rest for e in (s.experts if s.experts is not None else [[] for _ in s.ids])]
            experts = [e if m else [] for e, m in zip(experts, mask)]
        return Trajectory(session_id=session_id, prompt_ids=list(prompt), response_ids=response_ids,
                          response_mask=mask, response_logprobs=logprobs, num_turns=self.num_turns,
                          messages=list(self.snapshot), finish_reason=self.finish_reason,
                          rebuilds=self.rebuilds, tools=self.tools, weight_versions=versions,
                          routed_experts=experts)


def _write_json(path: str, payload: Any) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, ensure_ascii=False, indent=1, default=str)
