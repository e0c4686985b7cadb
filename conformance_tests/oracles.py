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
