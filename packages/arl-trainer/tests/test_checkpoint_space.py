"""Checkpoints check the disk before writing: the estimate bounds what a save writes, a save that
cannot fit raises `CheckpointError` naming the folder before writing anything, a write that fails
part-way leaves no partial folder, and the previous checkpoint stays as it was in both cases. Under
FSDP2 (2 gloo ranks) one rank's full disk makes every rank raise, none waits in a collective."""

import errno
import json

import pytest
import torch
from trainer_helpers import config, fsdp_save_without_room_on_one_rank, random_batch

import arl.trainer.backend as backend
import arl.trainer.checkpoint_space as space
from arl.trainer import HFPolicy
from arl.trainer.distributed import spawn_local
from arl.trainer.errors import CheckpointError

torch.set_num_threads(1)


def _trained(tiny_model_dir):
    policy = HFPolicy(tiny_model_dir, config())
    batch = random_batch(seed=5)
    policy.train_step(batch, mini_batch_rows=batch.input_ids.shape[0])  # the optimizer has state now
    return policy


def _folder_bytes(folder):
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _snapshot(folder):
    return {f.relative_to(folder): f.read_bytes() for f in folder.rglob("*") if f.is_file()}


def test_the_estimate_bounds_what_a_save_writes(tiny_model_dir, tmp_path):
    policy = _trained(tiny_model_dir)
    estimate = policy.checkpoint_nbytes()
    written = _folder_bytes(policy.save(tmp_path / "ckpt", {"step": 1}))
    assert estimate - space.OVERHEAD_BYTES <= written <= estimate  # tensors' bytes, plus headers and configs


def test_the_estimate_before_the_first_step_bounds_the_checkpoints_after_it(tiny_model_dir, tmp_path):
    """What a run checks at its start (no optimizer state yet) covers what its checkpoints write."""
    policy = HFPolicy(tiny_model_dir, config())
    before = policy.checkpoint_nbytes()
    batch = random_batch(seed=5)
    policy.train_step(batch, mini_batch_rows=batch.input_ids.shape[0])
    written = _folder_bytes(policy.save(tmp_path / "ckpt", {"step": 1}))
    assert before - space.OVERHEAD_BYTES <= written <= before
    assert policy.checkpoint_nbytes() == pytest.approx(before, rel=1e-3)  # + AdamW's scalar step counts


def test_a_save_that_cannot_fit_raises_before_writing_and_keeps_the_previous(
    tiny_model_dir, tmp_path, monkeypatch
):
    policy = _trained(tiny_model_dir)
    previous = policy.save(tmp_path / "ckpt", {"step": 1})
    before = _snapshot(previous)
    monkeypatch.setattr(space, "free_bytes", lambda directory: 1 << 20)  # 1 MiB free
    with pytest.raises(CheckpointError, match=r"checkpoint .*ckpt\.tmp.*GiB short"):
        policy.save(tmp_path / "ckpt", {"step": 2})
    assert not (tmp_path / "ckpt.tmp").exists()
    assert _snapshot(previous) == before


def test_a_write_that_fails_part_way_leaves_no_partial_folder(tiny_model_dir, tmp_path, monkeypatch):
    policy = _trained(tiny_model_dir)
    previous = policy.save(tmp_path / "ckpt", {"step": 1})
    before = _snapshot(previous)
    real_save = torch.save

    def disk_full_at_the_optimizer(obj, path, *args, **kwargs):
        if str(path).endswith("optimizer.pt"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(backend.torch, "save", disk_full_at_the_optimizer)
    with pytest.raises(OSError, match="No space left"):
        policy.save(tmp_path / "ckpt", {"step": 2})
    assert not (tmp_path / "ckpt.tmp").exists()  # the weights it had written are gone too
    assert _snapshot(previous) == before
    assert json.loads((previous / "trainer_state.json").read_text()) == {"step": 1}


def test_fsdp2_every_rank_raises_when_one_rank_has_no_room(tiny_model_dir, tmp_path):
    spawn_local(
        fsdp_save_without_room_on_one_rank, 2, tiny_model_dir, tmp_path, backend="gloo", timeout_s=120
    )
    estimate, written = map(int, (tmp_path / "sizes.txt").read_text().split())
    # the shards and the HF export, global sizes
    assert estimate - space.OVERHEAD_BYTES <= written <= estimate
    raised = [(tmp_path / f"raised_rank{rank}.txt").read_text() for rank in (0, 1)]
    assert raised[0].startswith("CheckpointError: checkpoint ") and "GiB short" in raised[0], raised
    assert raised[1] == raised[0]  # the same sizes on both ranks: the shortfall was agreed on
    assert not (tmp_path / "ckpt.tmp").exists() and not (tmp_path / "ckpt").exists()
