"""Importance ratio, reward-modulated gamma and the reshaped gradient weight (seed 003 §2-§3, §8)."""
from __future__ import annotations

import torch

from reference_impl.isreshape._guards import (
    check_beta, check_gamma, check_gamma_bounds, check_ratio, check_tau, check_tokens, work_dtype,
)


def importance_ratio(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, *, log_ratio_clamp: float = 20.0) -> torch.Tensor:
    r""":math:`r = \exp(\mathrm{clamp}(\log\pi - \log\mu, -c, c))`, :math:`c = 20`.

    Computed in float32 for half inputs and returned in the input dtype (where e^20 may be inf).
    Implements: ISR-RATIO-1
    """
    check_tokens(log_prob=log_prob, ref_log_prob=ref_log_prob)
    wd = work_dtype(log_prob)
    log_r = (log_prob.to(wd) - ref_log_prob.to(wd)).clamp(-log_ratio_clamp, log_ratio_clamp)
    return torch.exp(log_r).to(log_prob.dtype)


def reward_gamma(advantages: torch.Tensor, *, beta: float = 1.0, gamma_min: float = 0.0,
                 gamma_max: float = 1.0) -> torch.Tensor:
    r""":math:`\gamma(|A|) = \gamma_{min} + (\gamma_{max}-\gamma_{min})\,\sigma(\beta|A|)`.

    Even in A; with beta >= 0 it never drops below the midpoint (gamma_min + gamma_max) / 2.
    Implements: ISR-GAMMA-1, ISR-GAMMA-2
    """
    check_tokens(advantages=advantages)
    check_beta(beta)
    check_gamma_bounds(gamma_min, gamma_max)
    return gamma_min + (gamma_max - gamma_min) * torch.sigmoid(beta * advantages.abs())


def sech2(x: torch.Tensor) -> torch.Tensor:
    r"""\mathrm{sech}^2 x = 4e^{-2|x|}/(1+e^{-2|x|})^2: no overflow for large |x| (1/cosh^2 would be 1/inf)."""
    e = torch.exp(-2.0 * x.abs())
    return 4.0 * e / (1.0 + e) ** 2


def _sapo(ratio: torch.Tensor, tau) -> torch.Tensor:
    return ratio * sech2(tau * (ratio - 1.0) / 2.0)


def sapo_weight(ratio: torch.Tensor, *, tau: float = 1.0) -> torch.Tensor:
    r""":math:`w_{SAPO}(r) = r\,\mathrm{sech}^2(\tau(r-1)/2)`.

    Implements: ISR-SAPO-1
    """
    check_ratio(ratio, positive=False)
    check_tau(tau)
    return _sapo(ratio.to(work_dtype(ratio)), tau).to(ratio.dtype)


def sapo_weight_signed(ratio: torch.Tensor, advantages: torch.Tensor, *, tau_pos: float, tau_neg: float) -> torch.Tensor:
    r"""SAPO's sign-selected temperature: :math:`r\,\mathrm{sech}^2(\tau_\pm(r-1)/2)`, :math:`\tau_+` if
    :math:`A > 0` else :math:`\tau_-`.

    Implements: ISR-SAPO-3
    """
    check_tokens(ratio=ratio, advantages=advantages)
    check_ratio(ratio, positive=False)
    check_tau(tau_pos, "tau_pos")
    check_tau(tau_neg, "tau_neg")
    r = ratio.to(work_dtype(ratio))
    tau = torch.full_like(r, tau_neg).masked_fill(advantages > 0, tau_pos)  # A = 0 takes tau_neg (the else branch)
    return _sapo(r, tau).to(ratio.dtype)


def reshape_weight(ratio: torch.Tensor, gamma, *, tau: float = 1.0) -> torch.Tensor:
    r""":math:`w_\gamma(r) = (1-\gamma) + \gamma\, r\,\mathrm{sech}^2(\tau(r-1)/2)`.

    ``gamma`` is a float or a tensor broadcastable to ``ratio``. w(1) = 1; w -> 1 - gamma as r -> 0
    or r -> infinity (the soft trust region).
    Implements: ISR-W-1, ISR-W-2, ISR-W-3
    """
    check_ratio(ratio, positive=False)
    check_tau(tau)
    check_gamma(gamma)
    wd = work_dtype(ratio)
    g = gamma.to(wd) if isinstance(gamma, torch.Tensor) else gamma
    return ((1.0 - g) + g * _sapo(ratio.to(wd), tau)).to(ratio.dtype)
