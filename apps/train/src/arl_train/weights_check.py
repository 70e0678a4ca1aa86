"""The end-of-run check that every replica serves exactly the trainer's weights.

After the last step (and a final sync if that step did not sync), each side fingerprints its tensors
where they live and only the fingerprints travel (`arl.rollout.engines.weights_digest`): megabytes, not
the model twice over, so a 7B model is checked like a tiny one. Engine tensors (every TP rank's shard,
fused as vLLM fuses them, in the engine's dtype) must be bit-identical to the trainer's; the check
names the tensors that differ, not by how much. Tensors the engine prepacks (vLLM's CPU build) are
checked through its outputs: its log probs on a probe sequence must equal the trainer's. Where nothing
is prepacked (GPU builds) the probe is reported, not required: a bf16 engine's kernels differ from the
fp32 trainer's.
"""

from __future__ import annotations

from typing import Any

PROBE_PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
# float32 on both sides: kernels differ (vLLM's fused CPU ops vs torch), identical weights agree to ~1e-6.
PROBE_TOLERANCE = 1e-4


def verify_engine_weights(
    ray: Any, trainer: Any, rollout: Any, replicas: int, step_timeout_s: float
) -> dict[str, Any]:
    """Sync the final weights if the last step did not, then check engine == trainer on every live replica."""
    ray.get(trainer.final_sync.remote(), timeout=step_timeout_s)
    live = ray.get(rollout.stats.remote(), timeout=60)["replicas_healthy"]  # a dead replica is not checked
    checked = [i for i in range(replicas) if i in live]
    digests = [ray.get(rollout.engine_digests.remote(i), timeout=300) for i in checked]
    results = ray.get(trainer.check_engine_digests.remote(digests), timeout=step_timeout_s)
    tensors_equal = all(r["equal"] for r in results)
    # The trainer's own tensors with NaN or inf (the digest pass reads each once): "equal" compares
    # bits, so a run whose weights went NaN on both sides is equal, and this is what says so.
    nonfinite = results[0].get("trainer_nonfinite", []) if results else []
    prepacked = sum(len(r["prepacked"]) for r in results)
    problems = [
        f"replica{i}:{k}:{n}"
        for i, r in zip(checked, results, strict=True)
        for k in ("unmatched", "mismatched")
        for n in r[k]
    ][:20]
    tokens, engine_logp, engine_version = ray.get(rollout.probe.remote(PROBE_PROMPT, 16), timeout=120)
    trainer_logp = ray.get(trainer.log_probs.remote(PROBE_PROMPT, tokens), timeout=120)
    probe_diff = max(abs(a - b) for a, b in zip(engine_logp, trainer_logp, strict=True))
    trainer_version = ray.get(trainer.version.remote(), timeout=60)
    engine_versions = ray.get(rollout.stats.remote(), timeout=60)["engine_versions"]
    probe_ok = probe_diff < PROBE_TOLERANCE or prepacked == 0
    return {
        "equal": tensors_equal and probe_ok and set(engine_versions) == {trainer_version},
        # Bit-identical tensors differ by 0; the digests cannot say by how much others differ.
        "max_abs_diff": 0.0 if tensors_equal else float("nan"),
        "prepacked": prepacked,
        "problems": problems,
        "probe_logprob_max_abs_diff": probe_diff,
        "version": trainer_version,
        "finite": not nonfinite,
        "nonfinite": nonfinite[:20],
    }


def weights_check_line(check: dict[str, Any]) -> str:
    """The check's one-line verdict for the terminal."""
    if not check.get("finite", True):
        return f"arl: the trainer's weights hold NaN or inf at version {check['version']}: " + ", ".join(
            check["nonfinite"]
        )
    if check["equal"]:
        return f"arl: engine weights equal to the trainer's at version {check['version']}"
    problems = (
        ", ".join(check["problems"]) or f"probe log-prob diff {check['probe_logprob_max_abs_diff']:.3g}"
    )
    return f"arl: engine weights differ from the trainer's at version {check['version']}: {problems}"
