"""Independent oracles in numpy/scipy: never the implementation under test.

Family-specific oracles live next to their tests; the ones here are shared.
"""
from __future__ import annotations

import numpy as np
from scipy.special import logsumexp


def np_(x) -> np.ndarray:
    """float64 numpy copy of a tensor or array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if x.dtype.is_floating_point:
            x = x.double()
        return x.numpy()
    return np.asarray(x)


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


def clipped_surrogate_slope(rho: float, a: float, eps: float, side: int = 0, *, atol: float = KINK_ATOL) -> float:
    """d/dρ of min(ρA, clip(ρ, 1 − ε, 1 + ε)A): A where the unclipped product is the minimum, 0 where the
    clipped (constant) one is. On a kink (within ``atol``), ``side`` (−1 left, +1 right) says which piece the
    point belongs to."""
    lo, hi = 1 - eps, 1 + eps
    at_lo, at_hi = abs(rho - lo) < atol, abs(rho - hi) < atol
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
