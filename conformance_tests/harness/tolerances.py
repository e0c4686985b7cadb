"""Tolerances: a clause's (rtol, atol) for the dtype of the inputs an operation was given.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from rlconform.spec import default_spec

from conformance_tests.harness import state
from conformance_tests.harness.device import _leaves, _to_numpy


def tolerance(clause: str, dtype: torch.dtype | str = torch.float64, *, approx: str | None = None) -> tuple[float, float]:
    """The clause's (rtol, atol) for ``dtype``; ``approx`` names a class of spec/tolerances.yaml
    instead, for differential checks whose oracle is itself approximate (finite differences)."""
    name = str(dtype).replace("torch.", "")
    spec = default_spec()
    tol = spec.tolerances[approx] if approx else spec.clause(clause).tolerance
    return tol.for_dtype(name)


def slack(clause: str, value: Any, dtype: torch.dtype | str | None = None) -> np.ndarray:
    """How far a result may sit beyond a bound ``value`` by rounding alone: the clause's atol + rtol·|value|
    for ``dtype`` (default: the inputs of the test's last call), so a one-sided bound is held to the same
    tolerance as the values it bounds, never to a margin finer than the dtype can represent."""
    rtol, atol = tolerance(clause, dtype if dtype is not None else _default_dtype(value))
    return atol + rtol * np.abs(_to_numpy(value).astype(np.float64))


def _dtype_of(x: Any) -> torch.dtype | None:
    """The floating dtype a value carries (tensors, numpy arrays), None for Python numbers and lists."""
    if isinstance(x, torch.Tensor):
        return x.dtype if x.is_floating_point() else None
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32}.get(x.dtype, torch.float64)
    return None


def input_dtype(*inputs: Any) -> torch.dtype:
    """The working dtype of an operation's inputs: the widest floating dtype among them (lists and
    dicts walked; float64 when none is floating). Tolerances follow this, never the result, so a
    result silently computed in a narrower dtype is held to the tolerance of the dtype it was given."""
    order = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    found = [d for d in (_dtype_of(x) for x in _leaves(inputs)) if d is not None]
    return max(found, key=order.index) if found else torch.float64


def _default_dtype(expected: Any) -> torch.dtype:
    """The inputs' dtype of the test's last recorded call; the expected value's dtype without one."""
    calls = state._STATE["calls"]
    if calls:
        _, args, kwargs = calls[-1]
        return input_dtype(args, kwargs)
    return input_dtype(expected)
