"""Exponential moving averages: target networks, the EMA target encoder, PopArt statistics."""
from __future__ import annotations

import torch

from reference_impl import _checks


def soft_update(target: torch.Tensor, online: torch.Tensor, *, tau: float) -> torch.Tensor:
    r""":math:`\bar\phi \leftarrow \tau\phi + (1 - \tau)\,\bar\phi` (returns the new target; trainers apply it
    in place).

    Implements: SAC-TARGET-1.
    """
    _checks.in_range(tau, 0.0, 1.0, "SAC-TARGET-1", "tau")
    return torch.lerp(target.detach(), online.detach(), tau)


def soft_update_(targets: list[torch.Tensor], onlines: list[torch.Tensor], *, tau: float) -> None:
    r"""\bar φ ← τ φ + (1 − τ) \bar φ for every pair, in place and in one foreach kernel (a loop over the
    parameters would launch one per tensor); the same values as :func:`soft_update`.

    Implements: SAC-TARGET-1.
    """
    _checks.in_range(tau, 0.0, 1.0, "SAC-TARGET-1", "tau")
    with torch.no_grad():
        torch._foreach_lerp_(targets, onlines, tau)


def ema_update(target: torch.Tensor, online: torch.Tensor, *, m: float) -> torch.Tensor:
    r""":math:`\bar f \leftarrow m\,\bar f + (1 - m)\,f`: the same average as :func:`soft_update` with
    τ = 1 − m.

    Implements: SAC-NCE-3.
    """
    _checks.in_range(m, 0.0, 1.0, "SAC-NCE-3", "m", lo_open=False, hi_open=True)
    return soft_update(target, online, tau=1.0 - m)


def popart_step(mu, var, x, *, beta: float = 1e-3, eps: float = 1e-8):
    r"""One PopArt/EMA step: :math:`\mu_t = (1-\beta)\,\mu_{t-1} + \beta x_t`,
    :math:`\sigma_t^2 = (1-\beta)\,\sigma_{t-1}^2 + \beta(x_t - \mu_t)^2`,
    :math:`N(x_t) = (x_t - \mu_t)/(\sigma_t + \epsilon)`. The variance uses the *new* mean μ_t.

    Returns ``(normalised, mu_t, var_t)``; tensors broadcast (independent streams).

    Implements: SAC-POPART-1, SAC-POPART-2.
    """
    _checks.in_range(beta, 0.0, 1.0, "SAC-POPART-1", "beta")
    mu_t = (1.0 - beta) * mu + beta * x
    var_t = (1.0 - beta) * var + beta * (x - mu_t) ** 2
    return (x - mu_t) / (torch.sqrt(var_t) + eps), mu_t, var_t
