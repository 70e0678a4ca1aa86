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
            responses.append(Response(
                response_ids=ids, response_mask=mask,
                response_logprobs=(-torch.rand(length, generator=g) * 4).tolist(),
                weight_versions=[0] * length, reward=float(torch.rand(1, generator=g)),
            ))
        samples.append(Sample(uid=f"s{p}", prompt_ids=prompt, responses=responses, start_version=0, end_version=0))
    return assemble_batch(samples, pad_token_id=0)


def config():
    return TrainerConfig(optim=OptimConfig(lr=1e-2, grad_clip=1e9), mixed_precision="none",
                         max_tokens_per_microbatch=40, proximal_mode="recompute")


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
    synced = dict(policy.named_parameters_for_sync())  # every rank gathers; rank 0 would send
    export_hf(policy, out_dir / "hf")
    m2 = policy.train_step(b2, mini_batch_rows=b2.input_ids.shape[0])
    after = {n: p.detach().full_tensor() for n, p in policy.model.named_parameters()}
    if spec.rank == 0:
        torch.save({"m1": m1, "m2": m2, "grads": grads, "params": params, "synced": synced, "after": after},
                   out_dir / "two_ranks.pt")


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
