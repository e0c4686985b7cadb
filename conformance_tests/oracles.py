"""Independent oracles in numpy/scipy: never the implementation under test.

Family-specific oracles live next to their tests; the ones here are shared.
"""
from __future__ import annotations

import numpy as np
import torch
from scipy.special import logsumexp

from conformance_tests.dtypes import fits, prob_floor


def np_(x) -> np.ndarray:
    """float64 numpy copy of a tensor or array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if x.dtype.is_floating_point:
            x = x.double()
        return x.numpy()
    return np.asarray(x)


def ratio_band(r: np.ndarray, new: np.ndarray, old: np.ndarray, machine_eps: float) -> np.ndarray:
    """How far a ratio exp(new - old) computed in a dtype of that machine epsilon may sit from its exact value:
    the log-probs are rounded on their own scale (|new| + |old|), then the exponential once more."""
    return np.abs(r) * machine_eps * (1.0 + np.abs(new) + np.abs(old))


def torch_masked_probs(z: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """SAC-MASK-2's masked, ε-clipped softmax in torch primitives written here, for tests that differentiate
    through the probabilities they hand an operation; the clip as the dtype holds it (:func:`dtypes.prob_floor`)."""
    zz = torch.where(mask, z, torch.full_like(z, fits(-1e9, z.dtype)))
    return torch.softmax(zz - zz.max(-1, keepdim=True).values, -1).clamp_min(prob_floor(eps, z.dtype))


def masked_softmax(z: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Softmax over the True entries of each row, 0 elsewhere (no clip)."""
    zz = np.where(mask, z, -np.inf)
    return np.where(mask, np.exp(zz - logsumexp(zz, axis=-1, keepdims=True)), 0.0)


def huber(x: np.ndarray, delta: float = 1.0) -> np.ndarray:
    a = np.abs(x)
    return np.where(a <= delta, 0.5 * x**2, delta * (a - 0.5 * delta))


KINK_ATOL = 1e-12  # a float64 ratio this close to 1 ± ε counts as on the kink


def kink_atol(machine_eps: float) -> float:
    """How close a ratio read back from inputs of that dtype (its machine epsilon) counts as on a kink: a float32
    1 − ε is 1e-8 off, and a log-ratio kink exponentiated from float32 log-probs drifts a few ulps more."""
    return max(KINK_ATOL, 64 * machine_eps)


def kink_step(eps: float, magnitude: float, machine_eps: float) -> float | None:
    """A step off a clip kink (ratio 1 ± ε) onto the next piece that the dtype does not round away: a quarter of
    min(ε, 1 − ε), or two rounding units at ``magnitude`` (the size of the numbers the ratio is computed from)
    where that is larger, lest the two products tie once rounded. None where such a step no longer fits inside
    the clip range, which is 2ε wide: that dtype cannot tell the pieces apart there."""
    step = max(min(eps, 1.0 - eps) / 4, 2 * machine_eps * max(1.0, magnitude))
    return step if step < eps else None


def clipped_surrogate_slope(rho: float, a: float, eps: float, side: int = 0, *, atol: float = KINK_ATOL) -> float:
    """d/dρ of min(ρA, clip(ρ, 1 − ε, 1 + ε)A): A where the unclipped product is the minimum, 0 where the
    clipped (constant) one is. On a kink (within ``atol``), ``side`` (−1 left, +1 right) says which piece the
    point belongs to. A point is on at most one kink, the nearer: in bfloat16 ``atol`` may exceed 2ε."""
    lo, hi = 1 - eps, 1 + eps
    near_lo = abs(rho - lo) <= abs(rho - hi)
    at_lo, at_hi = near_lo and abs(rho - lo) < atol, not near_lo and abs(rho - hi) < atol
    if (rho < lo and not at_lo) or (at_lo and side < 0):
        return a if a > 0 else 0.0  # clip pins ρ at 1 − ε; the minimum keeps ρA only when A > 0
    if (rho > hi and not at_hi) or (at_hi and side > 0):
        return a if a < 0 else 0.0
    return a


def ranked_legal(p_row: np.ndarray, m_row: np.ndarray) -> np.ndarray:
    """One row's legal ids by decreasing π, ties by lower id (SAC-TOPP-1's order)."""
    legal = np.flatnonzero(m_row)
    return legal[np.lexsort((legal, -p_row[legal]))]


def top_p_bounds(p_row: np.ndarray, m_row: np.ndarray, p: float, band: float = 0.0):
    """Brute force of SAC-TOPP-1 for one row: the ranked legal ids and the allowed set sizes (lo, hi).
    An action is kept iff the mass ranked before it is < p; ``band`` widens that test by the float
    rounding of rows whose sums are not exact (0 for dyadic rows: one size only)."""
    ranked = ranked_legal(p_row, m_row)
    if p >= 1.0:
        return ranked, len(ranked), len(ranked)
    before = np.concatenate([[0.0], np.cumsum(p_row[ranked])[:-1]])  # nondecreasing
    return ranked, int((before < p - band).sum()), int((before < p + band).sum())


def info_nce(q: np.ndarray, pos: np.ndarray, neg: np.ndarray, tau: float) -> np.ndarray:
    """SAC-NCE-1 per row: s⁺ − logsumexp(s⁺, s⁻), scores over τ; ``neg`` [B,K,d] per row or a shared [K,d] queue."""
    neg = np.broadcast_to(neg, (q.shape[0],) + neg.shape) if neg.ndim == 2 else neg
    s_pos = (q * pos).sum(-1) / tau
    s_neg = np.einsum("bd,bkd->bk", q, neg) / tau
    return s_pos - logsumexp(np.concatenate([s_pos[:, None], s_neg], -1), axis=-1)
