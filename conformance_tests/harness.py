"""What every test module uses: the operation proxy, the call recorder, and the assertion helpers.

A test never calls an implementation directly: it goes through :class:`FamilyProxy` (the ``sac``,
``ppo``, ... fixtures), which

* turns a missing operation into *not applicable* (a skip the report counts apart),
* wraps an exception raised by the implementation in :class:`ImplementationError`, so the report
  can say ``error`` rather than ``fail``,
* records every call, so a failure message can name it and carry a runnable repro snippet.

Assertion helpers word their failures as ``got X, but should be Y [CLAUSE: call]``.
"""
from __future__ import annotations

import contextlib
import math
import re
from typing import Any, Callable, Iterable

import numpy as np
import pytest
import torch

from rlconform.spec import default_spec

NOT_APPLICABLE = "not applicable:"

# The session's state: what implementation string to print in repros, and the calls of the current test.
_STATE: dict[str, Any] = {"impl": "reference_impl:make", "device": "cpu", "calls": []}


class ImplementationError(Exception):
    """The implementation raised where the test expected a result."""


class MissingOperation(Exception):
    pass


def reset_calls() -> None:
    _STATE["calls"] = []


def recorded_calls() -> list[tuple[str, tuple, dict]]:
    return list(_STATE["calls"])


def configure(impl: str, device: str) -> tuple[str, str]:
    """Set the session's implementation string and device; returns the previous pair (nested sessions)."""
    prev = (_STATE["impl"], _STATE["device"])
    _STATE["impl"] = impl
    _STATE["device"] = device
    return prev


# ----------------------------------------------------------------------------- repro snippets
def _literal(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        rg = ", requires_grad=True" if x.requires_grad and x.is_leaf else ""
        body = re.sub(r"\b(nan|inf)\b", r"float('\1')", repr(x.detach().cpu().tolist()))
        return f"torch.tensor({body}, dtype={x.dtype}{rg})"
    if isinstance(x, np.ndarray):
        return f"np.array({x.tolist()!r}, dtype=np.{x.dtype})"
    if isinstance(x, float) and not math.isfinite(x):
        return f"float({str(x)!r})"
    if isinstance(x, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in x):
        inner = ", ".join(_literal(v) for v in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner},)"
    return repr(x)


