"""SAC strategies that aim at the Top-p boundaries (SAC-TOPP-1..3) instead of assuming them away.

Rows are dyadic: every legal probability is ``units / 2^m`` with integer units and m <= 24, so each
value is exact in float32 and float64 and every sum of them is exact in float64 (and in any order).
A Top-p threshold can then sit *exactly* on a cumulative mass, ties are exact, and an oracle needs
no tolerance. Wide rows (up to 6144 actions) are built in numpy from a drawn seed, since drawing
thousands of elements one by one is slow; illegal entries hold the ε = 1e-8 of the clip.
"""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from conformance_tests.dtypes import prob_floor
from conformance_tests.harness.device import to_numpy
from conformance_tests.strategies.core import declared_dtype, float_dtypes

__all__ = ["ROW_KINDS", "dyadic_policies", "float32_policies", "top_p_thresholds", "top_p_cases", "top_p_backups"]

EPS = 1e-8
ROW_KINDS = ("flat", "peaked", "zipf", "tied", "one_legal", "short")
WIDTHS = (1, 2, 3, 5, 8, 13, 300, 600, 6000, 6144)  # small rows, the 256-candidate regime, a vocabulary


def _units(kind: str, n: int, m: int, g: np.random.Generator) -> np.ndarray:
    """n positive integers summing to 2^m (2^m - 1 for "short", a legal mass just below one)."""
    total = 1 << m
    if kind == "flat":  # exactly equal values; the legal mass falls short of one by < n units
        return np.full(n, total // n, dtype=np.int64)
    if kind == "peaked":
        w = np.exp(-np.abs(g.standard_normal(n)) * 8.0)
        w[g.integers(n)] = n * 50.0
    elif kind == "zipf":
        w = 1.0 / g.permutation(np.arange(1, n + 1)) ** 1.1
    elif kind == "tied":  # few levels, each repeated many times: ties straddle most thresholds
        w = g.choice([1.0, 2.0, 3.0], size=n, p=[0.6, 0.3, 0.1])
    else:  # one_legal / short
        w = g.random(n) + 0.5
    u = np.maximum(np.floor(w / w.sum() * total), 1).astype(np.int64)
    u[np.argmax(u)] += total - u.sum()  # exact total; the largest entry absorbs the remainder
    if kind == "short":
        u[np.argmax(u)] -= 1
    return u


def _row(kind: str, width: int, g: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    legal = np.zeros(width, dtype=bool)
    if kind == "one_legal":
        legal[g.integers(width)] = True
    else:
        legal = g.random(width) < g.choice([1.0, 0.95, 0.5])
        legal[g.integers(width)] = True
    n = int(legal.sum())
    m = min(24, max(int(np.ceil(np.log2(max(n, 2)))) + 6, 8))
    p = np.full(width, EPS)
    p[legal] = _units(kind, n, m, g) / float(1 << m)
    return p, legal


@st.composite
def dyadic_policies(draw, *, max_batch: int = 4, widths=WIDTHS, kinds=ROW_KINDS, dtype=None):
    """(probs, legal_mask): a batch of rows of drawn kinds (a batch may mix flat and peaked rows)."""
    width = draw(st.sampled_from(widths))
    rows = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=max_batch))
    g = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    built = [_row(kind, width, g) for kind in rows]
    dt = declared_dtype(dtype) if dtype else draw(float_dtypes())
    probs = np.maximum(np.stack([r[0] for r in built]), prob_floor(EPS, dt))  # float16 rounds 1e-8 to 0
    return torch.tensor(probs, dtype=dt), torch.tensor(np.stack([r[1] for r in built]))


@st.composite
def float32_policies(draw, *, max_batch: int = 4, widths=WIDTHS):
    """(probs, legal_mask): float32 masked, ε-clipped softmax rows computed here in numpy, with
    logit scales from flat (0.1) to peaked (30). Not dyadic, but every value is >= 2^-27, so float64
    sums of them are still exact (and independent of the summation order)."""
    width = draw(st.sampled_from(widths))
    batch = draw(st.integers(1, max_batch))
    g = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scales = np.array([draw(st.sampled_from([0.1, 1.0, 5.0, 30.0])) for _ in range(batch)])[:, None]
    legal = g.random((batch, width)) < 0.9
    legal[np.arange(batch), g.integers(width, size=batch)] = True
    z = np.where(legal, scales * g.standard_normal((batch, width)), -np.inf)
    e = np.exp(z - z.max(-1, keepdims=True))
    dt = declared_dtype(torch.float32)
    probs = np.maximum((e / e.sum(-1, keepdims=True)).astype(np.float32), np.float32(prob_floor(EPS, dt)))
    return torch.tensor(probs, dtype=dt), torch.tensor(legal)


@st.composite
def top_p_thresholds(draw, probs: torch.Tensor, legal_mask: torch.Tensor):
    """A p in (0, 1] aimed at a boundary of one row: exactly one of its cumulative masses (ranked by
    the tie rule), just above or below one (half a unit of the grid), 1, or anywhere."""
    pn, mn = probs.double().numpy(), to_numpy(legal_mask)
    b = draw(st.integers(0, pn.shape[0] - 1))
    legal = np.flatnonzero(mn[b])
    ranked = legal[np.lexsort((legal, -pn[b, legal]))]
    cum = np.cumsum(pn[b, ranked])
    k = draw(st.integers(0, len(cum) - 1))
    half_unit = float(np.min(pn[b, legal])) / 2 ** 10
    target = draw(st.sampled_from(["exact", "above", "below", "one", "any"]))
    if target == "one":
        return 1.0
    if target == "any":
        return draw(st.floats(1e-3, 1.0, allow_nan=False))
    p = float(cum[k]) + {"exact": 0.0, "above": half_unit, "below": -half_unit}[target]
    return min(max(p, 1e-6), 1.0)


@st.composite
def top_p_cases(draw, *, float32_rows: bool = False, **kw):
    """(probs, legal_mask, p) with p on or next to a boundary of the drawn rows: dyadic rows, or with
    ``float32_rows`` float32 softmax rows."""
    probs, mask = draw(float32_policies(**kw) if float32_rows else dyadic_policies(**kw))
    return probs, mask, draw(top_p_thresholds(probs, mask))


@st.composite
def top_p_backups(draw, **kw):
    """(probs, q1, q2, legal_mask, alpha, p): the rows of :func:`top_p_cases` (same keywords) and
    twin-Q values of magnitude up to 1e4."""
    probs, mask, p = draw(top_p_cases(**kw))
    return draw(_with_critics(probs, mask, p))


@st.composite
def _with_critics(draw, probs, mask, p):
    scale = draw(st.sampled_from([1.0, 10.0, 1e3, 1e4]))
    g = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q1, q2 = (torch.tensor(scale * g.standard_normal(tuple(probs.shape)), dtype=probs.dtype) for _ in range(2))
    alpha = draw(st.floats(1e-4, 2.0))
    return probs, q1, q2, mask, alpha, p
