"""The reference's shared input guards (reference_impl/_checks.py) and IS-Reshape's (isreshape/_guards.py):
the switch that turns them off for a validated hot loop, and the names and ranges their refusals give where
a caller leaves the name to its default. Also the shared type promotion (reference_impl/_dtypes.py)."""
from __future__ import annotations

import math

import pytest
import torch

from reference_impl import _checks
from reference_impl._dtypes import promoted
from reference_impl.isreshape import _guards

pytestmark = pytest.mark.meta
NAN = torch.tensor([float("nan")])


def test_the_switch_turns_the_guards_off_and_restores_them():
    with pytest.raises(ValueError, match=r"^\[X-1\] x contains NaN or inf$"):
        _checks.finite(NAN, "X-1", "x")
    with _checks.validation(False):
        _checks.finite(NAN, "X-1", "x")  # off: no read-back, no refusal
        with _checks.validation(True):
            with pytest.raises(ValueError):
                _checks.finite(NAN, "X-1", "x")
        _checks.finite(NAN, "X-1", "x")  # the inner block restored "off"
    with pytest.raises(ValueError):
        _checks.finite(NAN, "X-1", "x")
    with pytest.raises(RuntimeError, match="boom"), _checks.validation(False):
        raise RuntimeError("boom")
    with pytest.raises(ValueError):  # an exception inside still restores "on"
        _checks.finite(NAN, "X-1", "x")


@pytest.mark.parametrize("call, message", [
    (lambda: _checks.bool_mask(torch.ones(2, 3), "SAC-MASK-1"), r"^\[SAC-MASK-1\] legal_mask must be a bool tensor"),
    (lambda: _checks.rows_nonempty(torch.zeros(2, 3, dtype=torch.bool), "SAC-MASK-1"),
     r"^\[SAC-MASK-1\] legal_mask has a row with no legal action$"),
    (lambda: _guards.check_tau(0.0), r"^\[ISR-INPUT-3\] tau=0.0 is outside \(0.0, inf\)$"),
    (lambda: _guards.check_tau(math.inf), r"^\[ISR-INPUT-3\] tau=inf is outside \(0.0, inf\)$"),
    (lambda: _guards.check_beta(math.inf), r"^\[ISR-INPUT-3\] beta=inf is outside \[0.0, inf\)$"),
    (lambda: _guards.check_gamma(1.5), r"^\[ISR-INPUT-4\] gamma=1.5 is outside \[0.0, 1.0\]$"),
    (lambda: _guards.check_gamma_bounds(-0.1, 0.5), r"^\[ISR-INPUT-4\] gamma_min=-0.1 is outside"),
    (lambda: _guards.check_gamma_bounds(0.1, 1.5), r"^\[ISR-INPUT-4\] gamma_max=1.5 is outside"),
], ids=["bool-mask", "empty-row", "tau-0", "tau-inf", "beta-inf", "gamma", "gamma_min", "gamma_max"])
def test_a_refusal_names_the_argument_and_its_range(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("bad", [-1, 3], ids=["below-0", "at-size"])
def test_an_index_outside_zero_to_size_is_refused(bad):
    _checks.index_in_range(torch.tensor([0, 2]), 3, "X-1", "idx")  # the ends of [0, size) pass
    with pytest.raises(IndexError, match=r"^\[X-1\] idx has an index outside \[0, 3\)$"):
        _checks.index_in_range(torch.tensor([1, bad]), 3, "X-1", "idx")


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float64), (torch.float64, torch.float32, torch.float32),
                                    (torch.bfloat16, torch.float16), (torch.int64, torch.float32),
                                    (torch.float32, torch.float32)])
def test_promoted_casts_to_the_dtype_that_arithmetic_gives(dtypes):
    """The common dtype is the one torch's own arithmetic gives (a sum of all of them, oracle); a tensor
    already of it comes back as the same object (no copy); values survive the cast."""
    tensors = [torch.tensor([1.5, -2.0]).to(dt) for dt in dtypes]
    want = sum(tensors[1:], tensors[0]).dtype
    out = promoted(*tensors)
    assert len(out) == len(tensors)
    for t, o in zip(tensors, out):
        assert o.dtype == want
        assert (o is t) == (t.dtype == want)
        assert torch.equal(o.double(), t.double())


def test_promoted_of_one_dtype_returns_its_tensors_and_dispatches_nothing():
    """The fused paths call it on every step: where the dtypes already agree (one tensor included) it must
    not dispatch an op (``torch.promote_types`` is one, a kernel-free launch on the op count)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    x, y = torch.ones(2), torch.zeros(3)
    with Count():
        one, two = promoted(x), promoted(x, y)
    assert Count.ops == 0
    assert one[0] is x and two[0] is x and two[1] is y
