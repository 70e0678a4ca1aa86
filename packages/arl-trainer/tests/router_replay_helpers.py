"""Helpers of the router-replay trainer tests: random samples with forced MoE routes, and the FSDP
ranks' body (spawned processes import it by module name; conftest puts this folder on sys.path)."""

from __future__ import annotations

import torch

from arl.queue import Response, Sample
from arl.queue.routed_experts import pack_routes
from arl.trainer import TrainerConfig, assemble_batch
from arl.trainer.config import OptimConfig
from arl.trainer.router_replay import routes_for_batch

VOCAB, LAYERS, EXPERTS, TOP_K = 64, 2, 8, 2


def routed_samples(seed=0, prompts=3, n=3):
    """Random samples whose responses carry random (forced) routes; one response per sample has a
    non-sampled token inside (its route is not replayed) and one has no routes (the trainer routes it)."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for p in range(prompts):
        prompt = torch.randint(1, VOCAB, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
        responses = []
        for j in range(n):
            length = int(torch.randint(2, 12, (1,), generator=g))
            mask = [1] * length
            if length > 3:
                mask[1] = 0
            routes = [
                [torch.randperm(EXPERTS, generator=g)[:TOP_K].tolist() for _ in range(LAYERS)]
                for _ in range(length)
            ]
            responses.append(
                Response(
                    response_ids=torch.randint(1, VOCAB, (length,), generator=g).tolist(),
                    response_mask=mask,
                    response_logprobs=(-torch.rand(length, generator=g) * 4).tolist(),
                    weight_versions=[0] * length,
                    reward=float(torch.rand(1, generator=g)),
                    routed_experts=None if (p, j) == (1, 2) else pack_routes(routes),
                )
            )
        samples.append(
            Sample(uid=f"s{p}", prompt_ids=prompt, responses=responses, start_version=0, end_version=0)
        )
    batch = assemble_batch(samples, pad_token_id=0)
    return batch, routes_for_batch(samples, width=batch.input_ids.shape[1])


def replay_config(**extra):
    return TrainerConfig(
        mixed_precision="none",
        optim=OptimConfig(lr=1e-2, grad_clip=1e9),
        max_tokens_per_microbatch=40,
        router_replay="rollout",
        router_replay_gap_every=1,
        router_aux_loss_coef=0.1,
        **extra,
    )


def two_rank_replay(spec, model_dir, out_dir):
    """A rank's body (spawned): one replayed FSDP2 step on the same batch and routes as every rank."""
    torch.set_num_threads(1)
    from arl.trainer.fsdp import FSDPPolicy

    batch, routes = routed_samples(seed=6)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    # FSDPPolicy's folder loader reads checkpoint names, and transformers saves MoE experts per expert
    # while its modules hold them fused: build from the config, then load the in-memory state dict.
    policy = FSDPPolicy(AutoConfig.from_pretrained(model_dir), replay_config(), spec)
    full = {}
    if spec.rank == 0:
        full = {
            f"hf.{k}": v
            for k, v in AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            .state_dict()
            .items()
        }
    set_model_state_dict(
        policy.packed, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    m = policy.train_step(batch, mini_batch_rows=batch.input_ids.shape[0], routes=routes)
    params = {n: p.detach().full_tensor() for n, p in policy.model.named_parameters()}
    if spec.rank == 0:
        torch.save({"m": m, "params": params}, out_dir / "replay_two_ranks.pt")
