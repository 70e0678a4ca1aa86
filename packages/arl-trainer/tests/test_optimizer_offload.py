"""`optimizer_offload` and `optim.fused`: no-ops off CUDA; `HostOptimizerState`'s freeing and restoring
exercised on CPU state; a clear error for state it cannot free.

On CUDA (pinned host buffers, the real memory drop, fused AdamW, FSDP2's DTensor state) the same is
asserted on a GPU in test_gpu.py.
"""

import pytest
import torch
from trainer_helpers import random_batch

from arl.trainer import HFPolicy, TrainerConfig
from arl.trainer.config import OptimConfig
from arl.trainer.optimizer import HostOptimizerState, copy_groups

torch.set_num_threads(1)


def test_optimizer_offload_and_fused_are_noops_on_cpu(tiny_model_dir):
    batch = random_batch(seed=6)
    weights = []
    for on in (False, True):
        cfg = TrainerConfig(
            optim=OptimConfig(lr=1e-2, fused=on),
            mixed_precision="none",
            max_tokens_per_microbatch=40,
            optimizer_offload=on,
        )
        policy = HFPolicy(tiny_model_dir, cfg)
        assert policy.optimizer_state is None
        assert not policy.optimizer.defaults.get("fused")  # the fused step is CUDA's
        metrics = [policy.train_step(batch, mini_batch_rows=6) for _ in range(2)]
        assert "optimizer_offload_s" not in metrics[-1]
        weights.append({n: p.detach().clone() for n, p in policy.model.named_parameters()})
    for name, w in weights[0].items():
        assert torch.equal(w, weights[1][name]), name


def _state_tensors(policy):
    return [
        v for state in policy.optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)
    ]


