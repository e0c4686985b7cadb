"""The objectives f whose gradient weight r f'(r) is the reshaped weight (seed 003 §2.1, §4)."""
from __future__ import annotations

import torch

from reference_impl.isreshape._guards import check_gamma, check_ratio, check_tau, work_dtype


def reshape_f(ratio: torch.Tensor, gamma, *, tau: float = 1.0) -> torch.Tensor:
    r""":math:`f_\gamma(r) = (1-\gamma)\log r + \gamma\,\tfrac{2}{\tau}\tanh(\tau(r-1)/2)`.

    r f'_\gamma(r) = w_\gamma(r); f_0 = log r; f_1 = f_SAPO - 2/tau.
    Implements: ISR-F-1, ISR-F-2, ISR-F-3
    """
    check_ratio(ratio, positive=True)
    check_tau(tau)
    check_gamma(gamma)
    wd = work_dtype(ratio)
    r = ratio.to(wd)
    g = gamma.to(wd) if isinstance(gamma, torch.Tensor) else gamma
    return ((1.0 - g) * torch.log(r) + g * (2.0 / tau) * torch.tanh(tau * (r - 1.0) / 2.0)).to(ratio.dtype)


def sapo_gate(ratio: torch.Tensor, *, tau: float = 1.0) -> torch.Tensor:
    r""":math:`f_{SAPO}(r) = \sigma(\tau(r-1))\cdot 4/\tau`, whose :math:`r f'(r)` is :math:`w_{SAPO}`
    (:math:`4\sigma(1-\sigma)(x) = \mathrm{sech}^2(x/2)`).

    Implements: ISR-SAPO-2
    """
    check_ratio(ratio, positive=False)
    check_tau(tau)
    wd = work_dtype(ratio)
    return (torch.sigmoid(tau * (ratio.to(wd) - 1.0)) * (4.0 / tau)).to(ratio.dtype)
