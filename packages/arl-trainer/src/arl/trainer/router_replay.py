"""MoE routing replay: the trainer's forward goes through the experts the rollout engine chose.

A router that flips on a near-tie sends a token through different experts in training than in
sampling: the largest source of train/rollout log-prob mismatch on mixture-of-experts models. With
`actor.router_replay = "rollout"` the trainer replays the engine's choice instead of routing again:

    routes = routes_for_batch(samples, width=batch.input_ids.shape[1])      # (B, T, layers, top_k) int16, -1 = own
    with replay_routes(model, routes) as stats:
        logits = model(input_ids=..., attention_mask=...).logits
    stats.summary()  # {"router_replay/route_diff_frac": ..., ...}

Position alignment: the engine reports, per sampled response token j, the routing of the forward step
that *sampled* it, i.e. of input position `P + j - 1` (P = prompt length). `routes_for_batch` places
it there, so the logits that score token j come from the engine's experts. Positions without engine
routing (the prompt, tool output, padding) hold -1 and are routed by the trainer itself.

What is replayed is the *selection* only: the router's logits are still computed (with gradients),
and the mixing weights are the router's own softmax probabilities gathered at the replayed experts
(renormalised over the top-k when the model says so), so the router keeps learning. The router's first
output is returned untouched, so Hugging Face's `output_router_logits` aux loss still works (counting
its own top-k); `load_balancing_loss` computes it with the replayed selection instead. The logits are
recomputed from the router's input and weight (one E-wide matmul per layer) because some transformers
releases put softmaxed probabilities in the router's "logits" output.

Works with Hugging Face MoE blocks whose router is a module returning `(logits, scores, indices)`
(transformers >= 5: `Qwen3MoeTopKRouter`, and the same pattern in Qwen2-MoE/OLMoE/Mixtral-style
models), found as `...layers.<i>....gate`; the routes' layer axis is the decoder-layer index, as vLLM
reports it (rows of dense layers are ignored).

The trainer (`arl.trainer.engine.PackedPolicy`) runs every forward of a step (proximal log probs,
each training micro-batch, and the backward's recomputation of checkpointed layers) under
`replay_routes`, with `packed_routes` mapping the padded (B, T) layout onto each packed micro-batch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from arl.queue.routed_experts import SENTINEL, route_ids
from arl.queue.segments import iter_segment_rows
from arl.queue.types import Sample
from arl.trainer.errors import RouterReplayError

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def find_routers(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """The MoE router of every decoder layer that has one: {layer index: router module}."""
    routers: dict[int, torch.nn.Module] = {}
    for name, module in model.named_modules():
        if not (
            hasattr(module, "top_k")
            and hasattr(module, "num_experts")
            and isinstance(getattr(module, "weight", None), torch.Tensor)
        ):
            continue
        match = _LAYER.search(name + ".")
        if match is None:
            continue
        routers[int(match.group(1))] = module
    return routers


@dataclass
class RoutingStats:
    """What one `replay_routes` context saw: per forward pass, which tokens had engine routes and
    whether the trainer's own top-k (as a set) differed from them in any layer. Counts stay on the
    device until `summary()` / `counts()` (no host sync per layer)."""

    # Per forward pass: "routed" (tokens with engine routing in every router layer) and "differs".
    passes: list[dict[str, torch.Tensor]] = field(default_factory=list)
    # Per forward pass, per router layer: (router logits, experts used), when kept for the aux loss.
    aux: list[list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)
    # Per router layer: (replayed token-layer pairs, pairs where the own choice differed), 0-d tensors per pass.
    layers: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)
    # False while a backward recomputes checkpointed layers: the routes are still replayed (the
    # recomputation must match the forward) but nothing is counted twice.
    recording: bool = True

    def merge(self, other: RoutingStats) -> None:
        """Add another context's counts (the aux-loss records are not carried over)."""
        self.passes += other.passes
        for layer, pairs in other.layers.items():
            self.layers.setdefault(layer, []).extend(pairs)

    def counts(self, layers: Sequence[int], device: torch.device | None = None) -> torch.Tensor:
        """float64 [routed tokens, differing tokens, then (pairs, differing pairs) per layer of `layers`]:
        a vector that sums over contexts and ranks (all-reduce) and `summarize` reads."""
        out = torch.zeros(2 + 2 * len(layers), dtype=torch.float64, device=device)
        for p in self.passes:
            if p:
                out[0] += p["routed"].sum().to(out)
                out[1] += (p["differs"] & p["routed"]).sum().to(out)
        for i, layer in enumerate(layers):
            for replayed, differ in self.layers.get(layer, ()):
                out[2 + 2 * i] += replayed.to(out)
                out[3 + 2 * i] += differ.to(out)
        return out

    def summary(self, per_layer: bool = False) -> dict[str, float]:
        """Fractions over the tokens that carried engine routing (the sampled tokens)."""
        layers = sorted(self.layers)
        return summarize(self.counts(layers), layers, per_layer=per_layer)


