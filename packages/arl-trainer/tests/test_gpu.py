"""GPU paths (skipped without CUDA): torch's fused varlen attention and the bf16 chunked head."""

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_fused_varlen_attention_matches_per_sequence_sdpa():
    from arl.trainer.attention import _per_sequence_sdpa, fused_available, varlen_causal

    dev = torch.device("cuda")
    assert fused_available(dev, torch.bfloat16), "torch.nn.attention.varlen is missing in this torch"
    torch.manual_seed(0)
    lengths = [1, 37, 300, 1024, 5]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    t = sum(lengths)
    q = torch.randn(t, 14, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(t, 2, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(t, 2, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    out = varlen_causal(q, k, v, cu, max(lengths), None)
    ref = _per_sequence_sdpa(q.float(), k.float(), v.float(), cu, None)
    assert (out.float() - ref).abs().max() < 3e-2
    g = torch.randn_like(ref)
    got = torch.autograd.grad((out.float() * g).sum(), [q, k, v])
    want = torch.autograd.grad((ref * g).sum(), [q, k, v])
    for a, b in zip(got, want):
        assert ((a.float() - b).norm() / b.norm()) < 2e-2


def test_chunked_head_bf16_matches_fp32_reference_on_gpu():
    from arl.trainer.head import chunked_log_probs

    torch.manual_seed(0)
    dev = torch.device("cuda")
    h = torch.randn(3000, 896, device=dev).mul(0.5).to(torch.bfloat16).requires_grad_()
    w = torch.randn(151936, 896, device=dev).mul(0.02).to(torch.bfloat16).requires_grad_()
    tgt = torch.randint(0, 151936, (3000,), device=dev)
    logp, ent = chunked_log_probs(h, w, tgt)
    hr, wr = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ref_all = torch.log_softmax(hr @ wr.t(), -1)
    ref = ref_all.gather(1, tgt[:, None])[:, 0]
    ref_ent = -(ref_all.exp() * ref_all).sum(-1)
    assert (logp - ref).abs().max() < 5e-2
    assert ((ent - ref_ent).norm() / ref_ent.norm()) < 1e-2
    g1, g2 = torch.randn(3000, device=dev), torch.randn(3000, device=dev)
    got = torch.autograd.grad((logp * g1).sum() + (ent * g2).sum(), [h, w])
    want = torch.autograd.grad((ref * g1).sum() + (ref_ent * g2).sum(), [hr, wr])
    assert got[0].dtype == torch.bfloat16 and got[1].dtype == torch.bfloat16
    for a, b in zip(got, want):  # the weight's gradient accumulates over chunks in fp32 (addmm out_dtype)
        assert ((a.float() - b).norm() / b.norm()) < 2e-2


def test_triton_reduction_matches_fp64_on_gpu():
    """The head's Triton kernel on real bf16 logits (a full chunk and a short tail chunk): the reduction
    itself is fp32, so it agrees with an fp64 reduction of the same bf16 values to ~1e-6."""
    from arl.trainer.head_triton import logit_stats

    torch.manual_seed(0)
    for rows in (882, 5):
        z = torch.randn(rows, 151936, device="cuda").mul(3).to(torch.bfloat16)
        lse, ent = logit_stats(z, 1 / 0.8, torch.float32)
        ref = torch.log_softmax(z.double() / 0.8, -1)
        assert (
            (lse.double() - torch.logsumexp(z.double() / 0.8, -1)).abs() / lse.double().abs()
        ).max() < 1e-5
        assert ((ent.double() + (ref.exp() * ref).sum(-1)).abs() / ent.double().abs()).max() < 1e-5


def test_triton_gradient_kernel_matches_fp32_formula_on_gpu():
    """The head's Triton gradient pass on a real chunk (883 × 151,936 bf16 logits) against the eager formula
    in fp32: the same fp32 values rounded once to bf16, so at most one bf16 step apart; the target's
    entry (formed in fp32 before the cast) agrees to bf16 rounding as well."""
    from arl.trainer.head import _logit_grads_with_target
    from arl.trainer.head_triton import logit_grads

    torch.manual_seed(0)
    n, vocab, inv_t = 883, 151936, 1 / 0.8
    z = torch.randn(n, vocab, device="cuda").mul(3).to(torch.bfloat16)
    lse = torch.logsumexp(z.float() * inv_t, -1)
    a, b, c = (torch.randn(n, device="cuda") for _ in range(3))
    targets = torch.randint(0, vocab, (n,), device="cuda")
    got = logit_grads(z, lse, a, b, c, targets, inv_t)
    assert got.dtype == torch.bfloat16 and got.shape == z.shape
    want = _logit_grads_with_target(z.float(), lse, a, b, c, targets, inv_t)  # fp32 throughout
    assert ((got.float() - want).norm() / want.norm()) < 4e-3
    rows = torch.arange(n, device="cuda")
    at_t, want_t = got[rows, targets].float(), want[rows, targets]
    assert ((at_t - want_t).abs() <= 2**-7 * want_t.abs() + 1e-30).all()


def test_bf16_packed_train_step_on_gpu(tiny_model_dir):
    from trainer_helpers import random_batch

    from arl.trainer import HFPolicy, TrainerConfig

    policy = HFPolicy(tiny_model_dir, TrainerConfig(max_tokens_per_microbatch=40), device="cuda")
    assert policy.compute_dtype == torch.bfloat16  # auto → bf16 on CUDA
    batch = random_batch(seed=5)
    m = policy.train_step(batch, mini_batch_rows=batch.input_ids.shape[0])
    assert m["grad_norm"] > 0 and m["peak_mem_update_gib"] > 0
    assert next(policy.model.parameters()).dtype == torch.float32


def test_compiled_layers_train_step_matches_eager_on_gpu(tiny_model_dir):
    from trainer_helpers import random_batch

    from arl.trainer import HFPolicy, TrainerConfig

    batch = random_batch(seed=7)
    metrics = {}
    for compiled in (False, True):
        policy = HFPolicy(
            tiny_model_dir,
            TrainerConfig(max_tokens_per_microbatch=40, compile_layers=compiled),
            device="cuda",
        )
        metrics[compiled] = [
            policy.train_step(batch, mini_batch_rows=batch.input_ids.shape[0]) for _ in range(2)
        ]
    for eager, fused in zip(metrics[False], metrics[True]):  # bf16: fused kernels round differently
        assert fused["loss"] == pytest.approx(eager["loss"], rel=2e-2, abs=1e-3)
        assert fused["grad_norm"] == pytest.approx(eager["grad_norm"], rel=2e-2)


def test_compiled_layers_under_fsdp2_match_eager_on_gpu(tiny_model_dir, tmp_path):
    """FSDP2 (NCCL, every visible GPU) with compiled layers and full checkpointing: the gather/reshard
    hooks stay outside the graphs, so the steps match the eager ones and the names stay the checkpoint's."""
    from trainer_helpers import fsdp_compiled_vs_eager

    from arl.trainer.distributed import spawn_local

    spawn_local(
        fsdp_compiled_vs_eager, min(torch.cuda.device_count(), 2), tiny_model_dir, tmp_path, timeout_s=300
    )
    result = torch.load(tmp_path / "fsdp_compile.pt", weights_only=False)
    for eager, fused in zip(result[False], result[True]):  # bf16: fused kernels round differently
        assert fused["loss"] == pytest.approx(eager["loss"], rel=2e-2, abs=1e-3)
        assert fused["grad_norm"] == pytest.approx(eager["grad_norm"], rel=2e-2)
    assert result["names_True"] == result["names_False"] and not any(
        "_orig_mod" in n for n in result["names_True"]
    )


def _mid_model(path):
    """A model large enough that its optimizer state dwarfs the step's stray allocations (~4M params)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.mark.parametrize(
    ("fused", "prefetch", "inflight_mb"),
    [(False, True, 256), (True, True, 1), (True, True, 0), (True, False, 256)],
)
def test_optimizer_offload_is_bit_identical_and_frees_the_state_on_gpu(
    tmp_path, fused, prefetch, inflight_mb
):
    """Between steps the offloading policy holds only its parameters; its updates equal the resident
    ones bit for bit, with the state's copies back on their own stream beside the forward and backward
    (prefetch: paced by a thread, 1 MiB in flight making many groups, or all queued at once) or right
    before the update; the update waits at most as long as those copies took."""
    from trainer_helpers import random_batch

    from arl.trainer import HFPolicy, TrainerConfig
    from arl.trainer.config import OptimConfig

    model = _mid_model(tmp_path / "model")
    batch = random_batch(seed=3, vocab=4096)
    rows = batch.input_ids.shape[0]
    growth, policies = {}, {}
    for offload in (False, True):
        torch.cuda.synchronize()
        policy = HFPolicy(
            model,
            TrainerConfig(
                max_tokens_per_microbatch=64,
                optimizer_offload=offload,
                optimizer_prefetch=prefetch,
                optimizer_prefetch_inflight_mb=inflight_mb,
                optim=OptimConfig(lr=1e-2, fused=fused),
            ),
            device="cuda",
        )
        before = torch.cuda.memory_allocated()
        metrics = [
            policy.train_step(batch, mini_batch_rows=rows // 2) for _ in range(3)
        ]  # 2 updates per step
        torch.cuda.synchronize()
        growth[offload] = torch.cuda.memory_allocated() - before
        policies[offload] = (policy, metrics)
    resident, offloaded = policies[False][0], policies[True][0]
    for (name, a), (_, b) in zip(
        resident.model.named_parameters(), offloaded.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    param_bytes = sum(p.numel() * p.element_size() for p in resident.model.parameters())
    state = offloaded.optimizer_state
    assert state is not None and state.on_host and state.nbytes >= 2 * param_bytes  # exp_avg + exp_avg_sq
    assert growth[False] >= 2 * param_bytes + param_bytes  # resident: the state and the gradients stay
    assert growth[True] < param_bytes // 8  # offloaded: neither stays
    assert all(p.grad is None for p in offloaded.model.parameters())
    last = policies[True][1][-1]
    assert last["optimizer_state_gib"] * 2**30 == state.nbytes and last["optimizer_load_s"] > 0
    assert 0 <= last["optimizer_load_wait_s"] <= last["optimizer_load_s"] + 1e-4


@pytest.mark.parametrize("inflight_mb", [256, 0])
def test_overlapped_optimizer_offload_holds_the_state_until_settled_and_is_bit_identical_on_gpu(
    tmp_path, inflight_mb
):
    """`optimizer_offload_overlap`: a step returns with the state's copies to the host queued (paced, or
    all at once) and its GPU storage still held; `settle_optimizer_offload()` waits for them and frees
    at least the state's bytes. The updates equal the resident ones bit for bit, whether a step is
    settled (the colocated app) or the next step settles it itself, and a checkpoint saved while the
    copies are under way resumes to the same next update."""
    from trainer_helpers import random_batch

    from arl.trainer import HFPolicy, TrainerConfig
    from arl.trainer.config import OptimConfig

    model = _mid_model(tmp_path / "model")
    batch = random_batch(seed=4, vocab=4096)
    rows = batch.input_ids.shape[0]
    base = dict(max_tokens_per_microbatch=64, optim=OptimConfig(lr=1e-2, fused=True))
    resident = HFPolicy(model, TrainerConfig(**base), device="cuda")
    cfg = TrainerConfig(
        **base,
        optimizer_offload=True,
        optimizer_offload_overlap=True,
        optimizer_prefetch_inflight_mb=inflight_mb,
    )
    overlapped = HFPolicy(model, cfg, device="cuda")
    state = overlapped.optimizer_state
    for step in range(3):
        resident.train_step(batch, mini_batch_rows=rows // 2)
        overlapped.train_step(batch, mini_batch_rows=rows // 2)
        assert state.on_host and state.leaving
        assert all(t.untyped_storage().nbytes() > 0 for t, _ in state._offloaded)
        if step == 1:
            continue  # left for the next step's prefetch to settle
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        waited = overlapped.settle_optimizer_offload()
        assert not state.leaving and before - torch.cuda.memory_allocated() >= state.nbytes
        assert all(t.untyped_storage().nbytes() == 0 for t, _ in state._offloaded)
        copy_s, settle_s = state.offload_times()
        assert copy_s > 0 and settle_s == waited >= 0
        assert overlapped.settle_optimizer_offload() == 0.0  # nothing left under way
    for (name, a), (_, b) in zip(
        resident.model.named_parameters(), overlapped.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name

    overlapped.train_step(batch, mini_batch_rows=rows // 2)
    resident.train_step(batch, mini_batch_rows=rows // 2)
    assert state.leaving
    checkpoint = overlapped.save(tmp_path / "ckpt", {"step": 4})
    assert state.on_host and not state.leaving  # saving settled, brought the state back and sent it out again
    resumed = HFPolicy(checkpoint, cfg, device="cuda")
    resumed.load_optimizer(checkpoint)
    for policy in (resident, resumed):
        policy.train_step(batch, mini_batch_rows=rows // 2)
    for (name, a), (_, b) in zip(
        resident.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_optimizer_offload_checkpoint_resumes_on_gpu(tmp_path):
    """A checkpoint saved while the state waits on the host resumes into the same next update."""
    from trainer_helpers import random_batch

    from arl.trainer import HFPolicy, TrainerConfig
    from arl.trainer.config import OptimConfig

    model = _mid_model(tmp_path / "model")
    batch = random_batch(seed=4, vocab=4096)
    cfg = TrainerConfig(max_tokens_per_microbatch=64, optimizer_offload=True, optim=OptimConfig(lr=1e-2))
    first = HFPolicy(model, cfg, device="cuda")
    first.train_step(batch, mini_batch_rows=batch.input_ids.shape[0])
    assert first.optimizer_state.on_host
    checkpoint = first.save(tmp_path / "ckpt", {"step": 1})
    assert first.optimizer_state.on_host  # saving put it back where it was
    resumed = HFPolicy(checkpoint, cfg, device="cuda")
    resumed.load_optimizer(checkpoint)
    for policy in (first, resumed):
        policy.train_step(batch, mini_batch_rows=batch.input_ids.shape[0])
    for (name, a), (_, b) in zip(
        first.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_optimizer_offload_under_fsdp2_is_bit_identical_on_gpu(tmp_path):
    """FSDP2 (NCCL, every visible GPU up to 2), fused AdamW over DTensors: offloaded == resident, the
    way out inside the step or beside the weight gathers that follow it (`optimizer_offload_overlap`)."""
    from trainer_helpers import fsdp_offload_vs_resident

    from arl.trainer.distributed import spawn_local

    model = _mid_model(tmp_path / "model")
    spawn_local(fsdp_offload_vs_resident, min(torch.cuda.device_count(), 2), model, tmp_path, timeout_s=300)
    result = torch.load(tmp_path / "fsdp_offload.pt", weights_only=False)
    assert result["on_host_offload"] and result["on_host_overlap"] and not result["on_host_resident"]
    assert result["leaving_overlap"] == [True] * 3 and result["leaving_offload"] == [False] * 3
    for mode in ("offload", "overlap"):
        for name, tensor in result["weights_resident"].items():
            assert torch.equal(tensor, result[f"weights_{mode}"][name]), (mode, name)
        assert result[f"metrics_{mode}"][-1]["optimizer_state_gib"] > 0


def test_optimizer_offload_under_fsdp2_checkpoint_resumes_on_gpu(tmp_path):
    """FSDP2 (every visible GPU up to 2): a sharded checkpoint saved while AdamW's state is on the host
    resumes into the same next update, and saving leaves the state where it was."""
    from trainer_helpers import fsdp_offload_checkpoint_resume

    from arl.trainer.distributed import spawn_local

    model = _mid_model(tmp_path / "model")
    spawn_local(
        fsdp_offload_checkpoint_resume, min(torch.cuda.device_count(), 2), model, tmp_path, timeout_s=300
    )
    result = torch.load(tmp_path / "fsdp_offload_ckpt.pt", weights_only=False)
    assert result["on_host_before_save"] and result["on_host_after_save"]
    assert result["trainer_state"]["step"] == 1 and result["trainer_state"]["version"] == 1
    assert result["on_host_first"] and result["on_host_resumed"]
    assert result["metrics_resumed"]["loss"] == result["metrics_first"]["loss"]
    for name, tensor in result["weights_first"].items():
        assert torch.equal(tensor, result["weights_resumed"][name]), name


def test_host_arena_is_page_locked_exact_and_round_trips_on_gpu():
    """The offload's host memory: one registered buffer of the state's size (no power-of-two rounding),
    every view page-locked, device → host → device copies (non_blocking) bit for bit."""
    from arl.trainer.host_arena import ALIGN_BYTES, HostArena

    specs = [((3, 1000), torch.float32), ((), torch.float32), ((259, 7), torch.bfloat16)]
    arena = HostArena(specs, pinned=True)
    assert arena.nbytes < sum(torch.Size(s).numel() * d.itemsize for s, d in specs) + ALIGN_BYTES * len(specs)
    assert all(v.is_pinned() for v in arena.views)
    device = [torch.randn(s, device="cuda").to(d) for s, d in specs]
    for t, v in zip(device, arena.views, strict=True):
        v.copy_(t, non_blocking=True)
    torch.cuda.synchronize()
    back = [torch.empty_like(t) for t in device]
    for b, v in zip(back, arena.views, strict=True):
        b.copy_(v, non_blocking=True)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(device, back, strict=True))


def test_gemm_check_keeps_the_device_plan_on_an_uncapped_gpu():
    """Outside MPS the GEMMs are right as planned: the check measures them and changes nothing."""
    from arl.trainer.gemm_check import TOLERANCE, ensure_right_gemms

    dev = torch.device("cuda")
    check = ensure_right_gemms(dev)
    assert not check.repaired and check.worst_error < TOLERANCE / 4
    assert check.sm_count == torch.cuda.get_device_properties(dev).multi_processor_count
    assert torch._C._get_sm_carveout_experimental() is None
    again = ensure_right_gemms(dev, current=check.sm_target, seed=30)  # a re-check, on fresh draws
    assert not again.repaired and torch._C._get_sm_carveout_experimental() is None
