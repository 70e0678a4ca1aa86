"""KL-divergence estimators between the current policy and a reference policy, per token.

Schulman's estimators ("Approximating KL Divergence", 2020) of KL(π ‖ π_ref) from tokens sampled
by π, with log r = log π_ref(x) − log π(x):
- k1 = −log r = log π − log π_ref            (unbiased, high variance, can be negative)
- k2 = ½ (log r)²                            (biased, low variance, ≥ 0)
- k3 = (r − 1) − log r = exp(log r) − log r − 1  (unbiased, low variance, ≥ 0)
- low_var_kl: k3 with log r clamped to [−20, 20] and the result to [−10, 10] (verl's name for it),
  guarding against exp overflow when the policies drift far apart.
All are differentiable in `logp`; the reference log probs are treated as constants.
"""

from __future__ import annotations

from typing import Literal

import torch

from arl.trainer.errors import AlgorithmError

KLEstimator = Literal["k1", "k2", "k3", "low_var_kl"]


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp.detach()


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logp - ref_logp.detach()) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    log_r = ref_logp.detach() - logp
    # expm1(x) − x is exp(x) − 1 − x computed without cancellation near x = 0 (keeps k3 ≥ 0 exactly).
    return torch.expm1(log_r) - log_r


def kl_low_var(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    log_r = (ref_logp.detach() - logp).clamp(-20.0, 20.0)
    return (torch.expm1(log_r) - log_r).clamp(-10.0, 10.0)


_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3, "low_var_kl": kl_low_var}


def kl_estimate(estimator: KLEstimator, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(π ‖ π_ref) estimate by the named estimator; same shape as `logp`."""
    fn = _ESTIMATORS.get(estimator)
    if fn is None:
        raise AlgorithmError(f"unknown kl estimator {estimator!r}; expected one of {sorted(_ESTIMATORS)}")
    if logp.shape != ref_logp.shape:
        raise AlgorithmError(f"ref_logp shape {tuple(ref_logp.shape)} differs from logp shape {tuple(logp.shape)}")
    return fn(logp, ref_logp)
