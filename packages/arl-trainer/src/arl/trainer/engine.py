"""The micro-batched update both backends share: packing, proximal log probs, loss, accumulation.

A backend (single device or FSDP2) subclasses `PackedPolicy`, builds `self.model` (the HF model),
`self.packed` (the `PackedCausalLM` around it, possibly sharded) and `self.optimizer`, and overrides
the distributed hooks (`_grad_sync`, `_clip_grad_norm`, `_all_reduce_`). One trainer step:

1. proximal log probs by `proximal_mode` (recompute: a micro-batched no-grad pass; bypass: the
   rollout's; reuse: each update's own detached log probs; loglinear: AReaL's interpolation);
2. per mini-batch: plan micro-batches (balanced over ranks, token budget), forward each packed
   micro-batch under bf16 autocast where enabled, per-token loss, aggregate with the mini-batch's
   global denominators, backward (gradient sync only on the last micro-batch), clip, step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from arl.trainer.algorithms import grpo_advantages, masked_mean
from arl.trainer.batch import TrainBatch
from arl.trainer.config import TrainerConfig
from arl.trainer.flops import attention_width_and_layers, matmul_params, train_flops
from arl.trainer.loss_agg import Denominators, aggregate
from arl.trainer.packed import PackedMicroBatch, pack_rows, row_lengths
from arl.trainer.packing import CostModel, plan_packing


def decoupled_ppo_tokens(
    logp: torch.Tensor,
    proximal_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    tis_cap: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token decoupled-PPO loss with the truncated behaviour weight (flat (N,) tensors).

    The same objective as `algorithms.policy_loss`, before its mean: the aggregation is the caller's.
    """
    ratio = torch.exp(logp - proximal_logp)
    clipped = ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    pg = torch.maximum(-advantages * ratio, -advantages * clipped)
    raw_weight = torch.exp(proximal_logp - behaviour_logp)
    loss = pg * raw_weight.clamp(max=tis_cap).detach()
    with torch.no_grad():
        flags = {"clip_frac": ((ratio - clipped).abs() > 0).float(), "tis_clip_frac": (raw_weight > tis_cap).float()}
    return loss, flags


