"""The startup GEMM check on the CPU: its comparison catches a wrong GEMM (a faulty `F.linear` stands
in for the capped MPS kernels), its search picks the largest SM target right on two fresh draws, and
the repair leaves that plan in place or, failing, restores the process's own (CUDA: test_gpu.py)."""

import pytest
import torch
import torch.nn.functional as F

from arl.trainer import gemm_check
from arl.trainer.errors import GemmCorrectnessError
from arl.trainer.gemm_check import (
    ROW_BAND,
    TOLERANCE,
    check_and_repair,
    find_sm_target,
    gemm_errors,
    linear_shapes,
    one_row_per_band,
)

SHAPES = [(100, 64, 16), (257, 96, 48)]
LINEAR = F.linear  # the real one, kept from before a test swaps in a faulty one


def test_right_gemms_measure_within_tolerance():
    errors = gemm_errors(torch.device("cpu"), SHAPES, torch.bfloat16, seed=0)
    assert set(errors) == set(SHAPES)
    assert max(errors.values()) < TOLERANCE / 4


@pytest.mark.parametrize("top", [0, 640, 960])
def test_a_gemm_wrong_in_one_tile_only_is_caught(monkeypatch, top):
    """A linear whose output is off in one 64 × 32 tile alone, as a kernel that misplans part of its
    grid would be: a compared row passes through every band of 64 rows, so no tile can hide."""

    def one_tile_wrong_linear(x, w, b=None):
        y = LINEAR(x, w, b)
        wrong = torch.zeros_like(y)
        wrong[top : top + 64, 96:128] = 3.0
        return y + wrong

    monkeypatch.setattr(gemm_check.F, "linear", one_tile_wrong_linear)
    errors = gemm_errors(torch.device("cpu"), [(1000, 64, 160)], torch.bfloat16, seed=0)
    assert errors[(1000, 64, 160)] > TOLERANCE


def test_one_row_is_compared_in_every_band():
    gen = torch.Generator().manual_seed(0)
    rows = one_row_per_band(1000, gen)
    assert len(rows) == 16 and rows.max() < 1000
    assert (rows // ROW_BAND).tolist() == list(range(16))


def test_a_nan_output_counts_as_wrong(monkeypatch):
    monkeypatch.setattr(gemm_check.F, "linear", lambda x, w, b=None: LINEAR(x, w, b) * float("nan"))
    assert gemm_errors(torch.device("cpu"), SHAPES[:1], torch.float32)[SHAPES[0]] == float("inf")


def test_the_device_plan_is_kept_when_right():
    calls = []
    assert find_sm_target(98, lambda target, seed: calls.append((target, seed)) or True) is None
    assert calls == [(None, 0)]


def test_the_largest_right_target_is_chosen():
    """Right at 68 SMs or fewer (the H100 at a 75% cap): the search walks down from 96 in steps of 2."""
    calls = []

    def right_at_68_or_fewer(target, seed):
        calls.append((target, seed))
        return target is not None and target <= 68

    assert find_sm_target(98, right_at_68_or_fewer) == 68
    assert calls[-2:] == [(68, 1), (68, 2)] and (70, 1) in calls


def test_a_target_right_on_one_draw_only_is_passed_over():
    assert (
        find_sm_target(
            98, lambda target, seed: target is not None and (target <= 60 or target == 80 and seed == 1)
        )
        == 60
    )


def test_no_right_target_raises_naming_the_remedy():
    with pytest.raises(GemmCorrectnessError, match="mps_trainer_sm_percent"):
        find_sm_target(20, lambda target, seed: False)


def test_the_model_shapes_are_distinct_bounded_and_leave_the_head_out():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1 << 21,
    )
    shapes = linear_shapes(Qwen2ForCausalLM(cfg))
    assert shapes == [(64, 32), (64, 64), (64, 128), (128, 64)]


@pytest.fixture
def blas_plan():
    """The process's GEMM plan (SM carveout, BLAS library), put back after the test."""
    library = torch.backends.cuda.preferred_blas_library()
    yield
    torch._C._set_sm_carveout_experimental(None)
    torch.backends.cuda.preferred_blas_library(library)


def right_only_planned_for(most_sms: int, sm_count: int = 98):
    """A linear that is wrong (one band of rows off) unless GEMMs are planned for `most_sms` SMs or
    fewer of `sm_count`, as a capped MPS client's were."""

    def linear(x, w, b=None):
        y = LINEAR(x, w, b)
        carveout = torch._C._get_sm_carveout_experimental()
        if carveout is None or sm_count - carveout > most_sms:
            y = y + torch.zeros_like(y).index_fill_(0, torch.arange(min(64, y.shape[0])), 5.0)
        return y

    return linear


right_only_planned_for_68_of_98 = right_only_planned_for(68)


def test_wrong_gemms_are_repaired_with_the_largest_right_target(monkeypatch, blas_plan):
    monkeypatch.setattr(gemm_check.F, "linear", right_only_planned_for_68_of_98)
    check = check_and_repair(torch.device("cpu"), 98, SHAPES, torch.bfloat16)
    assert check.repaired and check.sm_target == 68 and check.worst_error > TOLERANCE
    assert torch._C._get_sm_carveout_experimental() == 30  # left in place for the training
    assert str(torch.backends.cuda.preferred_blas_library()).endswith("Cublaslt")


