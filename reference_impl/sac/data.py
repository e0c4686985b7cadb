"""Teacher integration: dual-buffer mix, DAgger schedule, teacher-conflict handling (seed 000, §7)."""
from __future__ import annotations

import math

import torch

from reference_impl import _checks


def mix_counts(batch_size: int, *, rho: float = 0.75) -> tuple[int, int]:
    r"""|B_agent| : |B_demo| = ρ : (1 − ρ), with |B_agent| = ⌊ρB + 1/2⌋ and the two summing to B.

    Implements: SAC-MIX-1.
    """
    _checks.in_range(rho, 0.0, 1.0, "SAC-MIX-1", "rho", hi_open=True)
    if batch_size < 1:
        raise ValueError(f"[SAC-MIX-1] batch_size must be positive, got {batch_size}")
    n_agent = int(math.floor(rho * batch_size + 0.5))
    return n_agent, batch_size - n_agent


def dagger_teacher_ratio(step: int, *, start: float = 1.0, end: float = 0.1, horizon: int = 200_000) -> float:
    r"""teacher_ratio anneals linearly from 1.0 to 0.1 over ``horizon`` steps and then stays at 0.1.

    Implements: SAC-DAGGER-1.
    """
    if step < 0 or horizon <= 0:
        raise ValueError(f"[SAC-DAGGER-1] need step >= 0 and horizon > 0, got step={step}, horizon={horizon}")
    frac = min(step / horizon, 1.0)
    return start + (end - start) * frac


def resolve_teacher_action(teacher_action, legal_mask, *, mode: str = "reject", distance=None):
    r"""A teacher action that the mask forbids is rejected or relabelled to the nearest legal action.

    ``distance`` is an optional [V, V] matrix (e.g. embedding distances); by default the distance is
    |i − j| between action ids. Ties go to the lower id. Returns ``(action, accepted, is_relabeled)``.

    Implements: SAC-TEACHER-1.
    """
    if mode not in ("reject", "relabel"):
        raise ValueError(f"[SAC-TEACHER-1] mode must be 'reject' or 'relabel', got {mode!r}")
    _checks.bool_mask(legal_mask, "SAC-TEACHER-1")
    V = legal_mask.shape[-1]
    _checks.index_in_range(teacher_action, V, "SAC-TEACHER-1", "teacher_action")
    a = teacher_action.long()
    legal = legal_mask.gather(-1, a.unsqueeze(-1)).squeeze(-1)
    if mode == "reject":
        return a, legal, torch.zeros_like(legal)
    ids = torch.arange(V, device=a.device)
    d = (ids.unsqueeze(0) - a.unsqueeze(-1)).abs().to(torch.float64) if distance is None else distance[a].to(torch.float64)
    d = d.masked_fill(~legal_mask, float("inf"))
    nearest = d.argmin(-1)  # argmin returns the first (lowest id) minimum
    relabeled = ~legal
    return torch.where(legal, a, nearest), torch.ones_like(legal), relabeled