def describe_call(call: tuple[str, tuple, dict]) -> str:
    """A short human form: ``sac.top_p_select(<2x5 float64>, p=0.9)``."""
    name, args, kwargs = call

    def short(v):
        if isinstance(v, torch.Tensor):
            if v.numel() <= 6:
                return repr(v.detach().cpu().tolist())
            return f"<{'x'.join(map(str, v.shape))} {str(v.dtype).replace('torch.', '')}>"
        r = repr(v)
        return r if len(r) <= 40 else r[:37] + "..."

    parts = [short(a) for a in args] + [f"{k}={short(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def repro_snippet(calls: Iterable[tuple[str, tuple, dict]] | None = None, limit: int = 3) -> str:
    """Python that replays the last ``limit`` recorded calls against the implementation under test."""
    calls = list(calls if calls is not None else _STATE["calls"])[-limit:]
    if not calls:
        return ""
    lines = [
        "import torch",
        "from conformance_tests.impl import load_impl",
        f"impl = load_impl({_STATE['impl']!r})",
    ]
    for name, args, kwargs in calls:
        fam, _, op = name.partition(".")
        argv = [_literal(a) for a in args] + [f"{k}={_literal(v)}" for k, v in kwargs.items()]
        lines.append(f"print(impl.{fam}.{op}({', '.join(argv)}))")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the proxy
def _to_device(x: Any) -> Any:
    """Move tensor arguments to the session's --device (autograd still reaches the CPU leaves)."""
    dev = _STATE["device"]
    if dev == "cpu":
        return x
    if isinstance(x, torch.Tensor):
        return x.to(dev)
    if isinstance(x, (list, tuple)):
        return type(x)(_to_device(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_device(v) for k, v in x.items()}
    return x



class FamilyProxy:
    """Attribute access returns a recording wrapper around the implementation's operation."""

    def __init__(self, family: str, namespace: Any | None):
        self._family = family
        self._ns = namespace

    def has(self, op: str) -> bool:
        return self._ns is not None and callable(getattr(self._ns, op, None))

    def raw(self, op: str) -> Callable:
        """The operation, recorded but not wrapped: for tests that expect it to raise."""
        self._require(op)
        fn, name = getattr(self._ns, op), f"{self._family}.{op}"

        def call(*args, **kwargs):
            _STATE["calls"].append((name, args, kwargs))
            return fn(*_to_device(args), **_to_device(kwargs))

        call.__name__ = op
        return call

    def _require(self, op: str) -> None:
        if self._ns is None:
            pytest.skip(f"{NOT_APPLICABLE} the implementation has no {self._family} family")
        if not callable(getattr(self._ns, op, None)):
            pytest.skip(f"{NOT_APPLICABLE} {self._family}.{op} is not provided")

    def __getattr__(self, op: str) -> Callable:
        from conformance_tests import contract

        if op.startswith("_") or op not in contract.op_names(self._family):
            raise AttributeError(f"{op!r} is not an operation of the {self._family} contract")
        self._require(op)
        fn = getattr(self._ns, op)
        name = f"{self._family}.{op}"

        def call(*args, **kwargs):
            _STATE["calls"].append((name, args, kwargs))
            try:
                return fn(*_to_device(args), **_to_device(kwargs))
            except Exception as e:  # noqa: BLE001 - any exception from the implementation is an error
                raise ImplementationError(f"{describe_call((name, args, kwargs))} raised {type(e).__name__}: {e}") from e

        call.__name__ = op
        return call


# ----------------------------------------------------------------------------- tolerances
def tolerance(clause: str, dtype: torch.dtype | str = torch.float64, *, approx: str | None = None) -> tuple[float, float]:
    """The clause's (rtol, atol) for ``dtype``; ``approx`` names a class of spec/tolerances.yaml
    instead, for differential checks whose oracle is itself approximate (finite differences)."""
    name = str(dtype).replace("torch.", "")
    spec = default_spec()
    tol = spec.tolerances[approx] if approx else spec.clause(clause).tolerance
    return tol.for_dtype(name)


def _last_call_text() -> str:
    calls = _STATE["calls"]
    return describe_call(calls[-1]) if calls else "no call"


def _fmt(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.numel() > 12:
            return f"tensor(shape={tuple(x.shape)}, first={x.flatten()[:6].tolist()})"
        return repr(x.tolist())
    return repr(x)


def fail(clause: str, got: Any, expected: Any, detail: str = "") -> None:
    msg = f"got {_fmt(got)}, but should be {_fmt(expected)} [{clause}: {_last_call_text()}]"
    if detail:
        msg += f"\n  {detail}"
    pytest.fail(msg, pytrace=False)


# ----------------------------------------------------------------------------- assertions
def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype in (torch.bfloat16, torch.float16):
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def assert_close(got: Any, expected: Any, clause: str, *, dtype: Any = None, what: str = "",
                 approx: str | None = None) -> None:
    """``got`` equals ``expected`` within the clause's tolerance for ``dtype`` (default: got's dtype);
    ``approx="gradient"`` when ``expected`` comes from finite differences."""
    if dtype is None:
        dtype = got.dtype if isinstance(got, torch.Tensor) else torch.float64
    rtol, atol = tolerance(clause, dtype, approx=approx)
    g, e = _to_numpy(got), _to_numpy(expected)
    if g.shape != e.shape and not (g.size == 1 and e.size == 1):
        fail(clause, f"shape {g.shape}", f"shape {e.shape}", what)
    g = g.reshape(e.shape) if g.size == e.size else g
    if not np.all(np.isfinite(g) == np.isfinite(e)):
        fail(clause, got, expected, f"{what} non-finite values differ".strip())
    fin = np.isfinite(e)
    ok = np.allclose(g[fin].astype(np.float64), e[fin].astype(np.float64), rtol=rtol, atol=atol) if fin.any() else True
    if not ok or not np.array_equal(g[~fin], e[~fin]):
        err = np.max(np.abs(g[fin].astype(np.float64) - e[fin].astype(np.float64))) if fin.any() else float("nan")
        fail(clause, got, expected, f"{what} max abs error {err:.3g} > atol {atol:g} + rtol {rtol:g}·|expected|".strip())


def assert_equal(got: Any, expected: Any, clause: str, what: str = "") -> None:
    """Exact equality (tensors compared elementwise and by shape)."""
    g, e = _to_numpy(got), _to_numpy(expected)
    if g.shape != e.shape or not np.array_equal(g, e):
        fail(clause, got, expected, what)


def assert_that(condition: Any, clause: str, got: Any, should: str) -> None:
    """A property check: ``should`` says in words what ``got`` should have been."""
    if isinstance(condition, torch.Tensor):
        condition = bool(condition.all())
    if not condition:
        fail(clause, got, should)


def assert_rejects(clause: str, fn: Callable, *args, **kwargs) -> Exception:
    """Bad input: the operation must raise, and the message must name ``clause``; never a silent NaN."""
    try:
        result = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        raised = e
    else:
        fail(clause, result, "an error naming the clause (bad input must not pass silently)")
    if clause not in str(raised):
        fail(clause, f"{type(raised).__name__}({str(raised)[:120]!r})", f"an error whose message names {clause}")
    return raised


@contextlib.contextmanager
def no_grad_leak(*tensors: torch.Tensor):
    """Fail if any of ``tensors`` receives a gradient inside the block (detached inputs)."""
    yield
    for t in tensors:
        if t.grad is not None and bool((t.grad != 0).any()):
            raise AssertionError("gradient leaked into a tensor that must be detached")


def finite_difference(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, h: float = 1e-6) -> torch.Tensor:
    """Central finite-difference gradient of the scalar ``fn`` at float64 ``x`` (an independent oracle)."""
    x = x.detach().to(torch.float64)
    grad = torch.zeros_like(x)
    flat = grad.view(-1)
    for i in range(x.numel()):
        e = torch.zeros_like(x).view(-1)
        e[i] = h
        e = e.view_as(x)
        flat[i] = (float(fn(x + e)) - float(fn(x - e))) / (2 * h)
    return grad
