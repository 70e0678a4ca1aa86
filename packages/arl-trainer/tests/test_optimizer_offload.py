"""`optimizer_offload` and `optim.fused` off CUDA: both are no-ops, so a CPU run trains exactly as before.

What they do on CUDA (the state freed between steps, bit-identical updates, checkpoints while the state
waits on the host, FSDP2's DTensor state) is asserted on a GPU in test_gpu.py.
"""

import torch

from arl.trainer import HFPolicy, TrainerConfig
from arl.trainer.config import OptimConfig

from trainer_helpers import random_batch

torch.set_num_threads(1)


def test_optimizer_offload_and_fused_are_noops_on_cpu(tiny_model_dir):
    batch = random_batch(seed=6)
    weights = []
    for on in (False, True):
        cfg = TrainerConfig(optim=OptimConfig(lr=1e-2, fused=on), mixed_precision="none",
                            max_tokens_per_microbatch=40, optimizer_offload=on)
        policy = HFPolicy(tiny_model_dir, cfg)
        assert policy.optimizer_state is None
        assert not policy.optimizer.defaults.get("fused")  # the fused step is CUDA's
        metrics = [policy.train_step(batch, mini_batch_rows=6) for _ in range(2)]
        assert "optimizer_offload_s" not in metrics[-1]
        weights.append({n: p.detach().clone() for n, p in policy.model.named_parameters()})
    for name, w in weights[0].items():
        assert torch.equal(w, weights[1][name]), name
