"""What a floating dtype holds: the suite's own constants (a -1e9 fill, a garbage value, the SAC-MASK-2 clip)
made to fit every dtype a library may declare, so that a float16 library is never handed an inf or an exact 0
that the suite meant as a large or a tiny number.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch


def fits(value: Any, dtype: torch.dtype) -> Any:
    """``value`` (a number or an array), each finite entry past the dtype's range replaced by its nearest finite
    value (float16 holds at most 65504)."""
    info = torch.finfo(dtype)
    v = np.asarray(value, dtype=np.float64)
    out = np.where(np.isfinite(v), np.clip(v, info.min, info.max), v)  # an inf or NaN meant as such stays
    return float(out) if out.ndim == 0 else out


def prob_floor(eps: float, dtype: torch.dtype) -> float:
    """The SAC-MASK-2 clip in ``dtype``: ``eps``, or the dtype's smallest positive value where ``eps`` rounds to 0
    (1e-8 in float16 becomes 6e-8; see the clause's errata)."""
    smallest = float(torch.nextafter(torch.zeros((), dtype=dtype), torch.ones((), dtype=dtype)))
    return float(eps) if float(torch.tensor(eps, dtype=dtype)) > 0 else smallest
