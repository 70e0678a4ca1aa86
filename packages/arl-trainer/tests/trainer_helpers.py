"""Helpers of the trainer tests: deterministic random batches, and the FSDP ranks' bodies (spawned
processes import them by module name; conftest puts this folder on sys.path)."""

import torch

from arl.queue.types import Response, Sample
from arl.trainer import TrainerConfig, assemble_batch
from arl.trainer.config import OptimConfig


def random_batch(seed=0, prompts=3, n=4, vocab=64):
    g = torch.Generator().manual_seed(seed)
    samples = []
    for p in range(prompts):
        prompt = torch.randint(1, vocab, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
        responses = []
        for _ in range(n):
            length = int(torch.randint(1, 14, (1,), generator=g))
            ids = torch.randint(1, vocab, (length,), generator=g).tolist()
            mask = [1] * length
            if length > 3:
                mask[1] = 0  # a backfilled/tool token inside the response: not trained
            responses.append(
                Response(
                    response_ids=ids,
                    response_mask=mask,
                    response_logprobs=(-torch.rand(length, generator=g) * 4).tolist(),
                    weight_versions=[0] * length,
                    reward=float(torch.rand(1, generator=g)),
                )
            )
        samples.append(
            Sample(uid=f"s{p}", prompt_ids=prompt, responses=responses, start_version=0, end_version=0)
        )
    return assemble_batch(samples, pad_token_id=0)


def config():
    return TrainerConfig(
        optim=OptimConfig(lr=1e-2, grad_clip=1e9), mixed_precision="none", max_tokens_per_microbatch=40
    )


def two_rank_run(spec, model_dir, out_dir):
    torch.set_num_threads(1)
    from arl.trainer.checkpoint import export_hf, save_sharded
    from arl.trainer.fsdp import FSDPPolicy

    policy = FSDPPolicy(model_dir, config(), spec, sync_dtype=torch.bfloat16)
    b1, b2 = random_batch(seed=1), random_batch(seed=2)
    m1 = policy.train_step(b1, mini_batch_rows=b1.input_ids.shape[0])
    grads = {n: p.grad.full_tensor() for n, p in policy.model.named_parameters()}
    params = {n: p.detach().full_tensor() for n, p in policy.model.named_parameters()}
    save_sharded(policy, out_dir / "ckpt", {"step": 1, "version": 3})
    synced = stream_weights(policy)  # rank 0 sends through arl-sync while the other ranks drain
    export_hf(policy, out_dir / "hf")
    m2 = policy.train_step(b2, mini_batch_rows=b2.input_ids.shape[0])
    after = {n: p.detach().full_tensor() for n, p in policy.model.named_parameters()}
    # NaN on rank 0 only: the global gradient norm is NaN on both ranks, so both skip the update
    NaNSwitch(policy.model).on = spec.rank == 0
    m3 = policy.train_step(b1, mini_batch_rows=b1.input_ids.shape[0])
    after_nan = {n: p.detach().full_tensor() for n, p in policy.model.named_parameters()}
    skipped_kept = m3["nonfinite_skipped"] == 1.0 and all(
        torch.equal(after_nan[n], t) for n, t in after.items()
    )
    if spec.rank == 0:
        torch.save(
            {"m1": m1, "m2": m2, "grads": grads, "params": params, "synced": synced, "after": after},
            out_dir / "two_ranks.pt",
        )
    (out_dir / f"nan_skip_rank{spec.rank}.txt").write_text(str(skipped_kept))


class NaNSwitch:
    """A forward hook on the last decoder layer that turns its output NaN while `on` (a broken kernel)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.on = False
        model.model.layers[-1].register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        if not self.on:
            return output
        hidden = output[0] if isinstance(output, tuple) else output
        poisoned = hidden * float("nan")
        return (poisoned, *output[1:]) if isinstance(output, tuple) else poisoned


def one_rank_resume(spec, model_dir, out_dir):
    torch.set_num_threads(1)
    from arl.trainer.checkpoint import load_sharded
    from arl.trainer.fsdp import FSDPPolicy

    policy = FSDPPolicy(model_dir, config(), spec)
    state = load_sharded(policy, out_dir / "ckpt")
    b2 = random_batch(seed=2)
    m2 = policy.train_step(b2, mini_batch_rows=b2.input_ids.shape[0])
    after = {n: p.detach().full_tensor() for n, p in policy.model.named_parameters()}
    torch.save({"m2": m2, "after": after, "state": state}, out_dir / "one_rank.pt")


def stream_weights(policy):
    """Rank 0 publishes the gathered weights through a real arl-sync sender/receiver pair; the other
    ranks take part in the gathers. Returns what the receiver got (rank 0) or {}."""
    import asyncio

    import msgspec

    from arl.sync import SyncConfig, WeightReceiver
    from arl.trainer import WeightPublisher

    if policy.rank != 0:
        policy.drain_sync_parameters()
        return {}
    got = {}

    class Receiving:
        receiver = None

        async def update_weights(self, address, config_json, version):
            self.receiver = WeightReceiver(address, msgspec.json.decode(config_json, type=SyncConfig))
            return await asyncio.to_thread(
                self.receiver.receive, apply=lambda named: got.update((n, t.clone()) for n, t in named)
            )

    publisher = WeightPublisher(SyncConfig(transport="cpu", timeout_s=60), num_receivers=1)
    rollout = Receiving()
    try:
        asyncio.run(publisher.publish(policy.named_parameters_for_sync(), 1, rollout))
    finally:
        publisher.close()
        if rollout.receiver is not None:
            rollout.receiver.close()
    return got


def kl_config(**algorithm):
    from arl.trainer.algorithm_config import AlgorithmConfig

    return TrainerConfig(
        optim=OptimConfig(lr=1e-2, grad_clip=1e9),
        mixed_precision="none",
        max_tokens_per_microbatch=40,
        algorithm=AlgorithmConfig(**algorithm),
    )


def two_rank_reference(spec, model_dir, other_dir, out_dir):
    """FSDP2 ranks with a reference: their own initial shards (copied), and another model's folder."""
    torch.set_num_threads(1)
    from arl.trainer.fsdp import FSDPPolicy

    batch = random_batch(seed=4)
    rows = batch.input_ids.shape[0]
    own = FSDPPolicy(model_dir, kl_config(kl_coef=0.5), spec)
    own_ref = own.reference_log_probs(batch)
    own_metrics = own.train_step(batch, mini_batch_rows=rows)
    own_ref_after = own.reference_log_probs(batch)
    own_ref_params = {n: p.detach().full_tensor() for n, p in own.ref_packed.hf.named_parameters()}
    other = FSDPPolicy(model_dir, kl_config(kl_coef=0.5, kl_estimator="k1"), spec, reference_path=other_dir)
    other_ref = other.reference_log_probs(batch)
    other_metrics = other.train_step(batch, mini_batch_rows=rows)
    grads = {n: p.grad.full_tensor() for n, p in other.model.named_parameters()}
    if spec.rank == 0:
        torch.save(
            {
                "own_ref": own_ref,
                "own_metrics": own_metrics,
                "own_ref_after": own_ref_after,
                "own_ref_params": own_ref_params,
                "other_ref": other_ref,
                "other_metrics": other_metrics,
                "grads": grads,
                "frozen": not any(p.requires_grad for p in own.ref_packed.parameters()),
            },
            out_dir / "reference.pt",
        )


def fsdp_reference_gpu(spec, model_dir, out_dir):
    """FSDP2 on CUDA (NCCL, bf16 mixed precision) with a reference of the initial shards."""
    from arl.trainer.fsdp import FSDPPolicy

    cfg = kl_config(kl_coef=0.1)
    cfg.mixed_precision = "bf16"
    policy = FSDPPolicy(model_dir, cfg, spec)
    batch = random_batch(seed=3)
    ref = policy.reference_log_probs(batch)
    own = policy.log_probs(batch)
    dtypes = {str(p.dtype) for p in policy.ref_packed.parameters()}
    kls = [policy.train_step(random_batch(seed=s), mini_batch_rows=12)["kl_ref_mean"] for s in range(1, 4)]
    metrics = policy.train_step(batch, mini_batch_rows=12)
    if spec.rank == 0:
        torch.save(
            {"ref": ref, "own": own, "dtypes": dtypes, "kls": kls, "metrics": metrics},
            out_dir / "fsdp_gpu.pt",
        )


def fsdp_compiled_vs_eager(spec, model_dir, out_dir):
    """One FSDP2 group (every visible GPU): two steps eager, then two with `compile_layers`, both with
    full activation checkpointing; rank 0 saves the metrics and the names the sync stream gives."""
    from arl.trainer.fsdp import FSDPPolicy

    batch = random_batch(seed=7)
    result = {}
    for compiled in (False, True):
        policy = FSDPPolicy(
            model_dir,
            TrainerConfig(
                max_tokens_per_microbatch=40, compile_layers=compiled, activation_checkpointing="full"
            ),
            spec,
        )
        result[compiled] = [
            policy.train_step(batch, mini_batch_rows=batch.input_ids.shape[0]) for _ in range(2)
        ]
        result[f"names_{compiled}"] = [name for name, _ in policy.iter_sync_parameters()]
    if spec.rank == 0:
        torch.save(result, out_dir / "fsdp_compile.pt")


def fsdp_offload_vs_resident(spec, model_dir, out_dir):
    """One FSDP2 group (every visible GPU), fused AdamW, three steps from the same weights each way:
    the optimizer state resident, offloaded in the step, and offloaded beside the next weight gathers
    (`optimizer_offload_overlap`: every step's copies still in flight while a whole sync's gathers run,
    as in the colocated app, then settled). Rank 0 saves every run's full weights and metrics."""
    from arl.trainer.config import OptimConfig
    from arl.trainer.fsdp import FSDPPolicy

    batch = random_batch(seed=11)
    result = {}
    for mode in ("resident", "offload", "overlap"):
        policy = FSDPPolicy(
            model_dir,
            TrainerConfig(
                max_tokens_per_microbatch=40,
                optimizer_offload=mode != "resident",
                optimizer_offload_overlap=mode == "overlap",
                optim=OptimConfig(lr=1e-2, fused=True),
            ),
            spec,
        )
        metrics, leaving = [], []
        for _ in range(3):
            metrics.append(policy.train_step(batch, mini_batch_rows=4))
            state = policy.optimizer_state
            leaving.append(state is not None and state.leaving)
            policy.drain_sync_parameters()  # the sync's gathers, beside the state's way out
            policy.settle_optimizer_offload()
        result[f"metrics_{mode}"] = metrics
        result[f"leaving_{mode}"] = leaving
        result[f"weights_{mode}"] = policy.state_dict_cpu()
        result[f"on_host_{mode}"] = policy.optimizer_state is not None and policy.optimizer_state.on_host
    if spec.rank == 0:
        torch.save(result, out_dir / "fsdp_offload.pt")


def fsdp_offload_checkpoint_resume(spec, model_dir, out_dir):
    """FSDP2 with `optimizer_offload` and fused AdamW: one step, a checkpoint saved while the state waits
    on the host, a second policy resumed from it; both then take the same step. Rank 0 saves both
    policies' full weights and next-step metrics, and where the state was around the save."""
    from arl.trainer.fsdp import FSDPPolicy

    batch = random_batch(seed=12)
    cfg = TrainerConfig(
        max_tokens_per_microbatch=40, optimizer_offload=True, optim=OptimConfig(lr=1e-2, fused=True)
    )
    first = FSDPPolicy(model_dir, cfg, spec)
    first.train_step(batch, mini_batch_rows=4)
    result = {"on_host_before_save": first.optimizer_state.on_host}
    checkpoint = first.save(out_dir / "ckpt_offload", {"step": 1, "version": 1})
    result["on_host_after_save"] = first.optimizer_state.on_host
    resumed = FSDPPolicy(checkpoint, cfg, spec)
    result["trainer_state"] = resumed.load_optimizer(checkpoint)
    for label, policy in (("first", first), ("resumed", resumed)):
        result[f"metrics_{label}"] = policy.train_step(batch, mini_batch_rows=4)
        result[f"weights_{label}"] = policy.state_dict_cpu()
        result[f"on_host_{label}"] = policy.optimizer_state.on_host
    if spec.rank == 0:
        torch.save(result, out_dir / "fsdp_offload_ckpt.pt")


def fsdp_save_without_room_on_one_rank(spec, model_dir, out_dir):
    """Two ranks save a checkpoint that fits (rank 0 writes its estimated and written bytes to
    `sizes.txt`), then one where rank 1 sees a full disk: both must raise `CheckpointError` (no rank
    left in a collective); each writes what it raised to `raised_rank<r>.txt`."""
    torch.set_num_threads(1)
    import arl.trainer.checkpoint_space as space
    from arl.trainer.errors import CheckpointError
    from arl.trainer.fsdp import FSDPPolicy

    policy = FSDPPolicy(model_dir, config(), spec)
    policy.train_step(random_batch(seed=1), mini_batch_rows=4)
    saved = policy.save(out_dir / "fits", {"step": 1})  # first one that fits: its size against the estimate
    if spec.rank == 0:
        written = sum(f.stat().st_size for f in saved.rglob("*") if f.is_file())
        (out_dir / "sizes.txt").write_text(f"{policy.checkpoint_nbytes()} {written}")
    if spec.rank == 1:  # this rank's file system has a few bytes left
        space.free_bytes = lambda directory: 4096
    try:
        policy.save(out_dir / "ckpt", {"step": 1})
        raised = "nothing"
    except CheckpointError as e:
        raised = f"CheckpointError: {e}"
    (out_dir / f"raised_rank{spec.rank}.txt").write_text(raised)