def summarize(counts: torch.Tensor, layers: Sequence[int], per_layer: bool = False) -> dict[str, float]:
    """Metrics of a `RoutingStats.counts` vector (possibly summed over ranks)."""
    c = counts.tolist()
    routed, differ = c[0], c[1]
    pairs, pairs_differ = sum(c[2::2]), sum(c[3::2])
    out = {
        "router_replay/routed_tokens": float(routed),
        # Sampled tokens whose trainer routing differs from the engine's in at least one layer.
        "router_replay/route_diff_frac": differ / routed if routed else 0.0,
        # The same per (token, layer) pair.
        "router_replay/route_diff_frac_per_layer": pairs_differ / pairs if pairs else 0.0,
    }
    if per_layer:
        for i, layer in enumerate(layers):
            n = c[2 + 2 * i]
            out[f"router_replay/route_diff_frac_layer{layer}"] = c[3 + 2 * i] / n if n else 0.0
    return out


@contextmanager
def replay_routes(
    model: torch.nn.Module, routes: torch.Tensor | None, *, apply: bool = True, keep_for_aux: bool = False
) -> Iterator[RoutingStats]:
    """Within the block, every forward of `model` uses `routes` in place of its own top-k choice.

    `routes`: (B, T, layers, top_k) integer expert ids for the model's input (B, T), -1 where the model
    routes itself (a token-layer pair is replayed only when all its top_k ids are >= 0). The layer axis
    is the decoder-layer index (vLLM's layout). `apply=False` only measures (stats), as the "off"
    mode's metric. `routes=None` is a no-op context (dense batches). `keep_for_aux` records the
    router logits and replayed selection of each layer for `load_balancing_loss`.
    """
    stats = RoutingStats()
    if routes is None:
        yield stats
        return
    routers = find_routers(model)
    if not routers:
        raise RouterReplayError(
            f"{type(model).__name__} has no MoE router (a `layers.<i>...gate` module with top_k)"
        )
    if routes.dim() != 4:
        raise RouterReplayError(
            f"routes must be (batch, tokens, layers, top_k), got shape {tuple(routes.shape)}"
        )
    needed = max(routers) + 1
    top_k = next(iter(routers.values())).top_k
    if routes.shape[2] < needed or routes.shape[3] != top_k:
        raise RouterReplayError(
            f"routes have {routes.shape[2]} layers x top-{routes.shape[3]}; "
            f"the model needs {needed} layers x top-{top_k}"
        )
    num_experts = next(iter(routers.values())).num_experts
    if int(routes.max()) >= num_experts:
        raise RouterReplayError(f"route expert id {int(routes.max())} >= the model's {num_experts} experts")
    flat = routes.reshape(-1, routes.shape[2], routes.shape[3])  # (B*T, layers, top_k)

    def begin_pass(_module: torch.nn.Module, _args: Any) -> None:
        if not stats.recording:
            return
        stats.passes.append({})
        stats.aux.append([])

    def make_hook(layer: int) -> Callable[..., Any]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> Any:
            if not (isinstance(output, tuple) and len(output) == 3):
                raise RouterReplayError(
                    f"router of layer {layer} ({type(module).__name__}) does not return (logits, scores, indices); "
                    "this transformers version's MoE block is not supported"
                )
            _, scores, own = output
            if not (stats.recording or apply):  # a recomputation in "off" mode: nothing to do
                return output
            hidden = args[0] if args else kwargs["hidden_states"]
            # The router logits, recomputed from its input: some transformers releases return the
            # softmaxed probabilities in the "logits" slot, so that slot is not relied on.
            logits = torch.nn.functional.linear(hidden.reshape(-1, module.weight.shape[1]), module.weight)
            if logits.shape[0] != flat.shape[0]:
                raise RouterReplayError(
                    f"routes cover {flat.shape[0]} tokens (B*T), layer {layer}'s router saw {logits.shape[0]}"
                )
            replay = flat[:, layer].to(own.device, own.dtype)
            use = (replay >= 0).all(-1)
            chosen = torch.where(use[:, None], replay, own) if apply else own
            if stats.recording:  # not while backward recomputes a checkpointed layer: counted once
                differs = (own.sort(-1).values != replay.sort(-1).values).any(-1) & use
                if not stats.passes:  # a submodule was called directly, not the model
                    begin_pass(model, ())
                current = stats.passes[-1]
                current["routed"] = current.get("routed", use) & use
                current["differs"] = current.get("differs", torch.zeros_like(use)) | differs
                stats.layers.setdefault(layer, []).append((use.sum(), differs.sum()))
                if keep_for_aux:
                    stats.aux[-1].append((logits, chosen))
            if not apply:
                return output
            probs = torch.softmax(logits, dim=-1, dtype=torch.float)
            weights = probs.gather(-1, chosen)
            if getattr(module, "norm_topk_prob", False):
                weights = weights / weights.sum(-1, keepdim=True)
            # Tokens routed by the model itself keep its own scores bit for bit.
            weights = torch.where(use[:, None], weights.to(scores.dtype), scores)
            return output[0], weights, chosen

        return hook

    handles = [model.register_forward_pre_hook(begin_pass)]
    try:
        handles += [
            router.register_forward_hook(make_hook(layer), with_kwargs=True)
            for layer, router in routers.items()
        ]
        yield stats
    finally:
        for h in handles:
            h.remove()


