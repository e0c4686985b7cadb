"""Shared strategies: shapes, logits, legal masks, probability rows, scalars in a range."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

__all__ = [
    "batch_shapes", "logits", "legal_masks", "logits_and_masks", "policies", "q_values",
    "unit_interval", "open_unit_interval", "tensors",
]

_FINITE = dict(allow_nan=False, allow_infinity=False)


def batch_shapes(max_batch: int = 6, min_actions: int = 2, max_actions: int = 12):
    """(B, A) pairs."""
    return st.tuples(st.integers(1, max_batch), st.integers(min_actions, max_actions))


def tensors(shape, *, lo: float = -10.0, hi: float = 10.0, dtype=torch.float64):
    """A float tensor of ``shape`` with entries in [lo, hi]."""
    return hnp.arrays(np.float64, shape, elements=st.floats(lo, hi, **_FINITE)).map(
        lambda a: torch.tensor(a, dtype=dtype)
    )


def logits(shape, *, scale: float = 10.0, dtype=torch.float64):
    return tensors(shape, lo=-scale, hi=scale, dtype=dtype)


@st.composite
def legal_masks(draw, shape, *, min_legal: int = 1):
    """A bool mask with at least ``min_legal`` True entries per row."""
    B, A = shape
    min_legal = min(min_legal, A)
    rows = []
    for _ in range(B):
        row = draw(hnp.arrays(np.bool_, (A,)))
        k = int(row.sum())
        if k < min_legal:
            idx = draw(st.permutations(range(A)))[: min_legal]
            row[list(idx)] = True
        rows.append(row)
    return torch.tensor(np.stack(rows))


@st.composite
def logits_and_masks(draw, *, scale: float = 10.0, dtype=torch.float64, min_legal: int = 1, **shape_kw):
    shape = draw(batch_shapes(**shape_kw))
    return draw(logits(shape, scale=scale, dtype=dtype)), draw(legal_masks(shape, min_legal=min_legal))


@st.composite
def policies(draw, *, dtype=torch.float64, min_legal: int = 1, eps: float = 1e-8, **shape_kw):
    """(probs, legal_mask) with probs a masked, ε-clipped softmax computed here in numpy (never by the
    implementation): legal entries sum to one over the legal set, illegal entries hold ε."""
    z, mask = draw(logits_and_masks(dtype=torch.float64, min_legal=min_legal, **shape_kw))
    zn, mn = z.numpy(), mask.numpy()
    zs = np.where(mn, zn - zn.max(-1, keepdims=True), -np.inf)
    e = np.exp(zs - zs.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    p = np.maximum(p, eps)
    return torch.tensor(p, dtype=dtype), mask


def q_values(shape, *, scale: float = 10.0, dtype=torch.float64):
    return tensors(shape, lo=-scale, hi=scale, dtype=dtype)


def unit_interval(*, lo: float = 1e-3, hi: float = 1.0):
    return st.floats(lo, hi, **_FINITE)


def open_unit_interval(*, lo: float = 1e-3, hi: float = 0.999):
    return st.floats(lo, hi, **_FINITE)