class PackedPolicy:
    """Shared update logic; see the module docstring. Subclasses set the attributes below."""

    model: torch.nn.Module
    packed: torch.nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    config: TrainerConfig
    rank: int = 0
    world_size: int = 1

    # ---- hooks a distributed backend overrides ----
    def _grad_sync(self, enabled: bool) -> None:
        """Whether the next backward reduces gradients across ranks (only the last micro-batch's does)."""

    def _clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def _all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks in place (identity on one device)."""
        return tensor

    # ---- shared machinery ----
    def _init_shared(self) -> None:
        cfg = self.config
        mp = cfg.mixed_precision
        if mp == "auto":
            mp = "bf16" if self.device.type == "cuda" else "none"
        self.compute_dtype = torch.bfloat16 if mp == "bf16" else None
        attn_width, layers = attention_width_and_layers(self.model.config)
        self._n_matmul = matmul_params(self.model)
        self._attn = (attn_width, layers)
        self.cost = CostModel.for_model(attn_width, layers, self._n_matmul)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def _microbatches(self, batch: TrainBatch, rows: list[int]) -> tuple[list[PackedMicroBatch], dict[str, float]]:
        """This rank's packed micro-batches of `rows` (every rank gets the same count)."""
        lengths_all = row_lengths(batch)
        lengths = [lengths_all[r] for r in rows]
        plan = plan_packing(lengths, world_size=self.world_size, max_tokens=self.config.max_tokens_per_microbatch, cost=self.cost)
        mine = [pack_rows(batch, [rows[i] for i in mb]) for mb in plan.ranks[self.rank]]
        return mine, plan.stats(lengths, self.cost)

    def _forward(self, mb: PackedMicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        with self._autocast():
            return self.packed(mb.to(self.device))

    @torch.no_grad()
    def log_probs(self, batch: TrainBatch) -> torch.Tensor:
        """Log probs of the trained tokens under the current weights, (B, T) on CPU (0 elsewhere)."""
        out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
        mbs, _ = self._microbatches(batch, list(range(batch.input_ids.shape[0])))
        for mb in mbs:
            logp, _ = self._forward(mb)
            out[mb.loss_rows, mb.loss_cols] = logp.float().cpu()
        return self._all_reduce_(out.to(self.device)).cpu() if self.world_size > 1 else out

    def _proximal(self, batch: TrainBatch) -> torch.Tensor | None:
        mode = self.config.proximal_mode
        if mode == "recompute":
            return self.log_probs(batch)
        if mode == "bypass":
            return batch.behaviour_logp
        if mode == "reuse":
            return None
        if mode == "loglinear":
            return self._loglinear_proximal(batch)
        raise ValueError(f"unknown proximal_mode {mode!r}")

    def _loglinear_proximal(self, batch: TrainBatch) -> torch.Tensor:
        raise NotImplementedError("proximal_mode='loglinear' needs arl.trainer.proximal (not present in this build)")

    def train_step(self, batch: TrainBatch, mini_batch_rows: int) -> dict[str, float]:
        """One trainer step: proximal log probs, GRPO advantages, one optimizer update per mini-batch."""
        cfg = self.config
        on_cuda = self.device.type == "cuda"
        if on_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        proximal = self._proximal(batch)
        t_prox = time.perf_counter() - t0
        peak_prox = torch.cuda.max_memory_allocated(self.device) if on_cuda else 0
        adv_rows = grpo_advantages(batch.rewards, batch.group_index, norm_by_std=cfg.norm_adv_by_std)
        advantages = adv_rows[:, None].expand_as(batch.loss_mask)
        reuse_logp = torch.zeros(batch.loss_mask.shape, dtype=torch.float32) if proximal is None else None
        sums: dict[str, float] = {}
        steps: list[dict[str, float]] = []
        n_rows = batch.input_ids.shape[0]
        lengths = row_lengths(batch)
        t_update = 0.0
        flops = 0.0
        tokens = 0
        for start in range(0, n_rows, mini_batch_rows):
            t1 = time.perf_counter()
            rows = list(range(start, min(n_rows, start + mini_batch_rows)))
            denom = Denominators.from_loss_mask(batch.loss_mask[rows], cfg.loss_agg_norm_len)
            mbs, pack_stats = self._microbatches(batch, rows)
            self.optimizer.zero_grad(set_to_none=True)
            stats = {"loss": 0.0, "clip_frac": 0.0, "tis_clip_frac": 0.0, "entropy": 0.0, "loss_tokens": 0.0}
            for i, mb in enumerate(mbs):
                self._grad_sync(i == len(mbs) - 1)
                logp, entropy = self._forward(mb)
                dev = logp.device
                behav = mb.gather(batch.behaviour_logp).to(dev)
                adv = mb.gather(advantages).to(dev)
                if proximal is None:
                    prox = logp.detach()
                    reuse_logp[mb.loss_rows, mb.loss_cols] = prox.float().cpu()
                else:
                    prox = mb.gather(proximal).to(dev)
                tok_loss, flags = decoupled_ppo_tokens(
                    logp, prox, behav, adv,
                    clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high, tis_cap=cfg.tis_cap,
                )
                seq_index = mb.seq_index.to(dev)
                loss = aggregate(tok_loss, seq_index, cfg.loss_agg_mode, denom)
                if cfg.entropy_coeff:
                    loss = loss - cfg.entropy_coeff * aggregate(entropy, seq_index, cfg.loss_agg_mode, denom)
                # Ranks' gradients are averaged by the data-parallel reduction; the denominators are global,
                # so scale by the world size to make that average a sum.
                (loss * self.world_size).backward()
                with torch.no_grad():
                    stats["loss"] += float(loss)
                    stats["clip_frac"] += float(flags["clip_frac"].sum())
                    stats["tis_clip_frac"] += float(flags["tis_clip_frac"].sum())
                    stats["entropy"] += float(entropy.detach().sum())
                    stats["loss_tokens"] += float(mb.num_loss_tokens)
                if mb.rows:
                    flops += train_flops(self._n_matmul, [lengths[r] for r in mb.rows], *self._attn)
                    tokens += sum(lengths[r] for r in mb.rows)
            grad_norm = self._clip_grad_norm(cfg.optim.grad_clip)
            self.optimizer.step()
            t_update += time.perf_counter() - t1
            reduced = self._all_reduce_(torch.tensor(list(stats.values()), dtype=torch.float64, device=self.device)).tolist()
            stats = dict(zip(stats, reduced))
            n_tok = max(1.0, stats.pop("loss_tokens"))
            steps.append({
                "loss": stats["loss"],
                "grad_norm": float(grad_norm),
                "clip_frac": stats["clip_frac"] / n_tok,
                "tis_clip_frac": stats["tis_clip_frac"] / n_tok,
                "entropy": stats["entropy"] / n_tok,
                "pack_fill": pack_stats["pack_fill"],
                "rank_imbalance": pack_stats["rank_imbalance"],
                "microbatches": pack_stats["microbatches"],
            })
        out = {k: sum(s[k] for s in steps) / len(steps) for k in steps[0]}
        if proximal is None:
            proximal = reuse_logp
            if self.world_size > 1:
                proximal = self._all_reduce_(proximal.to(self.device)).cpu()
        # How far the rollout engine's log probs are from the trainer's for the same weights/tokens:
        # near 0 on-policy; grows with staleness; a large value on fresh samples means a broken sync.
        out["behaviour_proximal_abs_diff"] = masked_mean((proximal - batch.behaviour_logp).abs(), batch.loss_mask).item()
        out["updates"] = float(len(steps))
        out["proximal_s"] = t_prox
        out["update_s"] = t_update
        out["train_tokens"] = float(tokens)
        out["train_tokens_per_s_per_gpu"] = tokens / t_update if t_update > 0 else 0.0
        out["train_tflops_per_gpu"] = flops / t_update / 1e12 if t_update > 0 else 0.0
        if cfg.peak_tflops > 0:
            out["mfu"] = out["train_tflops_per_gpu"] / cfg.peak_tflops
        out["padding_efficiency"] = out.pop("pack_fill")
        if on_cuda:
            out["peak_mem_proximal_gib"] = peak_prox / 2**30
            out["peak_mem_update_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return out

    def named_parameters_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Parameters in Hugging Face checkpoint naming (what vLLM's load_weights expects)."""
        for name, p in self.model.named_parameters():
            yield name, p.detach()