def load_balancing_loss(
    stats: RoutingStats, num_experts: int, token_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Switch-Transformer load-balancing loss (as transformers' `load_balancing_loss_func`), counting
    the experts actually used (the replayed ones) instead of re-running top-k on the logits. Needs
    `replay_routes(..., keep_for_aux=True)`; averages over forward passes. `token_mask`: (B*T,) or
    (B, T), 1 on real tokens, for a single pass."""
    if not stats.aux or not stats.aux[-1]:
        raise RouterReplayError("no router logits recorded: use replay_routes(..., keep_for_aux=True)")
    losses = []
    for layers in (a for a in stats.aux if a):
        counts = None
        probs_sum = None
        rows = None
        for logits, chosen in layers:
            mask = (
                torch.ones(logits.shape[0], device=logits.device)
                if token_mask is None
                else token_mask.reshape(-1).to(logits.device, torch.float)
            )
            probs = torch.softmax(logits, dim=-1, dtype=torch.float)
            c = torch.zeros(num_experts, device=logits.device).scatter_add_(
                0, chosen.reshape(-1), mask.repeat_interleave(chosen.shape[-1])
            )
            p = (probs * mask[:, None]).sum(0)
            counts = c if counts is None else counts + c
            probs_sum = p if probs_sum is None else probs_sum + p
            rows = mask.sum() if rows is None else rows + mask.sum()
        assert counts is not None and probs_sum is not None and rows is not None
        losses.append(num_experts * torch.sum((counts / rows) * (probs_sum / rows)))
    return torch.stack(losses).mean()


def response_routes(routes: Any) -> torch.Tensor:
    """A response's packed `RoutedExperts` as a (tokens, layers, top_k) long tensor, -1 = trainer routes."""
    ids = torch.tensor(route_ids(routes), dtype=torch.long).reshape(routes.shape)
    return ids.masked_fill(ids == SENTINEL[routes.dtype], -1)


def routes_for_batch(samples: Sequence[Sample], width: int | None = None) -> torch.Tensor | None:
    """Engine routes of `samples` laid out like `assemble_batch`'s rows: (B, T, layers, top_k), -1 where
    the trainer routes. Response token j's route sits at input position P + j - 1 (the step that
    sampled it). None when no response carries routes (dense model, or routes not recorded)."""
    per_row: list[tuple[int, torch.Tensor | None, int]] = []
    shape: tuple[int, int] | None = None
    for item in iter_segment_rows(samples):  # one row per trajectory segment, as assemble_batch
        r = item.row
        uid = samples[item.group].uid
        p = len(r.prompt_ids)
        n = len(r.response_ids)
        ids = None
        if r.routed_experts is not None:
            ids = response_routes(r.routed_experts)
            if ids.shape[0] != n:
                raise RouterReplayError(
                    f"sample {uid}: {ids.shape[0]} routed-expert rows for {n} response tokens"
                )
            if shape is None:
                shape = (ids.shape[1], ids.shape[2])
            elif (ids.shape[1], ids.shape[2]) != shape:
                raise RouterReplayError(f"sample {uid}: routes of {tuple(ids.shape[1:])}, others {shape}")
            mask = torch.tensor(r.response_mask, dtype=torch.bool)
            # only sampled tokens are replayed
            ids = ids.masked_fill(~mask[:, None, None], -1).to(torch.int16)
        per_row.append((p, ids, p + n))
    if shape is None:
        return None
    longest = max(end for _, _, end in per_row)
    width = longest if width is None else width
    if width < longest:
        raise RouterReplayError(f"batch width {width} is shorter than the longest row ({longest} tokens)")
    # int16: a (64 rows x 4k tokens x 48 layers x top-8) batch is 200 MB, not 800 MB as int64.
    out = torch.full((len(per_row), width, *shape), -1, dtype=torch.int16)
    for row, (p, ids, _) in enumerate(per_row):
        if ids is None:
            continue
        if p == 0:  # no prompt: the first token was sampled from no input position
            ids = ids[1:]
            p = 1
        out[row, p - 1 : p - 1 + ids.shape[0]] = ids
    return out


def packed_routes(routes: torch.Tensor, rows: Sequence[int], cu_seqlens: torch.Tensor) -> torch.Tensor:
    """The routes of a packed micro-batch, (1, T_packed, layers, top_k): each row's first `length`
    positions (its real tokens, as `arl.trainer.packed.pack_rows` concatenates them) in micro-batch
    order. A dummy micro-batch (no rows: one pad token) gets -1 (its router chooses)."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    if not rows:
        return torch.full((1, int(cu_seqlens[-1]), *routes.shape[2:]), -1, dtype=routes.dtype)
    if len(lengths) != len(rows):
        raise RouterReplayError(f"{len(rows)} rows but {len(lengths)} sequences in cu_seqlens")
    return torch.cat([routes[r, :n] for r, n in zip(rows, lengths)])[None]


@torch.no_grad()
def replay_gap_metrics(
    model: torch.nn.Module,
    batch: Any,
    routes: torch.Tensor | None,
    temperature: float = 1.0,
    micro_rows: int | None = None,
) -> dict[str, float]:
    """The train/rollout log-prob gap of the sampled tokens with replay on and off, and the fraction of
    sampled tokens whose trainer routing differs from the engine's. `batch` is a `TrainBatch` (its
    `behaviour_logp` are the engine's log probs); one extra forward per mode, in `micro_rows` chunks."""
    from arl.trainer.algorithms import token_log_probs

    device = next(model.parameters()).device
    rows = batch.input_ids.shape[0]
    step = micro_rows or rows
    out: dict[str, float] = {}
    mask = batch.loss_mask.bool()
    for mode in ("off", "on"):
        gaps = []
        stats_all = RoutingStats()
        for start in range(0, rows, step):
            sl = slice(start, start + step)
            ids = batch.input_ids[sl].to(device)
            r = routes[sl].to(device) if routes is not None else None
            with replay_routes(model, r, apply=mode == "on") as stats:
                logits = model(input_ids=ids, attention_mask=batch.attention_mask[sl].to(device)).logits
            logp = token_log_probs(logits, ids, temperature).float().cpu()
            gaps.append((logp - batch.behaviour_logp[sl])[mask[sl]].abs())
            stats_all.merge(stats)
        gap = torch.cat(gaps)
        out[f"router_replay/logp_gap_{mode}_mean"] = gap.mean().item() if gap.numel() else 0.0
        out[f"router_replay/logp_gap_{mode}_max"] = gap.max().item() if gap.numel() else 0.0
        if mode == "off":
            out.update(stats_all.summary())
    return out
