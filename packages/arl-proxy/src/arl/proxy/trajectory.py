"""The token-exact trajectory of one session: incremental tokenization, EOS-tail backfill, rebuilds, segments.

The builder keeps the current token sequence as a list of pieces, each a piece of the rendered
conversation text with its token ids: template pieces (prompt, tool/user messages, generation prompts,
backfilled tails; mask 0) and sampled pieces (exactly the tokens the engine sampled; mask 1 with their log
probs). Piece texts joined give the text the template renders for the conversation, and every cut between
pieces lies right after an added (special) token or at a turn boundary, so tokenizing the pieces equals
tokenizing the whole.

Per request, `plan()` either extends the sequence (the agent only appended messages: render, check the
already-recorded text is a prefix of the rendering, tokenize only the new text) or rebuilds it (history
was rewritten: render the whole conversation, keep old pieces whose text still matches and, at the
first difference, the tokens shared with the old sequence, with their mask and log probs; everything after
that is template text with mask 0). `plan_steps()` is the same plan as a generator that yields each text to
tokenize and is sent its ids, so the caller chooses where tokenization runs (the server: a long text in a
thread pool, off the event loop). `commit()` then appends the sampled tokens and, when the engine stopped
on the end-of-turn token, the template's tail after it (mask 0).

Segments (`segments=True`): when a committed prompt does not extend the current sequence token for token
(or a rebuild would take mask 1 away from a token of the current segment), the sequence so far is frozen as
a finished `arl.proxy.types.Segment` and a new segment starts whose prompt is that turn's whole prompt, so
each sampled token keeps mask 1 in exactly one segment. With `segments=False` there is one segment, as the
sequence has always been recorded: tokens sampled before a rewrite end up with mask 0.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from arl.proxy.chat import ChatCodec
from arl.proxy.types import Segment, Trajectory


@dataclass(slots=True)
class Piece:
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
    def template(cls, text: str, ids: list[int]) -> Piece:
        n = len(ids)
        return cls(text, ids, [0] * n, [0.0] * n)


@dataclass(slots=True)
class PromptPlan:
    """What one request adds to the trajectory before generation; applied by `commit` once it succeeds."""

    keep: int  # how many existing pieces stay
    new: list[Piece]  # pieces appended after them (the prompt's new part)
    prompt_ids: list[int]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    template_kwargs: dict[str, Any]
    rebuilt: bool
    head: tuple[list[dict[str, Any]], bool] | None = None  # new (head messages, window usable)
    debug: dict[str, Any] | None = None


# A plan under way (`TrajectoryBuilder.plan_steps`): it yields each text it needs tokenized, is sent back that
# text's ids, and returns the plan.
PlanSteps = Generator[str, list[int], PromptPlan]


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
    pieces: list[Piece] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    snapshot: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    head: list[dict[str, Any]] = field(default_factory=list)  # messages rendered as pieces[0]
    window_ok: bool = False
    last_sampled: int = -1  # index of the sampled piece of the snapshot's last (assistant) message
    rebuilds: int = 0
    num_turns: int = 0
    generated_tokens: int = 0  # sampled tokens committed over all turns
    finish_reason: str | None = None
    dropped_turns: int = 0  # turns generated for this session but not recorded (reply not delivered)
    saw_versions: bool = False
    saw_experts: bool = False
    segmented: bool = True  # start a new segment where a prompt does not extend the sequence (else one)
    closed: list[Segment] = field(default_factory=list)  # finished segments, in order
    seg_start: int = 0  # where the current segment's response starts in `ids` (= its prompt length)

    # -- planning ----------------------------------------------------------------------------------
    def plan(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any],
    ) -> PromptPlan:
        """Work out the prompt for `messages` without changing the builder (tokenizing on this thread)."""
        steps = self.plan_steps(messages, tools, template_kwargs)
        try:
            text = next(steps)
            while True:
                text = steps.send(self.codec.encode(text))
        except StopIteration as done:
            return done.value

    def plan_steps(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any],
    ) -> PlanSteps:
        """`plan`, yielding every text to tokenize instead of tokenizing it (rendering happens here)."""
        if not self.pieces:
            return (yield from self._first(messages, tools, template_kwargs))
        n = len(self.snapshot)
        appended = (
            len(messages) > n
            and tools == self.tools
            and template_kwargs == self.template_kwargs
            and messages[:n] == self.snapshot
        )
        if appended:
            plan = yield from self._extend(messages, tools, template_kwargs)
            if plan is not None:
                return plan
        return (yield from self._rebuild(messages, tools, template_kwargs, appended))

    def _first(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any],
    ) -> PlanSteps:
        """The first prompt, tokenized whole. A resumed history (assistant turns already in it) is recorded as
        two pieces, its prompt (the messages before the first assistant turn) and the rest, when the prompt's
        tokens begin the whole's: then later turns check a window of prompt + last turn + new messages instead
        of rendering the whole history again every turn (as after a rebuild). Segments off keep one piece, the
        prompt of their one sequence."""
        text = self.codec.render(messages, tools, True, template_kwargs)
        ids = yield text
        whole = PromptPlan(
            0,
            [Piece.template(text, ids)],
            list(ids),
            messages,
            tools,
            template_kwargs,
            False,
            head=(messages, True),
        )
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), 0)
        if not first or not self.segmented:
            return whole
        head = messages[:first]
        head_text = self.codec.render(head, tools, True, template_kwargs)
        if not text.startswith(head_text):
            return whole
        head_ids = yield head_text
        if ids[: len(head_ids)] != head_ids:
            return whole
        pieces = [
            Piece.template(head_text, head_ids),
            Piece.template(text[len(head_text) :], ids[len(head_ids) :]),
        ]
        return PromptPlan(0, pieces, list(ids), messages, tools, template_kwargs, False, head=(head, True))

    def _extend(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any],
    ) -> Generator[str, list[int], PromptPlan | None]:
        delta = messages[len(self.snapshot) :]
        if self.check == "window" and self.window_ok and self.last_sampled > 0:
            window = [*self.head, self.snapshot[-1], *delta]
            rendered = self.codec.render(window, tools, True, template_kwargs)
            recorded = self.pieces[0].text + "".join(s.text for s in self.pieces[self.last_sampled :])
        else:
            rendered = self.codec.render(messages, tools, True, template_kwargs)
            recorded = "".join(s.text for s in self.pieces)
        if not rendered.startswith(recorded):
            return None
        new_text = rendered[len(recorded) :]
        keep = len(self.pieces)
        if not self.pieces[-1].sampled:  # a backfilled tail: tokenize it together with what follows
            keep -= 1
            new_text = self.pieces[-1].text + new_text
        seg = Piece.template(new_text, (yield new_text))
        dropped = sum(len(s.ids) for s in self.pieces[keep:])
        prompt_ids = self.ids[: len(self.ids) - dropped] + seg.ids
        return PromptPlan(keep, [seg], prompt_ids, messages, tools, template_kwargs, False)

    def _rebuild(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any],
        appended: bool,
    ) -> PlanSteps:
        codec = self.codec
        text = codec.render(messages, tools, True, template_kwargs)
        # 1. Old pieces whose text is still there, in order; a template piece is kept only as the
        #    prompt or before a kept sampled piece (so the re-tokenized rest starts after a cut that
        #    the one-shot tokenization also has).
        pos, kept = 0, 0
        for seg in self.pieces:
            if not text.startswith(seg.text, pos):
                break
            pos += len(seg.text)
            kept += 1
        while kept > 1 and not self.pieces[kept - 1].sampled:
            kept -= 1
            pos -= len(self.pieces[kept].text)
        new: list[Piece] = []
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
            new.append(Piece.template(prompt_text, (yield prompt_text)))
            pos = len(prompt_text)
            head = (head_msgs, window_ok)
        # 3. The rest as one batch (the tokenizer splits at special tokens, so this equals tokenizing
        #    prompt, assistant turns and runs of tool/user messages one by one); the tokens it shares with
        #    the old sequence right where they diverge keep their mask and log probs.
        rest = text[pos:]
        rest_ids = yield rest
        offset = sum(len(s.ids) for s in self.pieces[:kept])
        shared = self._shared_sampled_prefix(rest, rest_ids, kept, offset) if kept else None
        if shared is not None:
            new.append(shared)
            rest = rest[len(shared.text) :]
            rest_ids = rest_ids[len(shared.ids) :]
        if rest or not new:
            new.append(Piece.template(rest, rest_ids))
        kept_ids = self.ids[:offset]
        prompt_ids = kept_ids + [t for s in new for t in s.ids]
        debug = self._debug(messages, tools, template_kwargs, text, appended, kept)
        return PromptPlan(
            kept, new, prompt_ids, messages, tools, template_kwargs, True, head=head, debug=debug
        )

    def _shared_sampled_prefix(self, rest: str, rest_ids: list[int], kept: int, offset: int) -> Piece | None:
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
        return Piece(
            piece,
            rest_ids[:c],
            mask[:c],
            lps[:c],
            vers[:c] if vers is not None else None,
            exps[:c] if exps is not None else None,
        )

    def _flat_from(self, first: int, count: int) -> tuple[list[int], list[float], list[int] | None, Any]:
        mask: list[int] = []
        lps: list[float] = []
        vers: list[int] = []
        exps: list[list[list[int]]] = []
        for seg in self.pieces[first:]:
            if len(mask) >= count:
                break
            mask += seg.mask
            lps += seg.logprobs
            vers += seg.versions if seg.versions is not None else [-1] * len(seg.ids)
            exps += seg.experts if seg.experts is not None else [[] for _ in seg.ids]
        return (
            mask[:count],
            lps[:count],
            vers[:count] if self.saw_versions else None,
            exps[:count] if self.saw_experts else None,
        )

    def _debug(
        self,
        messages: list[dict[str, Any]],
        tools: Any,
        kwargs: dict[str, Any],
        text: str,
        appended: bool,
        kept: int,
    ) -> dict[str, Any]:
        old_text = "".join(s.text for s in self.pieces)
        at = _common_prefix_len(old_text, text)
        first_diff = next(
            (i for i, (a, b) in enumerate(zip(self.snapshot, messages)) if a != b),
            min(len(self.snapshot), len(messages)),
        )
        return {
            "time": time.time(),
            "reason": "template rewrote earlier turns" if appended else "messages or tools changed",
            "tools_changed": tools != self.tools,
            "template_kwargs_changed": kwargs != self.template_kwargs,
            "first_differing_message": first_diff,
            "old_messages": self.snapshot,
            "new_messages": messages,
            "text_diverges_at": at,
            "old_text_from_divergence": old_text[at : at + 2000],
            "new_text_from_divergence": text[at : at + 2000],
            "segments_kept": kept,
            "old_num_tokens": len(self.ids),
        }

    # -- committing --------------------------------------------------------------------------------
    def commit(
        self,
        plan: PromptPlan,
        turn: SampledTurn,
        assistant: dict[str, Any],
        finish_reason: str,
        trajectory_dir: str | None = None,
    ) -> None:
        """Apply `plan` and append the sampled tokens (and the backfilled tail) of one generation."""
        if plan.rebuilt:
            self.rebuilds += 1
            if trajectory_dir and plan.debug is not None:
                _write_json(os.path.join(trajectory_dir, f"rebuild_{self.rebuilds:03d}.json"), plan.debug)
        if plan.head is not None:
            self.head, self.window_ok = plan.head
        new_segment = self.segmented and plan.rebuilt and self._breaks_segment(plan)
        if new_segment:
            self.closed.append(self._segment())
        del self.pieces[plan.keep :]
        self.pieces.extend(plan.new)
        self.ids = plan.prompt_ids
        if new_segment or not self.num_turns:
            self.seg_start = len(self.ids)
        n = len(turn.ids)
        if turn.versions is not None:
            self.saw_versions = True
        if turn.experts is not None:
            self.saw_experts = True
        sampled = Piece(
            self.codec.decode(turn.ids),
            list(turn.ids),
            [1] * n,
            list(turn.logprobs),
            list(turn.versions) if turn.versions is not None else None,
            list(turn.experts) if turn.experts is not None else None,
        )
        self.pieces.append(sampled)
        self.last_sampled = len(self.pieces) - 1
        self.ids = self.ids + sampled.ids
        if turn.ended_on_eot and self.codec.eos_tail:
            tail = Piece.template(self.codec.eos_tail, list(self.codec.eos_tail_ids))
            self.pieces.append(tail)
            self.ids += tail.ids
        self.snapshot = [*plan.messages, assistant]
        self.tools = plan.tools
        self.template_kwargs = plan.template_kwargs
        self.num_turns += 1
        self.generated_tokens += n
        self.finish_reason = finish_reason

    def _breaks_segment(self, plan: PromptPlan) -> bool:
        """Whether committing the rebuilt `plan` must start a new segment: its prompt does not extend the
        current tokens, or the rebuild would take mask 1 away from a token of the current segment."""
        n = len(self.ids)
        if plan.prompt_ids[:n] != self.ids:
            return True
        old_mask = self._flat(self.pieces)[1]
        new_mask = self._flat([*self.pieces[: plan.keep], *plan.new])[1]
        return any(o and not m for o, m in zip(old_mask[self.seg_start :], new_mask[self.seg_start : n]))

    def _flat(self, pieces: list[Piece]) -> tuple[list[int], list[int], list[float], list[int] | None, Any]:
        """ids, mask, log probs (0.0 where mask 0), versions and experts of `pieces`, token by token."""
        ids = [t for p in pieces for t in p.ids]
        mask = [m for p in pieces for m in p.mask]
        lps = [lp if m else 0.0 for p in pieces for lp, m in zip(p.logprobs, p.mask)]
        versions = None
        if self.saw_versions:
            versions = [
                v for p in pieces for v in (p.versions if p.versions is not None else [-1] * len(p.ids))
            ]
            versions = [v if m else -1 for v, m in zip(versions, mask)]
        experts = None
        if self.saw_experts:
            experts = [
                e for p in pieces for e in (p.experts if p.experts is not None else [[] for _ in p.ids])
            ]
            experts = [e if m else [] for e, m in zip(experts, mask)]
        return ids, mask, lps, versions, experts

    def _segment(self) -> Segment:
        """The current segment: the sequence so far, its response starting at `seg_start`."""
        ids, mask, lps, versions, experts = self._flat(self.pieces)
        # One sequence (segments off): the prompt is the first piece, as rebuilt when the prompt changed.
        k = self.seg_start if self.segmented else len(self.pieces[0].ids)
        return Segment(
            prompt_ids=ids[:k],
            response_ids=ids[k:],
            response_mask=mask[k:],
            response_logprobs=lps[k:],
            weight_versions=versions[k:] if versions is not None else None,
            routed_experts=experts[k:] if experts is not None else None,
        )

    # -- output ------------------------------------------------------------------------------------
    def trajectory(self, session_id: str) -> Trajectory:
        """The trajectory so far: its finished segments and the current one (whose fields are also flat)."""
        segments = [*self.closed, self._segment()] if self.pieces else []
        last = (
            segments[-1]
            if segments
            else Segment(prompt_ids=[], response_ids=[], response_mask=[], response_logprobs=[])
        )
        # Versions/experts appear on every segment once any turn reported them (a segment closed before the
        # first report has none: fill in copies, the builder's own segments stay as they are).
        for i, seg in enumerate(segments):
            n = len(seg.response_ids)
            if self.saw_versions and seg.weight_versions is None:
                segments[i] = seg = msgspec.structs.replace(seg, weight_versions=[-1] * n)
            if self.saw_experts and seg.routed_experts is None:
                segments[i] = msgspec.structs.replace(seg, routed_experts=[[] for _ in range(n)])
        return Trajectory(
            session_id=session_id,
            prompt_ids=list(last.prompt_ids),
            response_ids=list(last.response_ids),
            response_mask=list(last.response_mask),
            response_logprobs=list(last.response_logprobs),
            num_turns=self.num_turns,
            messages=list(self.snapshot),
            finish_reason=self.finish_reason,
            rebuilds=self.rebuilds,
            tools=self.tools,
            weight_versions=list(last.weight_versions) if last.weight_versions is not None else None,
            routed_experts=list(last.routed_experts) if last.routed_experts is not None else None,
            segments=segments,
            generated_tokens=self.generated_tokens,
            dropped_turns=self.dropped_turns,
        )


def _write_json(path: str, payload: Any) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, ensure_ascii=False, indent=1, default=str)
