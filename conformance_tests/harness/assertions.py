"""Assertion helpers: closeness within a clause's tolerance, dtypes, gradients, equality, properties,
rejected inputs, and finite differences as an independent gradient oracle.
"""
from __future__ import annotations

import contextlib
import math
import re
from typing import Any, Callable

import numpy as np
import torch

from conformance_tests.harness.capabilities import capability
from conformance_tests.harness.device import _to_numpy
from conformance_tests.harness.failures import fail
from conformance_tests.harness.state import _severity_of, oracle_calls
from conformance_tests.harness.tolerances import _default_dtype, tolerance


def assert_close(got: Any, expected: Any, clause: str, *, dtype: Any = None, what: str = "",
                 approx: str | None = None, scale: Any = None) -> None:
    """``got`` equals ``expected`` within the clause's tolerance for ``dtype``.

    ``dtype`` is the dtype of the inputs the operation was given; when omitted it is the widest
    floating dtype among the inputs of the test's last recorded call (the expected value's dtype
    when no call was recorded), never ``got``'s: a float32 result for float64 inputs is held to the
    float64 tolerance. ``approx="gradient"`` when ``expected`` comes from finite differences.
    ``scale`` (a number, or an array that broadcasts against ``expected``: one
    per row) is the natural size of the quantity, when its terms are much larger than the result (a log-prob
    is a difference of logits, f_1 = f_SAPO - 2/tau): both sides are divided by it, so a result is held to
    the rounding of the terms it is computed from, not of its own small value.
    """
    if dtype is None:
        dtype = _default_dtype(expected)
    rtol, atol = tolerance(clause, dtype, approx=approx)
    g, e = _to_numpy(got), _to_numpy(expected)
    # one value against one value passes whatever the wrapping, except a row that came back squeezed: an
    # expected [B] of one row against a 0-d result (.squeeze() on a batch of one)
    squeezed = g.ndim == 0 and e.ndim >= 1 and isinstance(expected, (np.ndarray, torch.Tensor))
    if (g.shape != e.shape and not (g.size == 1 and e.size == 1)) or squeezed:
        fail(clause, f"shape {g.shape}", f"shape {e.shape}", what)
    g = g.reshape(e.shape) if g.size == e.size else g
    g, e = _past_the_range(g, e, dtype, rtol, clause, got, expected, what)
    if scale is not None:
        scale = np.broadcast_to(np.asarray(_to_numpy(scale), dtype=np.float64), e.shape)
        g, e = np.asarray(g.astype(np.float64) / scale), np.asarray(e.astype(np.float64) / scale)
        beyond = scale > _range_end(dtype)  # terms the dtype cannot hold: no result in it is wrong, none is checked
        g[beyond] = e[beyond] = 0.0
        what = f"{what} (over the scale {np.max(scale):.3g})".strip()
    if not np.all(np.isfinite(g) == np.isfinite(e)):
        fail(clause, got, expected, f"{what} non-finite values differ".strip(),
             severity="critical" if (~np.isfinite(g) & np.isfinite(e)).any() else "major")
    fin = np.isfinite(e)
    ok = np.allclose(g[fin].astype(np.float64), e[fin].astype(np.float64), rtol=rtol, atol=atol) if fin.any() else True
    if not ok or not np.array_equal(g[~fin], e[~fin]):
        err = np.max(np.abs(g[fin].astype(np.float64) - e[fin].astype(np.float64))) if fin.any() else float("nan")
        fail(clause, got, expected, f"{what} max abs error {err:.3g} > atol {atol:g} + rtol {rtol:g}·|expected|".strip(),
             severity=_severity_of(g.astype(np.float64), e.astype(np.float64), float(err)))


def _range_end(dtype: Any) -> float:
    """The largest finite value of a half or single precision dtype; inf for float64 (what numpy holds too)."""
    name = str(dtype).replace("torch.", "")
    return float(torch.finfo(getattr(torch, name)).max) if name in ("float16", "bfloat16", "float32") else math.inf


