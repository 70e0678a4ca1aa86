"""KL-divergence estimators between the current policy and a reference policy, per token.

Schulman's estimators ("Approximating KL Divergence", 2020) of KL(π ‖ π_ref) from tokens sampled
by π, with log r = log π_ref(x) − log π(x):
- k1 = −log r = log π − log π_ref            (unbiased, high variance, can be negative)
- k2 = ½ (log r)²                            (biased, low variance, ≥ 0)
- k3 = (r − 1) − log r = exp(log r) − log r − 1  (unbiased, low variance, ≥ 0)
- low_var_kl: k3 clamped: log r to [−log_ratio_clamp, log_ratio_clamp] (default ±20) and the value
  to [−value_clamp, value_clamp] (default ±10), the common "low-variance KL" form. A token outside a
  clamp contributes a constant (zero gradient): when the policy has drifted far from the reference
  on a token (stale or partial-rollout tokens under asynchronous training), that token's KL gradient
  is cut instead of growing like exp(log r).
"k3" is the raw, unclamped form; which one is arl's default (AlgorithmConfig.kl_estimator) and why:
docs/design/loss-conventions.md.
All are differentiable in `logp`; the reference log probs are treated as constants.
"""

from __future__ import annotations

import torch

from arl.trainer.algorithm_config import KLEstimator
from arl.trainer.errors import AlgorithmError


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp.detach()


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logp - ref_logp.detach()) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    log_r = ref_logp.detach() - logp
    # expm1(x) − x is exp(x) − 1 − x computed without cancellation near x = 0 (keeps k3 ≥ 0 exactly).
    return torch.expm1(log_r) - log_r


# Clamp bounds of the clamped k3 (low_var_kl); AlgorithmConfig.kl_log_ratio_clamp / kl_value_clamp.
DEFAULT_LOG_RATIO_CLAMP = 20.0
DEFAULT_VALUE_CLAMP = 10.0


def kl_low_var(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    log_ratio_clamp: float = DEFAULT_LOG_RATIO_CLAMP,
    value_clamp: float = DEFAULT_VALUE_CLAMP,
) -> torch.Tensor:
    """Clamped k3: log r clamped to ±log_ratio_clamp, the value to ±value_clamp (k3 ≥ 0, so only the top binds)."""
    log_r = (ref_logp.detach() - logp).clamp(-log_ratio_clamp, log_ratio_clamp)
    return (torch.expm1(log_r) - log_r).clamp(-value_clamp, value_clamp)


_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3, "low_var_kl": kl_low_var}


def kl_estimate(
    estimator: KLEstimator,
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    *,
    log_ratio_clamp: float = DEFAULT_LOG_RATIO_CLAMP,
    value_clamp: float = DEFAULT_VALUE_CLAMP,
) -> torch.Tensor:
    """Per-token KL(π ‖ π_ref) estimate by the named estimator; same shape as `logp`.

    The clamps apply to "low_var_kl" only; the other estimators are unclamped."""
    fn = _ESTIMATORS.get(estimator)
    if fn is None:
        raise AlgorithmError(f"unknown kl estimator {estimator!r}; expected one of {sorted(_ESTIMATORS)}")
    if logp.shape != ref_logp.shape:
        raise AlgorithmError(
            f"ref_logp shape {tuple(ref_logp.shape)} differs from logp shape {tuple(logp.shape)}"
        )
    if log_ratio_clamp <= 0 or value_clamp <= 0:
        raise AlgorithmError(
            f"KL clamps must be > 0, got log_ratio_clamp={log_ratio_clamp}, value_clamp={value_clamp}"
        )
    if estimator == "low_var_kl":
        return kl_low_var(logp, ref_logp, log_ratio_clamp, value_clamp)
    return fn(logp, ref_logp)
