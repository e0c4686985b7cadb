"""Strategies of the isreshape family: ratios, mixing coefficients, temperatures, token batches."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conformance_tests.dtypes import fits
from conformance_tests.strategies.core import declared_dtype

__all__ = ["isr_ratios", "isr_gammas", "isr_taus", "isr_betas", "isr_token_batches"]

_FINITE = dict(allow_nan=False, allow_infinity=False)


def isr_ratios(*, max_len: int = 8, log_lo: float = -6.0, log_hi: float = 6.0, dtype=torch.float64):
    """A 1-D tensor of importance ratios, log-uniform in [e^log_lo, e^log_hi] (so r = 1 neighbours and
    far off-policy tokens both appear), within the dtype's range (e^12 is past float16's)."""
    def ratios(a: np.ndarray) -> torch.Tensor:
        dt = declared_dtype(dtype)
        return torch.tensor(fits(np.exp(a), dt), dtype=dt)

    return hnp.arrays(np.float64, st.integers(1, max_len), elements=st.floats(log_lo, log_hi, **_FINITE)).map(ratios)


def isr_gammas():
    """A mixing coefficient in [0, 1], endpoints included."""
    return st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0, **_FINITE))


def isr_taus(*, lo: float = 0.1, hi: float = 4.0):
    """A trust-region temperature tau > 0."""
    return st.floats(lo, hi, **_FINITE)


def isr_betas(*, lo: float = 0.0, hi: float = 4.0):
    """A reward sensitivity beta >= 0."""
    return st.floats(lo, hi, **_FINITE)


@st.composite
def isr_token_batches(draw, *, max_len: int = 10, log_ratio: float = 3.0, dtype=torch.float64, min_tokens: int = 1,
                      max_rows: int = 4, wide: bool = True):
    """(log_prob, ref_log_prob, advantages, response_mask) of one shape: [T] or a [B, T] batch whose
    rows may be pure padding. Log-probs <= 0 (down to -1e3 with some probability when ``wide``),
    log-ratios within +-log_ratio (wider with some probability, to reach the clamp), advantages in
    [-5, 5] with exact zeros, a 0/1 float mask with at least ``min_tokens`` ones in all."""
    shape = draw(st.sampled_from(["1d", "1d", "2d"]))
    if shape == "2d":
        B, T = draw(st.integers(1, max_rows)), draw(st.integers(1, max(1, max_len // 2)))
        dims = (B, T)
        min_tokens = min(min_tokens, B * T)
    else:
        dims = (draw(st.integers(max(1, min_tokens), max_len)),)
    n = int(np.prod(dims))
    lp_lo = draw(st.sampled_from([-8.0, -8.0, -1e3])) if wide else -8.0
    lp = draw(hnp.arrays(np.float64, n, elements=st.floats(lp_lo, 0.0, **_FINITE)))
    span = draw(st.sampled_from([log_ratio, log_ratio, 30.0]))
    delta = draw(hnp.arrays(np.float64, n, elements=st.floats(-span, span, **_FINITE)))
    adv = draw(hnp.arrays(np.float64, n, elements=st.one_of(st.just(0.0), st.floats(-5.0, 5.0, **_FINITE))))
    mask = draw(hnp.arrays(np.bool_, n))
    if shape == "2d" and dims[0] > 1 and draw(st.booleans()):
        mask.reshape(dims)[draw(st.integers(0, dims[0] - 1))] = False  # a padding row
    if mask.sum() < min_tokens:
        mask[np.flatnonzero(~mask)[: min_tokens - int(mask.sum())]] = True
    t = lambda a: torch.tensor(a.reshape(dims), dtype=declared_dtype(dtype))  # noqa: E731
    # the contract's response mask is "1/0 float or bool": both are drawn
    response = torch.tensor(mask.reshape(dims)) if draw(st.booleans(), label="bool mask") else t(mask.astype(np.float64))
    return t(lp), t(lp - delta), t(adv), response