def _past_the_range(g: np.ndarray, e: np.ndarray, dtype: Any, rtol: float, clause: str, got: Any, expected: Any,
                    what: str) -> tuple[np.ndarray, np.ndarray]:
    """Where the answer is finite but past the largest value of the inputs' dtype (e^12 in float16), that dtype
    can only overflow: inf or NaN (an overflow met inside, inf - inf), or a finite value at the range's end of
    the answer's sign, is right; a small finite value is not. Those entries are checked here and left out of
    the comparison (both set to 0)."""
    top = _range_end(dtype)
    if not math.isfinite(top) or not np.issubdtype(e.dtype, np.floating):
        return g, e
    name = str(dtype).replace("torch.", "")
    e64 = e.astype(np.float64)
    over = np.isfinite(e64) & (np.abs(e64) > top)
    if not over.any():
        return g, e
    g64 = g.astype(np.float64)
    at_end = (np.sign(g64[over]) == np.sign(e64[over])) & (np.abs(g64[over]) >= top * (1 - rtol))
    if not np.all(~np.isfinite(g64[over]) | at_end):
        fail(clause, got, expected, f"{what} where the answer overflows {name} (past {top:g}): an overflow or the "
             "range's end of the answer's sign".strip())
    g64[over] = e64[over] = 0.0
    return g64, e64


def assert_dtype(got: Any, dtype: torch.dtype, clause: str, what: str = "") -> None:
    """``got`` (a tensor, or a dict/list/tuple of them: every floating one) is of ``dtype``."""
    if isinstance(got, dict):
        for k, v in got.items():
            assert_dtype(v, dtype, clause, f"{what}[{k!r}]")
        return
    if isinstance(got, (list, tuple)):
        for i, v in enumerate(got):
            assert_dtype(v, dtype, clause, f"{what}[{i}]")
        return
    if isinstance(got, (np.ndarray, np.generic)):  # never a contract type: a numpy result carries no gradient
        fail(clause, f"a numpy {got.dtype} result", f"a {str(dtype).replace('torch.', '')} tensor", what)
    if isinstance(got, torch.Tensor) and got.is_floating_point() and got.dtype != dtype:
        fail(clause, f"a {str(got.dtype).replace('torch.', '')} result",
             f"{str(dtype).replace('torch.', '')}, the dtype of the inputs", what)


def assert_low_precision(got: Any, exact: Any, clause: str, dtype: torch.dtype, what: str = "") -> None:
    """A low-precision result against the float64 answer for the *same rounded inputs*, within the
    clause's tolerance for ``dtype``: finiteness alone would pass a constant or zeroed output."""
    assert_that(torch.isfinite(got.float()) if isinstance(got, torch.Tensor) else math.isfinite(float(got)),
                clause, got, f"finite {what} in {dtype}".strip())
    assert_close(got, exact, clause, dtype=dtype, what=what)


def assert_no_grad(clause: str, what: str, *leaves: torch.Tensor) -> None:
    """Each leaf (created with ``requires_grad=True`` by the test) got no gradient: ``.grad`` is None
    or all zero after the backward pass of a loss that must treat it as a constant."""
    for i, t in enumerate(leaves):
        if t.grad is not None and bool((t.grad != 0).any()):
            name = what if len(leaves) == 1 else f"{what} #{i + 1}"
            fail(clause, t.grad, f"no gradient into {name} (a constant of the loss)")


