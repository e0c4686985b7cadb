"""Strategies of the isreshape family: ratios, mixing coefficients, temperatures, token batches."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

__all__ = ["isr_ratios", "isr_gammas", "isr_taus", "isr_betas", "isr_token_batches"]

_FINITE = dict(allow_nan=False, allow_infinity=False)


def isr_ratios(*, max_len: int = 8, log_lo: float = -6.0, log_hi: float = 6.0, dtype=torch.float64):
    """A 1-D tensor of importance ratios, log-uniform in [e^log_lo, e^log_hi] (so r = 1 neighbours and
    far off-policy tokens both appear)."""
    return hnp.arrays(np.float64, st.integers(1, max_len), elements=st.floats(log_lo, log_hi, **_FINITE)).map(
        lambda a: torch.tensor(np.exp(a), dtype=dtype)
    )


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
def isr_token_batches(draw, *, max_len: int = 10, log_ratio: float = 3.0, dtype=torch.float64, min_tokens: int = 1):
    """(log_prob, ref_log_prob, advantages, response_mask): log-probs <= 0, log-ratios within
    +-log_ratio (wider with some probability, to reach the clamp), advantages in [-5, 5], a 0/1 float
    mask with at least ``min_tokens`` ones."""
    n = draw(st.integers(max(1, min_tokens), max_len))
    lp = draw(hnp.arrays(np.float64, n, elements=st.floats(-8.0, 0.0, **_FINITE)))
    span = draw(st.sampled_from([log_ratio, log_ratio, 30.0]))
    delta = draw(hnp.arrays(np.float64, n, elements=st.floats(-span, span, **_FINITE)))
    adv = draw(hnp.arrays(np.float64, n, elements=st.floats(-5.0, 5.0, **_FINITE)))
    mask = draw(hnp.arrays(np.bool_, n))
    if mask.sum() < min_tokens:
        mask[: min_tokens] = True
    t = lambda a: torch.tensor(a, dtype=dtype)  # noqa: E731
    return t(lp), t(lp - delta), t(adv), t(mask.astype(np.float64))
