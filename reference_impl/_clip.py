"""The clipped surrogate's minimum, shared by PPO (PPO-LOSS-1) and CCAPO (CCAPO-PPO-1).

min(r·A, clip(r, 1−ε, 1+ε)·A) with a tie taken by the unclipped piece. Inside the clip range the two
products are the same number, so either piece gives the gradient A. Just outside it they can still tie:
r·A rounds to (1 ± ε)·A for a ratio an ulp past the edge. There the minimum is the unclipped piece, and
torch.minimum, which splits a tie's gradient in half, would lose half of its slope.
"""
from __future__ import annotations

import torch


def pessimistic_surrogate(unclipped: torch.Tensor, clipped: torch.Tensor) -> torch.Tensor:
    """min(unclipped, clipped), a tie going to ``unclipped``.

    Implements: PPO-LOSS-1, CCAPO-PPO-1.
    """
    return torch.where(unclipped <= clipped, unclipped, clipped)


def pessimistic_weight(unclipped: torch.Tensor, clipped: torch.Tensor, in_range: torch.Tensor) -> torch.Tensor:
    """∂ pessimistic_surrogate / ∂r ÷ A in closed form: 1 where the unclipped piece is taken, else the clamp's
    pass-through ``in_range`` (1 inside [1−ε, 1+ε], 0 outside), for the fused paths.

    Implements: PPO-LOSS-1.
    """
    return torch.where(unclipped <= clipped, torch.ones_like(in_range), in_range)