def grad_of(loss: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    """∂loss/∂leaf without touching ``.grad`` (the graph is kept); zeros when the loss does not reach it."""
    (g,) = torch.autograd.grad(loss, [leaf], retain_graph=True, allow_unused=True)
    return torch.zeros_like(leaf) if g is None else g


def assert_no_grad_into(loss: torch.Tensor, clause: str, **leaves: torch.Tensor) -> None:
    """The loss sends no gradient into any of the named leaves (networks or inputs it must hold constant)."""
    for name, leaf in leaves.items():
        g = grad_of(loss, leaf)
        assert_that(bool((g == 0).all()), clause, g, f"no gradient into {name}")


def grad_leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Fresh ``requires_grad=True`` leaf copies of floating tensors (others are returned unchanged)."""
    return [t.detach().clone().requires_grad_(True) if t.is_floating_point() else t for t in tensors]


def assert_equal(got: Any, expected: Any, clause: str, what: str = "") -> None:
    """Exact equality (tensors compared elementwise and by shape)."""
    g, e = _to_numpy(got), _to_numpy(expected)
    if g.shape != e.shape or not np.array_equal(g, e):
        fail(clause, got, expected, what)


def assert_between(got: Any, lo: float, hi: float, clause: str, *, dtype: Any = None, what: str = "") -> None:
    """``lo <= got <= hi`` within the clause's tolerance for ``dtype`` (as :func:`assert_close`): for a value
    the inputs' rounding leaves open, such as a count of ratios near a clip edge."""
    rtol, atol = tolerance(clause, dtype if dtype is not None else _default_dtype(lo))
    g = float(_to_numpy(got))
    if not lo - (atol + rtol * abs(lo)) <= g <= hi + (atol + rtol * abs(hi)):
        fail(clause, got, f"between {lo:.6g} and {hi:.6g}", f"{what} (atol {atol:g} + rtol {rtol:g}·|bound|)".strip())


def assert_that(condition: Any, clause: str, got: Any, should: str) -> None:
    """A property check: ``should`` says in words what ``got`` should have been."""
    if isinstance(condition, torch.Tensor):
        condition = bool(condition.all())
    if not condition:
        fail(clause, got, should)


_CLAUSE_ID = re.compile(r"(?<![A-Za-z0-9-])[A-Z]+(?:-[A-Z0-9]+)*-\d+(?![A-Za-z0-9-])")


def clause_ids_in(text: str) -> list[str]:
    """The clause-id tokens of a message, whole tokens only (``[SAC-INPUT-2]``, ``SAC-INPUT-2:``; not the
    ``SAC-INPUT-2`` inside ``XXSAC-INPUT-2XX``)."""
    return _CLAUSE_ID.findall(text)


def assert_rejects(clause: str | tuple[str, ...], fn: Callable, *args, **kwargs) -> Exception:
    """Bad input: the operation must raise, never return silent garbage. An implementation that
    declares ``errors_name_clauses`` (the reference does) must also name the clause in the message, as a
    whole token; a third-party library passes on any exception that rejects the input. ``clause`` may be
    several clauses that each cover the input (the operation's own rule and the family's input clause):
    the message may name any of them, and a failure is filed under the first."""
    accepted = (clause,) if isinstance(clause, str) else tuple(clause)
    try:
        result = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        raised = e
    else:
        fail(accepted[0], result, "an error (bad input must not pass silently)")
    if capability("errors_name_clauses", False) and not set(accepted) & set(clause_ids_in(str(raised))):
        fail(accepted[0], f"{type(raised).__name__}({str(raised)[:120]!r})",
             f"an error whose message names {' or '.join(accepted)}")
    return raised


@contextlib.contextmanager
def no_grad_leak(*tensors: torch.Tensor):
    """Fail if any of ``tensors`` receives a gradient inside the block (detached inputs)."""
    yield
    for t in tensors:
        if t.grad is not None and bool((t.grad != 0).any()):
            raise AssertionError("gradient leaked into a tensor that must be detached")


def finite_difference(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, h: float = 1e-6) -> torch.Tensor:
    """Central finite-difference gradient of the scalar ``fn`` at float64 ``x`` (an independent oracle). Its
    probes are not recorded as the test's calls (:func:`oracle_calls`)."""
    x = x.detach().to(torch.float64)
    grad = torch.zeros_like(x)
    flat = grad.view(-1)
    with oracle_calls():
        for i in range(x.numel()):
            e = torch.zeros_like(x).view(-1)
            e[i] = h
            e = e.view_as(x)
            flat[i] = (float(fn(x + e)) - float(fn(x - e))) / (2 * h)
    return grad


def one_sided_difference(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, index, side: int,
                         h: float = 1e-6) -> float:
    """Second-order one-sided difference (−3f(x) + 4f(x + sh) − f(x + 2sh)) / 2sh of the scalar ``fn`` in
    ``x[index]``, side −1 (left) or +1 (right): both probes stay on one side of a kink, where ``fn`` is smooth."""
    def f(k):
        y = x.detach().clone()
        y[index] += k * side * h
        return float(fn(y))
    with oracle_calls():
        return side * (-3 * f(0) + 4 * f(1) - f(2)) / (2 * h)
