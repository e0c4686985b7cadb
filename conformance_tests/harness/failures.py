"""Failure messages: ``got X, but should be Y [CLAUSE: call]``, with numpy reprs written as plain values.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch

from conformance_tests.harness import state
from conformance_tests.harness.device import _to_numpy
from conformance_tests.harness.repro import describe_call
from conformance_tests.harness.state import _note_failure, _severity_of


def _last_call_text() -> str:
    calls = state._STATE["calls"]
    return describe_call(calls[-1]) if calls else "no call"


def plain(x: Any) -> Any:
    """numpy scalars/arrays and tensors as plain Python values (no ``np.float64(...)`` in messages)."""
    if isinstance(x, (np.generic, np.ndarray)):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return type(x)(plain(v) for v in x)
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x


_NP_SCALAR = re.compile(r"\bnp\.(?:float|int|uint|bool_?|complex)\d*\(([^()]*)\)")
_NP_ARRAY = re.compile(r"\barray\((\[[^()]*?\])(?:,\s*dtype=[\w.]+)?\)")


def plain_text(text: str) -> str:
    """Failure text with numpy reprs turned into plain literals: ``np.float64(0.5)`` -> ``0.5``,
    ``array([-0.])`` -> ``[-0.]``."""
    return _NP_ARRAY.sub(r"\1", _NP_SCALAR.sub(r"\1", text))


def _fmt(x: Any) -> str:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.numel() > 12:
            return f"tensor(shape={tuple(x.shape)}, first={x.flatten()[:6].tolist()})"
        return repr(x.tolist())
    return repr(plain(x))


def fail(clause: str, got: Any, expected: Any, detail: str = "", *, severity: str | None = None) -> None:
    msg = f"got {_fmt(got)}, but should be {_fmt(expected)} [{clause}: {_last_call_text()}]"
    if detail:
        msg += f"\n  {detail}"
    if severity is None:
        try:  # numbers against numbers: NaN/inf where the answer is finite is critical, a residue minor
            g, e = _to_numpy(got).astype(np.float64), _to_numpy(expected).astype(np.float64)
            if g.shape == e.shape and g.size:
                fin = np.isfinite(g) & np.isfinite(e)
                severity = _severity_of(g, e, float(np.max(np.abs(g[fin] - e[fin]), initial=0.0)) if fin.all()
                                        else float("nan"))
        except Exception:  # noqa: BLE001 - got/expected are not numeric arrays: leave the default
            pass
    _note_failure("fail", msg, severity)
    pytest.fail(msg, pytrace=False)