def test_right_gemms_leave_the_plan_alone(blas_plan):
    library = torch.backends.cuda.preferred_blas_library()
    check = check_and_repair(torch.device("cpu"), 98, SHAPES, torch.bfloat16)
    assert not check.repaired and check.worst_error < TOLERANCE / 4
    assert torch._C._get_sm_carveout_experimental() is None
    assert torch.backends.cuda.preferred_blas_library() == library


def test_unrepairable_gemms_raise_with_the_plan_restored(monkeypatch, blas_plan):
    library = torch.backends.cuda.preferred_blas_library()
    monkeypatch.setattr(gemm_check.F, "linear", lambda x, w, b=None: LINEAR(x, w, b) + 5.0)
    with pytest.raises(GemmCorrectnessError, match="every cuBLASLt SM target from 98"):
        check_and_repair(torch.device("cpu"), 98, SHAPES[:1], torch.bfloat16)
    assert torch._C._get_sm_carveout_experimental() is None
    assert torch.backends.cuda.preferred_blas_library() == library


def test_the_check_is_for_cuda_devices():
    with pytest.raises(ValueError, match="CUDA"):
        gemm_check.ensure_right_gemms(torch.device("cpu"))


# As `right_only_planned_for_68_of_98`, after a neighbour's load moved the right plans lower.
right_only_planned_for_60_or_fewer_of_98 = right_only_planned_for(60)


def test_a_recheck_keeps_a_repair_that_is_still_right(monkeypatch, blas_plan):
    monkeypatch.setattr(gemm_check.F, "linear", right_only_planned_for_68_of_98)
    first = check_and_repair(torch.device("cpu"), 98, SHAPES, torch.bfloat16)
    again = check_and_repair(torch.device("cpu"), 98, SHAPES, torch.bfloat16, current=68, seed=30)
    assert (first.sm_target, again.sm_target) == (68, 68) and again.worst_error < TOLERANCE
    assert torch._C._get_sm_carveout_experimental() == 30


def test_a_recheck_walks_on_down_from_a_repair_that_went_wrong(monkeypatch, blas_plan):
    """Planned for 68 SMs, right at startup; under new load only 60 or fewer are right: the re-check
    walks down from 68, not from the device's count, and leaves 60 in place."""
    monkeypatch.setattr(gemm_check.F, "linear", right_only_planned_for_60_or_fewer_of_98)
    tried = []
    real_set = gemm_check.set_sm_target
    monkeypatch.setattr(gemm_check, "set_sm_target", lambda t, n: tried.append(t) or real_set(t, n))
    check = check_and_repair(torch.device("cpu"), 98, SHAPES, torch.bfloat16, current=68, seed=30)
    assert check.sm_target == 60 and check.worst_error > TOLERANCE
    assert tried[0] == 68 and max(t for t in tried if t is not None) == 68
    assert torch._C._get_sm_carveout_experimental() == 38


@pytest.mark.parametrize(
    ("cap", "every"),
    [(None, 0), ("100", 0), ("75", 10), (" 90 ", 10), ("0", 0), ("half", 0)],
)
def test_only_a_capped_mps_client_rechecks(cap, every):
    environ = {} if cap is None else {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": cap}
    assert gemm_check.recheck_every(10, environ) == every


def test_a_capped_policy_rechecks_its_gemms_every_few_steps(tiny_model_dir, monkeypatch, blas_plan):
    """The policy re-checks every `gemm_recheck_every` steps from the plan it runs on, and its metrics
    carry the new target. The CPU stands in for the capped GPU: its real check on 98 nominal SMs, with
    the faulty linear that load made right only at 60 SMs or fewer."""
    from trainer_helpers import random_batch

    from arl.trainer import HFPolicy, TrainerConfig, engine
    from arl.trainer.gemm_check import GemmCheck

    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "75")
    policy = HFPolicy(tiny_model_dir, TrainerConfig(gemm_recheck_every=2))
    assert policy.gemm_check is None  # no startup check off CUDA: put in what a capped H100's gave
    policy.gemm_check = GemmCheck(sm_count=98, worst_error=261.0, sm_target=68)
    policy._gemm_recheck_every = gemm_check.recheck_every(policy.config.gemm_recheck_every)
    gemm_check.set_sm_target(68, 98)
    monkeypatch.setattr(gemm_check.F, "linear", right_only_planned_for_60_or_fewer_of_98)
    monkeypatch.setattr(
        engine,
        "ensure_right_gemms",
        lambda device, model, dtype, current, seed: check_and_repair(
            torch.device("cpu"), 98, gemm_check.check_shapes(model), torch.float32, current, seed
        ),
    )
    batch = random_batch(seed=1)
    rows = batch.input_ids.shape[0]
    first = policy.train_step(batch, mini_batch_rows=rows)
    second = policy.train_step(batch, mini_batch_rows=rows)
    assert "gemm_recheck_s" not in first and first["gemm_sm_target"] == 68
    assert second["gemm_recheck_s"] > 0 and second["gemm_sm_target"] == 60
