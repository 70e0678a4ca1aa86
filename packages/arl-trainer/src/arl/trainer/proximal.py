"""Proximal-policy log probs for decoupled PPO without (or with) an extra forward pass.

Decoupled PPO (AReaL) uses three policies: the behaviour policy that sampled each token (the rollout
engine, at the weight version recorded per token), the proximal policy (the trust-region anchor the
PPO ratio is clipped against) and the current policy being optimised. The proximal log probs can be
- `recompute`: a forward pass of the weights at the start of the step (exact; the trainer does it),
- `reuse`: the first update's own detached log probs (exact when the step's first update runs on
  unchanged weights; the trainer keeps them),
- `bypass`: the behaviour log probs themselves (`bypass_proximal`; no extra forward),
- `loglinear`: AReaL's version-aware log-linear interpolation (`loglinear_proximal`; no extra forward).

The default, `auto`, is `reuse` in a step of one optimizer update (where it equals `recompute`) and
`recompute` otherwise (`AlgorithmConfig.resolve_proximal_mode`).
"""

from __future__ import annotations

import torch

from arl.trainer.algorithm_config import ProximalMode
from arl.trainer.errors import AlgorithmError


def bypass_proximal(behaviour_logp: torch.Tensor) -> torch.Tensor:
    """Proximal = behaviour: the PPO ratio is taken against the rollout's own log probs."""
    return behaviour_logp.detach()


def loglinear_alpha(
    token_versions: torch.Tensor, proximal_version: float, current_version: float
) -> torch.Tensor:
    """Per-token interpolation weight α = (v_prox − v_behave) / (v_current − v_behave), clamped to [0, 1].

    α = 0 (proximal = behaviour) where the token's version is negative (no generation version, e.g.
    prompt or tool tokens) or where v_behave ≥ v_current (nothing to interpolate), as in AReaL.
    """
    if current_version < proximal_version:
        raise AlgorithmError(
            f"current_version ({current_version}) must be >= proximal_version ({proximal_version})"
        )
    v_behave = token_versions.to(torch.float64)
    diff = float(current_version) - v_behave
    gap = float(proximal_version) - v_behave
    valid = (diff > 0) & (token_versions >= 0)
    alpha = torch.where(valid, gap / torch.where(valid, diff, torch.ones_like(diff)), torch.zeros_like(diff))
    return alpha.clamp(0.0, 1.0)


def loglinear_proximal(
    behaviour_logp: torch.Tensor,
    current_logp: torch.Tensor,
    token_versions: torch.Tensor,
    proximal_version: float,
    *,
    current_version: float,
) -> torch.Tensor:
    """AReaL's log-linear approximation of the proximal policy's log probs (detached).

    From AReaL, "Proximal Log-Probability Approximation"
    (https://inclusionai.github.io/AReaL/algorithms/prox_approx.html, `actor.prox_logp_method=loglinear`):

        α = (v_proximal − v_behave) / (v_θ − v_behave),
        log π_proximal ≈ log π_behave + α · (log π_θ − log π_behave)

    where v_behave is the weight version that generated each token (`token_versions`), v_θ the
    version of the weights that produced `current_logp` (`current_version`) and v_proximal the
    version the proximal policy stands for (`proximal_version`; AReaL uses v_θ − 1). α is clamped to
    [0, 1] and is 0 for tokens with a negative version or v_behave ≥ v_θ (see `loglinear_alpha`), so
    a token sampled at v_proximal gets its behaviour log prob and a token sampled at v_θ gets the
    current one. The result is detached: the proximal policy is a constant of the PPO objective.

    Versions may be fractional, which lets a trainer that makes several updates between weight
    publications place its current weights between published versions (e.g. v + u/U after u of the
    U updates since version v); AReaL counts one version per update.

    All tensors share one shape (flat (N,) or padded (B, T)).
    """
    if not (behaviour_logp.shape == current_logp.shape == token_versions.shape):
        raise AlgorithmError(
            "behaviour_logp, current_logp and token_versions must share one shape, got "
            f"{tuple(behaviour_logp.shape)}, {tuple(current_logp.shape)}, {tuple(token_versions.shape)}"
        )
    alpha = loglinear_alpha(token_versions, proximal_version, current_version).to(behaviour_logp.dtype)
    behaviour = behaviour_logp.detach()
    return behaviour + alpha * (current_logp.detach() - behaviour)


def proximal_logp_for(
    mode: ProximalMode,
    *,
    behaviour_logp: torch.Tensor,
    computed_logp: torch.Tensor | None = None,
    token_versions: torch.Tensor | None = None,
    proximal_version: float | None = None,
    current_version: float | None = None,
) -> torch.Tensor:
    """The proximal log probs for a mode, from what the trainer has at hand (all detached).

    recompute / reuse: `computed_logp` is the exact proximal log probs (a forward pass at the step's
    start, or the first update's own log probs); bypass: the behaviour log probs; loglinear:
    `computed_logp` is the current policy's log probs at `current_version`, interpolated with the
    behaviour log probs by `token_versions` toward `proximal_version`.
    """
    if mode == "auto":
        raise AlgorithmError(
            "proximal mode 'auto' names no policy by itself: resolve it first "
            "(AlgorithmConfig.resolve_proximal_mode, from the step's number of updates)"
        )
    if mode == "bypass":
        return bypass_proximal(behaviour_logp)
    if mode in ("recompute", "reuse"):
        if computed_logp is None:
            raise AlgorithmError(
                f"proximal mode {mode!r} needs computed_logp (the proximal policy's log probs)"
            )
        return computed_logp.detach()
    if mode == "loglinear":
        if (
            computed_logp is None
            or token_versions is None
            or proximal_version is None
            or current_version is None
        ):
            raise AlgorithmError(
                "proximal mode 'loglinear' needs computed_logp, token_versions, proximal_version and current_version"
            )
        return loglinear_proximal(
            behaviour_logp, computed_logp, token_versions, proximal_version, current_version=current_version
        )
    raise AlgorithmError(f"unknown proximal mode {mode!r}; expected recompute, bypass, reuse or loglinear")
