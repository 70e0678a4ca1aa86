"""The micro-batched update both backends share: packing, proximal log probs, loss, accumulation.

A backend (single device or FSDP2) subclasses `PackedPolicy`, builds `self.model` (the HF model),
`self.packed` (the `PackedCausalLM` around it, possibly sharded) and `self.optimizer`, and overrides
the distributed hooks (`_grad_sync`, `_clip_grad_norm`, `_all_reduce_`). One trainer step:

1. proximal log probs by `proximal_mode` (recompute: a micro-batched no-grad pass; bypass: the
   rollout's; reuse: each update's own detached log probs; loglinear: AReaL's interpolation; auto,
   the default: reuse in a step of one update, where it is exact, else recompute);
2. with `algorithm.kl_coef > 0`: the frozen reference policy's log probs (`arl.trainer.reference`),
   one micro-batched no-grad pass through `self.ref_packed`; KL in the loss (a per-token term) or in
   the reward (subtracted per trajectory before advantages);
3. per mini-batch: plan micro-batches (balanced over ranks, token budget), forward each packed
   micro-batch under bf16 autocast where enabled, per-token loss, aggregate with the mini-batch's
   global denominators, backward (gradient sync only on the last micro-batch), clip, step; an update
   whose gradient norm is not finite is skipped (`arl.trainer.nonfinite`). With
   `activation_offload` on CUDA the training forwards save their activations to pinned host memory
   (`arl.trainer.offload`); with `optimizer_offload` the AdamW state waits in pinned host memory
   between steps and the gradients are dropped after the last update (`arl.trainer.optimizer`).

MoE models (`arl.trainer.router_replay`): given the batch's engine routes, every forward of the step
(proximal, reference, each micro-batch and its backward, which recomputes checkpointed layers) runs under
`replay_routes`, replaying them (`router_replay = "rollout"`) or only measuring how often the
trainer's own routing differs ("off"); plus the optional router aux loss and, every
`router_replay_gap_every` steps, the train/rollout log-prob gap with replay off and on. A dense
model, or a batch without routes, runs exactly as before.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import record_function

from arl.trainer.algorithm_config import ProximalMode
from arl.trainer.algorithms import masked_mean
from arl.trainer.batch import TrainBatch, trajectory_advantages
from arl.trainer.config import TrainerConfig, compute_dtype
from arl.trainer.errors import ReferencePolicyError, RouterReplayError
from arl.trainer.flops import attention_width_and_layers, matmul_params, train_flops
from arl.trainer.gemm_check import ensure_right_gemms, recheck_every
from arl.trainer.loss_agg import Denominators, aggregate
from arl.trainer.nonfinite import NonFiniteGuard
from arl.trainer.offload import HostActivationOffload
from arl.trainer.optimizer import HostOptimizerState
from arl.trainer.packed import PackedMicroBatch, pack_rows, row_lengths
from arl.trainer.packing import CostModel, plan_packing
from arl.trainer.proximal import loglinear_proximal
from arl.trainer.router_replay import (
    RoutingStats,
    find_routers,
    load_balancing_loss,
    packed_routes,
    replay_routes,
    summarize,
)
from arl.trainer.token_loss import (
    COUNT_METRICS,
    compute_token_loss,
    merge_loss_metrics,
    sequence_keep_rows,
)


class PackedPolicy:
    """Shared update logic; see the module docstring. Subclasses set the attributes below."""

    model: torch.nn.Module
    packed: torch.nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    config: TrainerConfig
    rank: int = 0
    world_size: int = 1
    # The weight version of the current parameters (the trainer loop sets it); `loglinear` needs it.
    version: float = 0.0
    # The frozen reference policy (a `PackedCausalLM`, sharded like `packed` under FSDP2) when
    # algorithm.kl_coef > 0, else None; `reference_path`: the HF folder it came from (None: a copy of
    # the initial weights of a policy built from a module or a config).
    ref_packed: torch.nn.Module | None = None
    reference_path: Path | None = None
    # The AdamW state's host copy under optimizer_offload on CUDA (set by `_init_shared`), else None.
    optimizer_state: HostOptimizerState | None = None
    # Copies of the weights a checkpoint holds (FSDP2: its shards and the HF export).
    checkpoint_weight_copies: int = 1

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
        if cfg.algorithm.needs_ref_logp and self.ref_packed is None:
            raise ReferencePolicyError(
                f"algorithm.kl_coef = {cfg.algorithm.kl_coef} needs a reference policy; "
                f"{type(self).__name__} built none"
            )
        from arl.trainer.schedule import make_lr_scheduler

        self.scheduler = make_lr_scheduler(self.optimizer, cfg.algorithm)
        self.nonfinite = NonFiniteGuard(cfg.optim.max_nonfinite_skips)
        self.compute_dtype = compute_dtype(cfg, self.device)
        self.gemm_check = (
            ensure_right_gemms(self.device, self.model, self.compute_dtype)
            if cfg.check_gemms and self.device.type == "cuda"
            else None
        )
        self._gemm_recheck_every = recheck_every(cfg.gemm_recheck_every) if self.gemm_check else 0
        attn_width, layers = attention_width_and_layers(self.model.config)
        self._n_matmul = matmul_params(self.model)
        self._attn = (attn_width, layers)
        self.cost = CostModel.for_model(attn_width, layers, self._n_matmul)
        routers = find_routers(self.model)
        self._router_layers = sorted(routers)  # decoder-layer indices of the MoE routers (none: dense)
        first = next(iter(routers.values()), None)
        self._router_shape = (max(routers) + 1, first.top_k) if first is not None else None
        self._num_experts = first.num_experts if first is not None else 0
        if first is None and (cfg.router_replay == "rollout" or cfg.router_aux_loss_coef > 0):
            key = "router_replay='rollout'" if cfg.router_replay == "rollout" else "router_aux_loss_coef > 0"
            raise RouterReplayError(
                f"{key} needs an MoE model; {type(self.model).__name__} has no MoE router"
            )
        self._steps_done = 0
        self.optimizer_state = None
        if cfg.optimizer_offload and self.device.type == "cuda":
            self.optimizer_state = HostOptimizerState(
                self.optimizer, inflight_bytes=cfg.optimizer_prefetch_inflight_mb << 20
            )

    def settle_optimizer_offload(self) -> float:
        """With `optimizer_offload_overlap`: wait for the last step's way out to land and free the state's
        GPU storage (into the caching allocator). Returns the seconds waited (0: nothing under way)."""
        return self.optimizer_state.settle() if self.optimizer_state is not None else 0.0

    def optimizer_state_on_device(self) -> contextlib.AbstractContextManager[Any]:
        """Inside the block the optimizer's state is on its device (checkpoints read and write it)."""
        return (
            self.optimizer_state.on_device() if self.optimizer_state is not None else contextlib.nullcontext()
        )

    def checkpoint_nbytes(self) -> int:
        """Bytes a checkpoint of this policy writes (before the first step: what later ones will)."""
        from arl.trainer.checkpoint_space import checkpoint_bytes

        return checkpoint_bytes(self.model, self.optimizer, self.checkpoint_weight_copies)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def _microbatches(
        self, batch: TrainBatch, rows: list[int]
    ) -> tuple[list[PackedMicroBatch], dict[str, float]]:
        """This rank's packed micro-batches of `rows` (every rank gets the same count)."""
        lengths_all = row_lengths(batch)
        lengths = [lengths_all[r] for r in rows]
        plan = plan_packing(
            lengths,
            world_size=self.world_size,
            max_tokens=self.config.max_tokens_per_microbatch,
            cost=self.cost,
        )
        mine = [pack_rows(batch, [rows[i] for i in mb]) for mb in plan.ranks[self.rank]]
        return mine, plan.stats(lengths, self.cost)

    def _forward(
        self, mb: PackedMicroBatch, module: torch.nn.Module | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log π(target), entropy) of one packed micro-batch through `module` (default: the policy)."""
        with self._autocast():
            return (self.packed if module is None else module)(mb.to(self.device))

    def _offload(self) -> contextlib.AbstractContextManager[Any]:
        """Around a training forward: its saved activations to pinned host memory (CUDA only)."""
        if self.config.activation_offload and self.device.type == "cuda":
            return HostActivationOffload(pin_memory=True)
        return contextlib.nullcontext()

    def _routing(
        self,
        mb: PackedMicroBatch,
        routes: torch.Tensor | None,
        *,
        apply: bool | None = None,
        keep_for_aux: bool = False,
        module: torch.nn.Module | None = None,
    ) -> contextlib.AbstractContextManager[RoutingStats]:
        """The routing context of one packed forward (and its backward) of `module` (default: the
        policy): the micro-batch's engine routes replayed (`apply`, default: router_replay ==
        "rollout") or only measured. No routes and no aux loss: a no-op (dense models pay nothing).
        Aux loss without engine routes: the model routes all."""
        if routes is None and not keep_for_aux:
            return contextlib.nullcontext(RoutingStats())
        if routes is None:
            assert self._router_shape is not None
            mb_routes = torch.full((1, mb.num_tokens, *self._router_shape), -1, dtype=torch.int16)
        else:
            mb_routes = packed_routes(routes, mb.rows, mb.cu_seqlens)
        apply = self.config.router_replay == "rollout" if apply is None else apply
        return replay_routes(
            self.packed if module is None else module,
            mb_routes.to(self.device, non_blocking=True),
            apply=apply,
            keep_for_aux=keep_for_aux,
        )

    def _check_routes(self, batch: TrainBatch, routes: torch.Tensor | None) -> None:
        if routes is not None and tuple(routes.shape[:2]) != tuple(batch.input_ids.shape):
            raise RouterReplayError(
                f"routes of shape {tuple(routes.shape)} do not cover the batch's "
                f"{tuple(batch.input_ids.shape)} tokens (routes_for_batch(samples, width=T))"
            )
        if routes is None and self.config.router_replay == "rollout" and self._router_layers:
            raise RouterReplayError(
                "router_replay='rollout' but the batch carries no routed experts: the rollout "
                "engine must return them (the app's rollout.return_routed_experts = true)"
            )

    @torch.no_grad()
    def log_probs(self, batch: TrainBatch, routes: torch.Tensor | None = None) -> torch.Tensor:
        """Log probs of the trained tokens under the current weights, (B, T) on CPU (0 elsewhere).
        `routes`: the batch's engine routes (`routes_for_batch`), replayed when router_replay = "rollout".
        A collective under FSDP2 (every rank calls it with the same batch)."""
        return self._packed_log_probs(self.packed, batch, routes)

    @torch.no_grad()
    def reference_log_probs(self, batch: TrainBatch, routes: torch.Tensor | None = None) -> torch.Tensor:
        """The frozen reference policy's log probs of the trained tokens, (B, T) on CPU (0 elsewhere):
        the same packed micro-batches, head and route replay as `log_probs`. A collective under FSDP2."""
        if self.ref_packed is None:
            raise ReferencePolicyError(
                "this policy holds no reference policy (it is built only when algorithm.kl_coef > 0)"
            )
        return self._packed_log_probs(self.ref_packed, batch, routes)

    def _packed_log_probs(
        self, module: torch.nn.Module, batch: TrainBatch, routes: torch.Tensor | None
    ) -> torch.Tensor:
        self._check_routes(batch, routes)
        if self.config.router_replay != "rollout":
            routes = None  # nothing to replay, and this pass's routing statistics would be discarded
        out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
        mbs, _ = self._microbatches(batch, list(range(batch.input_ids.shape[0])))
        for mb in mbs:
            with self._routing(mb, routes, module=module):
                logp, _ = self._forward(mb, module)
            out[mb.loss_rows, mb.loss_cols] = logp.float().cpu()
        return self._all_reduce_(out.to(self.device)).cpu() if self.world_size > 1 else out

    @torch.no_grad()
    def replay_gap(self, batch: TrainBatch, routes: torch.Tensor) -> dict[str, float]:
        """|trainer − rollout| log prob of the sampled tokens with replay off and on (two extra
        forwards): `router_replay/logp_gap_{off,on}_{mean,max}`, over all ranks."""
        mbs, _ = self._microbatches(batch, list(range(batch.input_ids.shape[0])))
        out: dict[str, float] = {}
        for mode in ("off", "on"):
            acc = torch.zeros(2 + self.world_size, dtype=torch.float64)  # sum, count, each rank's max
            for mb in mbs:
                with self._routing(mb, routes if mode == "on" else None, apply=True):
                    logp, _ = self._forward(mb)
                gap = (logp.float().cpu() - mb.gather(batch.behaviour_logp)).abs().double()
                if gap.numel():
                    acc[0] += gap.sum()
                    acc[1] += gap.numel()
                    acc[2 + self.rank] = torch.maximum(acc[2 + self.rank], gap.max())
            if self.world_size > 1:
                acc = self._all_reduce_(acc.to(self.device)).cpu()
            out[f"router_replay/logp_gap_{mode}_mean"] = float(acc[0] / acc[1]) if acc[1] > 0 else 0.0
            out[f"router_replay/logp_gap_{mode}_max"] = float(acc[2:].max())
        return out

    def _proximal(
        self, batch: TrainBatch, mode: ProximalMode, routes: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """(B, T) proximal log probs known before the updates, or None where each micro-batch makes its own
        (`mode`: the step's resolved proximal mode)."""
        if mode == "recompute":
            return self.log_probs(batch, routes)
        if mode == "bypass":
            return batch.behaviour_logp
        if mode in ("reuse", "loglinear"):
            return None
        raise ValueError(f"unknown proximal_mode {mode!r}")

    def _micro_proximal(
        self,
        mb: PackedMicroBatch,
        logp: torch.Tensor,
        behav: torch.Tensor,
        batch: TrainBatch,
        mode: ProximalMode,
    ) -> torch.Tensor:
        """Proximal log probs of one micro-batch from its own forward (reuse, loglinear)."""
        if mode == "reuse":
            return logp.detach()
        versions = mb.gather(batch.token_versions).to(logp.device)
        return loglinear_proximal(
            behav, logp.detach(), versions, self.version - 1, current_version=self.version
        )

    def train_step(
        self, batch: TrainBatch, mini_batch_rows: int, routes: torch.Tensor | None = None
    ) -> dict[str, float]:
        """One trainer step: proximal log probs, reference log probs (kl_coef > 0), advantages, one
        optimizer update per mini-batch.

        `routes`: the engine's MoE routes of the batch, (B, T, layers, top_k), -1 where the trainer
        routes (`arl.trainer.router_replay.routes_for_batch(samples, width=T)`); None for dense models."""
        cfg = self.config
        alg = cfg.algorithm
        self._check_routes(batch, routes)
        self._steps_done += 1
        gemm_metrics = self._recheck_gemms()
        aux_coef = cfg.router_aux_loss_coef if self._router_layers else 0.0
        route_stats = RoutingStats()  # the training forwards' routing: each sampled token counted once
        aux_total = 0.0  # Σ over updates of the token-weighted aux loss of this rank's micro-batches
        gap: dict[str, float] = {}
        if (
            routes is not None
            and cfg.router_replay_gap_every
            and self._steps_done % cfg.router_replay_gap_every == 0
        ):
            gap = self.replay_gap(batch, routes)  # before any update: the weights the gap is about
        on_cuda = self.device.type == "cuda"
        if on_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        n_rows = batch.input_ids.shape[0]
        proximal_mode = alg.resolve_proximal_mode(updates=-(-n_rows // mini_batch_rows))
        t0 = time.perf_counter()
        # Named ranges (arl.*): a profiled step (arl.trainer.profiling) reads by phase, host and device.
        with record_function("arl.proximal"):
            proximal = self._proximal(batch, proximal_mode, routes)
        t_prox = time.perf_counter() - t0
        peak_prox = torch.cuda.max_memory_allocated(self.device) if on_cuda else 0
        with record_function("arl.reference"):
            ref_logp, token_kl, ref_metrics = self._reference_phase(batch, routes, proximal)
        # Per trajectory (its segments count once in the group statistics), broadcast to its rows;
        # with KL in the reward, each trajectory's reward first loses kl_coef × its summed token KL.
        adv_rows = trajectory_advantages(
            batch, estimator=alg.advantage_estimator, token_kl=token_kl, kl_coef=alg.kl_coef
        )
        advantages = adv_rows[:, None].expand_as(batch.loss_mask)
        kl_in_loss = ref_logp is not None and alg.kl_in == "loss"
        # seq_is = "mask" with "remove": dropped sequences leave the denominators (the config rejects the
        # proximal modes that make proximal log probs only during the update, so `proximal` is here).
        keep_rows = (
            sequence_keep_rows(alg, proximal, batch.behaviour_logp, batch.loss_mask)
            if alg.seq_is_mask_denominator == "remove" and proximal is not None
            else None
        )
        norm_len = alg.resolve_norm_len(cfg.loss_agg_norm_len)
        if on_cuda:
            # the update's own peak, not the passes' before it
            torch.cuda.reset_peak_memory_stats(self.device)
        # Proximal log probs made micro-batch by micro-batch (reuse / loglinear), for the step's metric.
        made = torch.zeros(batch.loss_mask.shape, dtype=torch.float32) if proximal is None else None
        steps: list[dict[str, float]] = []
        lengths = row_lengths(batch)
        t_update = 0.0
        flops = 0.0
        tokens = 0
        processed = 0  # tokens the model ran, dummy micro-batches included
        offloaded = 0  # bytes of saved activations sent to host memory (activation_offload)
        skipped_nonfinite = 0  # updates left out because their gradient norm was NaN or inf
        for start in range(0, n_rows, mini_batch_rows):
            t1 = time.perf_counter()
            rows = list(range(start, min(n_rows, start + mini_batch_rows)))
            denom = Denominators.from_loss_mask(batch.loss_mask[rows], norm_len)
            if keep_rows is not None:  # counts over the kept sequences; batch_max's length stays the batch's
                denom = Denominators.from_loss_mask(
                    batch.loss_mask[rows] * keep_rows[rows, None], denom.norm_len
                )
            mbs, pack_stats = self._microbatches(batch, rows)
            mini_tokens = sum(lengths[r] for r in rows)  # all ranks': the aux loss's token weights sum to 1
            self.optimizer.zero_grad(set_to_none=True)
            if self.optimizer_state is not None and self.config.optimizer_prefetch:
                with record_function("arl.optimizer_prefetch"):
                    self.optimizer_state.prefetch()  # AdamW's state comes back beside the forward and backward
            loss_total = 0.0
            mb_metrics: list[dict[str, float]] = []
            for i, mb in enumerate(mbs):
                self._grad_sync(i == len(mbs) - 1)
                # Backward inside the context: recomputed (checkpointed) layers must route as the forward did.
                with self._routing(mb, routes, keep_for_aux=aux_coef > 0) as rstats:
                    # activation_offload on CUDA: the forward's saved activations go to host memory
                    with self._offload() as hooks, record_function("arl.forward"):
                        logp, entropy = self._forward(mb)
                    offloaded += hooks.offloaded_bytes if hooks is not None else 0
                    rstats.recording = False
                    if (
                        mb.num_loss_tokens == 0
                    ):  # a dummy (or prompt-only) micro-batch: keep the graph, add nothing
                        loss = logp.sum() * 0.0 + entropy.sum() * 0.0
                    else:
                        dev = logp.device
                        behav = mb.gather(batch.behaviour_logp).to(dev)
                        adv = mb.gather(advantages).to(dev)
                        if proximal is None:
                            prox = self._micro_proximal(mb, logp, behav, batch, proximal_mode)
                            made[mb.loss_rows, mb.loss_cols] = prox.float().cpu()
                        else:
                            prox = mb.gather(proximal).to(dev)
                        seq_index = mb.seq_index.to(dev)
                        ref = mb.gather(ref_logp).to(dev) if kl_in_loss else None
                        tok_loss, info = compute_token_loss(
                            alg,
                            logp,
                            prox,
                            behav,
                            adv,
                            seq_index,
                            entropy=entropy,
                            ref_logp=ref,
                            num_seqs=len(mb.rows),
                        )
                        loss = aggregate(tok_loss, seq_index, cfg.loss_agg_mode, denom)
                        mb_metrics.append(info)
                    if aux_coef > 0:  # token-weighted over the mini-batch (a dummy micro-batch weighs 0)
                        share = mb.num_tokens / mini_tokens if mb.rows and mini_tokens else 0.0
                        aux = load_balancing_loss(rstats, self._num_experts) * share
                        loss = loss + aux_coef * aux
                        aux_total += float(aux.detach())
                    # Ranks' gradients are averaged by the data-parallel reduction; the denominators are global,
                    # so scale by the world size to make that average a sum.
                    with record_function("arl.backward"):
                        (loss * self.world_size).backward()
                route_stats.merge(rstats)
                loss_total += float(loss.detach())
                processed += mb.num_tokens
                if mb.rows:
                    flops += train_flops(self._n_matmul, [lengths[r] for r in mb.rows], *self._attn)
                    tokens += sum(lengths[r] for r in mb.rows)
            with record_function("arl.optimizer_step"):
                # The norm is global (all ranks' gradients), so every rank takes the same decision below.
                grad_norm = float(self._clip_grad_norm(cfg.optim.grad_clip))
                lr = self.optimizer.param_groups[0]["lr"]
                if self.optimizer_state is not None:
                    self.optimizer_state.load()  # the update waits for the state's copies (the host does not)
                if self.nonfinite.admit(grad_norm, loss_total, version=self.version):
                    self.optimizer.step()
                else:  # NaN/inf gradients would turn every weight NaN, and the replicas' after the sync
                    self.optimizer.zero_grad(set_to_none=True)
                    skipped_nonfinite += 1
                self.scheduler.step()
            t_update += time.perf_counter() - t1
            merged = self._merge_ranks(merge_loss_metrics(mb_metrics), loss_total)
            merged.update(
                grad_norm=grad_norm,
                lr=lr,
                loss_agg_norm_len=float(denom.norm_len),
                pack_fill=pack_stats["pack_fill"],
                rank_imbalance=pack_stats["rank_imbalance"],
                microbatches=pack_stats["microbatches"],
            )
            steps.append(merged)
        keys = set().union(*steps)
        out = {k: sum(s.get(k, 0.0) for s in steps) / len(steps) for k in keys}
        if self.optimizer_state is not None:
            with record_function("arl.optimizer_offload"):
                out.update(self._release_update_memory())
        if proximal is None:
            proximal = made if self.world_size == 1 else self._all_reduce_(made.to(self.device)).cpu()
        # How far the rollout engine's log probs are from the trainer's for the same weights/tokens:
        # near 0 on-policy; grows with staleness; a large value on fresh samples means a broken sync.
        out["behaviour_proximal_abs_diff"] = masked_mean(
            (proximal - batch.behaviour_logp).abs(), batch.loss_mask
        ).item()
        out["updates"] = float(len(steps))
        out["nonfinite_skipped"] = float(skipped_nonfinite)
        if self.gemm_check is not None and self.gemm_check.repaired:  # GEMMs planned for fewer SMs
            out["gemm_sm_target"] = float(self.gemm_check.sm_target)
        out.update(gemm_metrics)
        if kl_in_loss:  # the KL term the loss carried: token mean over each update, averaged over updates
            ref_metrics["kl_ref_mean"] = out.get("kl", 0.0)
        out.update(ref_metrics)
        out["proximal_s"] = t_prox
        out["proximal_reused"] = float(proximal_mode == "reuse")
        out["update_s"] = t_update
        out["train_tokens"] = float(tokens)
        out["train_tokens_per_s_per_gpu"] = tokens / t_update if t_update > 0 else 0.0
        out["train_tflops_per_gpu"] = flops / t_update / 1e12 if t_update > 0 else 0.0
        if cfg.peak_tflops > 0:
            out["mfu"] = out["train_tflops_per_gpu"] / cfg.peak_tflops
        # Real tokens over tokens computed: 1 when packed, except for dummy micro-batches (a rank with nothing to do).
        out["padding_efficiency"] = tokens / processed if processed else 1.0
        if self.config.activation_offload:
            # this rank, the whole step (each byte crosses out and back)
            out["offloaded_gib"] = offloaded / 2**30
        if on_cuda:
            out["peak_mem_proximal_gib"] = peak_prox / 2**30
            out["peak_mem_update_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        out.update(self._routing_metrics(route_stats, routes is not None, aux_total, len(steps)))
        out.update(gap)
        return out

    def _recheck_gemms(self) -> dict[str, float]:
        """Every `gemm_recheck_every` steps of a capped MPS client, its GEMMs checked again under the GPU's
        load of the moment (the replica's, in a concurrent run), and repaired further if they went wrong."""
        if not (self._gemm_recheck_every and self._steps_done % self._gemm_recheck_every == 0):
            return {}
        assert self.gemm_check is not None  # a recheck interval is set only after a startup check
        t0 = time.perf_counter()
        self.gemm_check = ensure_right_gemms(
            self.device,
            self.model,
            self.compute_dtype,
            current=self.gemm_check.sm_target,
            seed=3 * self._steps_done,  # fresh draws: the check takes seeds seed .. seed + 2
        )
        return {"gemm_recheck_s": time.perf_counter() - t0}

    def _release_update_memory(self) -> dict[str, float]:
        """optimizer_offload, after the step's last update: gradients dropped, AdamW state to host memory.
        Metrics: the state's way back (`optimizer_load_s`, its copies; `optimizer_load_wait_s`, what of
        it the update waited for: 0 when the prefetch hid it), the way out (`optimizer_offload_s`, the
        host's time in it: with `optimizer_offload_overlap` only the queuing, `settle_optimizer_offload`
        returns the rest), and the state's size."""
        state = self.optimizer_state
        assert state is not None
        self.optimizer.zero_grad(set_to_none=True)
        load_s, wait_s = state.load_times()
        t0 = time.perf_counter()
        moved = state.offload(overlap=self.config.optimizer_offload_overlap)
        return {
            "optimizer_offload_s": time.perf_counter() - t0,
            "optimizer_load_s": load_s,
            "optimizer_load_wait_s": wait_s,
            "optimizer_state_gib": moved / 2**30,
        }

    def _reference_phase(
        self,
        batch: TrainBatch,
        routes: torch.Tensor | None,
        proximal: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, dict[str, float]]:
        """With kl_coef > 0: (reference log probs (B, T), the per-token KL for the reward or None, metrics
        `ref_s`, `peak_mem_ref_gib` (CUDA) and, for KL in the reward, `kl_ref_mean`). Else (None, None, {}).

        KL in the reward is KL(π ‖ π_ref) of the policy *before* this step's updates: the proximal log
        probs where they exist before the updates (recompute: the trainer's forward; bypass: the
        rollout's), else (reuse, loglinear) the rollout's log probs, the policy that sampled the tokens."""
        alg = self.config.algorithm
        if not alg.needs_ref_logp:
            return None, None, {}
        on_cuda = self.device.type == "cuda"
        if on_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        ref_logp = self.reference_log_probs(batch, routes)
        metrics = {"ref_s": time.perf_counter() - t0}
        if on_cuda:
            metrics["peak_mem_ref_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        if alg.kl_in != "reward":
            return ref_logp, None, metrics
        before = proximal if proximal is not None else batch.behaviour_logp
        token_kl = alg.kl(before, ref_logp) * batch.loss_mask
        metrics["kl_ref_mean"] = masked_mean(token_kl, batch.loss_mask).item()
        return ref_logp, token_kl, metrics

    def _routing_metrics(
        self, stats: RoutingStats, had_routes: bool, aux_total: float, updates: int
    ) -> dict[str, float]:
        """The step's MoE routing metrics over all ranks (nothing for a dense model or a batch without routes)."""
        aux = self.config.router_aux_loss_coef > 0 and bool(self._router_layers)
        if not (had_routes or aux):
            return {}
        counts = stats.counts(self._router_layers, device=self.device)
        counts = torch.cat([counts, torch.tensor([aux_total], dtype=torch.float64, device=self.device)])
        if self.world_size > 1:
            counts = self._all_reduce_(counts)
        counts = counts.cpu()
        out = summarize(counts[:-1], self._router_layers, per_layer=True) if had_routes else {}
        if aux:
            out["router_replay/aux_loss"] = float(counts[-1]) / max(1, updates)
        return out

    def _merge_ranks(self, local: dict[str, float], loss: float) -> dict[str, float]:
        """One update's loss metrics over all ranks: counts summed, token means token-weighted; loss summed."""
        if self.world_size == 1:
            return local | {"loss": loss}
        import torch.distributed as dist

        # A rank with only dummy micro-batches has no metrics: agree on the key set first.
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, sorted(local))
        keys = sorted(set().union(*gathered) - {"num_tokens"})
        local = {k: local.get(k, 0.0) for k in keys} | {"num_tokens": local.get("num_tokens", 0.0)}
        n = local.get("num_tokens", 0.0)
        values = [n, loss] + [local[k] if k in COUNT_METRICS else local[k] * n for k in keys]
        reduced = self._all_reduce_(torch.tensor(values, dtype=torch.float64, device=self.device)).tolist()
        total = reduced[0]
        out = {"num_tokens": total, "loss": reduced[1]}
        for k, v in zip(keys, reduced[2:]):
            out[k] = v if k in COUNT_METRICS else (v / total if total > 0 else 0.0)
        return out

    def named_parameters_for_sync(self) -> list[tuple[str, torch.Tensor]]:
        """Parameters in Hugging Face checkpoint naming (what vLLM's load_weights expects). A list (the
        parameters themselves, no copies): arl-sync's sender reuses the plan of a list across syncs."""
        return [(name, p.detach()) for name, p in self.model.named_parameters()]