@pytest.mark.parametrize("prefetch", [False, True])
def test_host_optimizer_state_frees_and_restores_the_state_bit_for_bit(tiny_model_dir, tmp_path, prefetch):
    """The mechanism the backends use on CUDA, run on CPU state (moved to other CPU buffers): between
    steps every state tensor's storage is freed and the gradients are gone; the updates, and a resume
    from a checkpoint saved while the state is out, equal the resident run's bit for bit, whether the
    state comes back as the step's first forward begins (prefetch) or right before the update."""
    batch = random_batch(seed=8)
    cfg = TrainerConfig(
        optim=OptimConfig(lr=1e-2),
        mixed_precision="none",
        max_tokens_per_microbatch=40,
        optimizer_prefetch=prefetch,
    )
    resident, moved = HFPolicy(tiny_model_dir, cfg), HFPolicy(tiny_model_dir, cfg)
    moved.optimizer_state = HostOptimizerState(moved.optimizer, device_type="cpu")
    for _ in range(3):
        resident.train_step(batch, mini_batch_rows=6)  # two updates per step
        metrics = moved.train_step(batch, mini_batch_rows=6)
        assert moved.optimizer_state.on_host and metrics["optimizer_state_gib"] > 0
        assert metrics["optimizer_load_wait_s"] == 0.0  # CPU copies are synchronous: nothing to wait for
        assert all(t.untyped_storage().nbytes() == 0 for t in _state_tensors(moved))
        assert all(p.grad is None for p in moved.model.parameters())
    for (name, a), (_, b) in zip(
        resident.model.named_parameters(), moved.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name

    checkpoint = moved.save(tmp_path / "ckpt", {"step": 3})
    assert moved.optimizer_state.on_host  # saving brought the state back and returned it
    resumed = HFPolicy(checkpoint, cfg)
    resumed.load_optimizer(checkpoint)
    for policy in (resident, resumed):
        policy.train_step(batch, mini_batch_rows=6)
    for (name, a), (_, b) in zip(
        resident.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_host_optimizer_state_refuses_state_that_shares_its_storage(tiny_model_dir):
    policy = HFPolicy(tiny_model_dir, TrainerConfig(mixed_precision="none", max_tokens_per_microbatch=40))
    policy.train_step(random_batch(seed=9), mini_batch_rows=12)
    param = next(iter(policy.optimizer.state))
    policy.optimizer.state[param]["exp_avg"] = torch.zeros(2 * param.numel())[: param.numel()].view_as(param)
    state = HostOptimizerState(policy.optimizer, device_type="cpu")
    with pytest.raises(ValueError, match=r"exp_avg.*does not own its storage alone"):
        state.offload()
    # nothing freed
    assert not state.on_host and all(t.untyped_storage().nbytes() > 0 for t in _state_tensors(policy))


def test_host_arena_lays_tensors_out_exactly_and_is_reused_while_the_state_keeps_its_shapes(tiny_model_dir):
    """One buffer of the state's bytes (each tensor at a page boundary, none overlapping), reused by
    every offload while the state's shapes stay the same."""
    from arl.trainer.host_arena import ALIGN_BYTES, HostArena

    specs = [((3, 5), torch.float32), ((), torch.float32), ((7,), torch.bfloat16), ((2, 2), torch.float64)]
    arena = HostArena(specs, pinned=False)
    sizes = [torch.Size(s).numel() * d.itemsize for s, d in specs]
    starts = [v.data_ptr() - arena.buffer.data_ptr() for v in arena.views]
    assert all(s % ALIGN_BYTES == 0 for s in starts)
    assert all(a + n <= b for a, n, b in zip(starts, sizes, starts[1:], strict=False))  # no overlap
    assert arena.nbytes == starts[-1] + sizes[-1] and [tuple(v.shape) for v in arena.views] == [
        s for s, _ in specs
    ]
    assert arena.holds(specs) and not arena.holds(specs[:-1])

    policy = HFPolicy(
        tiny_model_dir,
        TrainerConfig(optim=OptimConfig(lr=1e-2), mixed_precision="none", max_tokens_per_microbatch=40),
    )
    policy.optimizer_state = HostOptimizerState(policy.optimizer, device_type="cpu")
    batch = random_batch(seed=10)
    policy.train_step(batch, mini_batch_rows=12)
    first = policy.optimizer_state._arena
    policy.train_step(batch, mini_batch_rows=12)
    assert policy.optimizer_state._arena is first
    assert first.nbytes < policy.optimizer_state.nbytes + ALIGN_BYTES * len(first.views)


def _trained_policy_and_its_state(tiny_model_dir, seed):
    """A policy after one step, a copy of its optimizer state, and a `HostOptimizerState` over it (CPU)."""
    policy = HFPolicy(
        tiny_model_dir,
        TrainerConfig(optim=OptimConfig(lr=1e-2), mixed_precision="none", max_tokens_per_microbatch=40),
    )
    policy.train_step(random_batch(seed=seed), mini_batch_rows=12)
    expected = [t.clone() for t in _state_tensors(policy)]
    return policy, expected, HostOptimizerState(policy.optimizer, device_type="cpu")


def test_prefetched_state_is_in_place_before_the_update_and_a_second_prefetch_is_a_noop(tiny_model_dir):
    """`prefetch` gives every tensor its storage and values back at once; `load` after it (the update)
    and a repeated `prefetch` move nothing again; the state stays "on the host" for `offload` until loaded."""
    policy, expected, state = _trained_policy_and_its_state(tiny_model_dir, seed=11)
    state.offload()
    state.prefetch()
    assert state.prefetching and state.on_host
    assert all(torch.equal(a, b) for a, b in zip(_state_tensors(policy), expected, strict=True))
    host_views = [host for _, host in state._offloaded]
    for host in host_views:  # a second prefetch would copy these in again
        host.fill_(float("nan"))
    state.prefetch()
    assert state.load() == state.nbytes and not state.on_host and not state.prefetching
    assert all(torch.equal(a, b) for a, b in zip(_state_tensors(policy), expected, strict=True))


def test_copy_groups_pace_the_prefetch_by_bytes():
    """The paced prefetch's groups: consecutive, every tensor once, each reaching the group size (a larger
    tensor alone), the rest last; size 0 queues everything at once."""
    sizes = [10, 10, 30, 5, 5, 5, 100, 1]
    groups = copy_groups(sizes, 20)
    assert [list(g) for g in groups] == [[0, 1], [2], [3, 4, 5, 6], [7]]
    assert [i for g in groups for i in g] == list(range(len(sizes)))
    assert [list(g) for g in copy_groups(sizes, 0)] == [list(range(len(sizes)))]
    assert copy_groups([], 20) == [] and copy_groups([], 0) == []


def test_a_negative_prefetch_pace_is_refused_by_name():
    with pytest.raises(ValueError, match="optimizer_prefetch_inflight_mb"):
        TrainerConfig(optimizer_prefetch_inflight_mb=-1)


def test_an_overlapped_offload_off_cuda_is_synchronous_and_has_nothing_to_settle(tiny_model_dir):
    """`optimizer_offload_overlap` queues CUDA copies; CPU state's copies are synchronous, so the step
    returns with the storage already freed and `settle_optimizer_offload` waits for nothing."""
    cfg = TrainerConfig(
        optim=OptimConfig(lr=1e-2),
        mixed_precision="none",
        max_tokens_per_microbatch=40,
        optimizer_offload_overlap=True,
    )
    policy = HFPolicy(tiny_model_dir, cfg)
    assert policy.settle_optimizer_offload() == 0.0  # no offload at all (CPU: optimizer_state is None)
    policy.optimizer_state = HostOptimizerState(policy.optimizer, device_type="cpu")
    policy.train_step(random_batch(seed=12), mini_batch_rows=6)
    state = policy.optimizer_state
    assert state.on_host and not state.leaving
    assert all(t.untyped_storage().nbytes() == 0 for t in _state_tensors(policy))
    assert policy.settle_optimizer_offload() == 0.0 and state.offload_times() == (0.0, 0.0)


def test_a_failed_overlapped_offload_leaves_the_state_on_the_device(tiny_model_dir, monkeypatch):
    """If the way out's copies fail, `settle` re-raises and the state stays where it is whole: on the
    device (its storage was never freed), not half on the host."""
    policy, expected, state = _trained_policy_and_its_state(tiny_model_dir, seed=13)
    state.offload()
    state.load()
    state.leaving, state.on_host = True, True  # as an overlapped offload leaves it, before settle

    def failed_copies():
        raise RuntimeError("copy failed")

    monkeypatch.setattr(state, "_join_pacer", failed_copies)
    with pytest.raises(RuntimeError, match="copy failed"):
        state.settle()
    assert not state.on_host and not state.leaving
    assert all(torch.equal(a, b) for a, b in zip(_state_tensors(policy), expected, strict=True))
    assert state.offload() == state.nbytes  # and can go out again
