"""Input guards of the isreshape family (ISR-INPUT-*), on top of the shared ones in reference_impl._checks."""
from __future__ import annotations

import torch

from reference_impl import _checks

HALF = (torch.float16, torch.bfloat16)


def work_dtype(x: torch.Tensor) -> torch.dtype:
    """Half-precision inputs are computed in float32 (ISR-STAB-1): e^20 overflows float16."""
    return torch.float32 if x.dtype in HALF else x.dtype


def check_tau(tau: float, name: str = "tau") -> None:
    _checks.in_range(tau, 0.0, float("inf"), "ISR-INPUT-3", name, lo_open=True, hi_open=True)


def check_beta(beta: float) -> None:
    _checks.in_range(beta, 0.0, float("inf"), "ISR-INPUT-3", "beta", lo_open=False, hi_open=True)


def check_gamma(gamma, name: str = "gamma") -> None:
    """A float or tensor gamma must lie in [0, 1]."""
    if isinstance(gamma, torch.Tensor):
        _checks.finite(gamma, "ISR-INPUT-4", name)
        if _checks._on() and bool(((gamma < 0) | (gamma > 1)).any()):
            raise ValueError(f"[ISR-INPUT-4] {name} has entries outside [0, 1]")
    else:
        _checks.in_range(gamma, 0.0, 1.0, "ISR-INPUT-4", name, lo_open=False, hi_open=False)


def check_gamma_bounds(gamma_min: float, gamma_max: float) -> None:
    check_gamma(gamma_min, "gamma_min")
    check_gamma(gamma_max, "gamma_max")
    if gamma_min > gamma_max:
        raise ValueError(f"[ISR-INPUT-4] gamma_min={gamma_min} exceeds gamma_max={gamma_max}")


def check_ratio(ratio: torch.Tensor, *, positive: bool) -> None:
    """Ratios are finite and >= 0 (> 0 where a log is taken)."""
    _checks.finite(ratio, "ISR-INPUT-2", "ratio")
    if _checks._on():
        bad = (ratio <= 0) if positive else (ratio < 0)
        if bool(bad.any()):
            raise ValueError(f"[ISR-INPUT-2] ratio has entries {'<= 0' if positive else '< 0'}")


def check_tokens(**tensors: torch.Tensor) -> None:
    """Token tensors share one shape (ISR-INPUT-1) and hold no NaN/inf (ISR-INPUT-2)."""
    _checks.same_shape("ISR-INPUT-1", **tensors)
    for name, t in tensors.items():
        _checks.finite(t, "ISR-INPUT-2", name)
