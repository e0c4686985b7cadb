"""The reference's radix-threshold Top-p path (reference_impl.sac.backup), differentially against the
plain sort + cumsum formula kept beside it as its oracle: the same selected set and the same soft value,
also when the fast path runs one row at a time as it does on a big batch.
"""
from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance_tests import strategies as st_
from conformance_tests.harness import assert_close, assert_equal
from conformance_tests.test_sac_backup import _value_scale
from reference_impl.sac import backup


def _differential_rows():
    """Tie-heavy and wide dyadic rows with boundary p, and float32 softmax rows (values >= 2^-27,
    so float64 sums are exact too) at the default p."""
    return st.one_of(st_.top_p_backups(), st_.top_p_backups(kinds=("tied", "flat"), widths=(300, 6000, 6144)),
                     st_.top_p_backups(float32_rows=True))


@pytest.mark.meta
@pytest.mark.clause("SAC-TOPP-1", "SAC-TOPP-3")
@given(_differential_rows())
def test_reference_threshold_path_equals_the_sorted_formula(case):
    """Differential: the radix-threshold path selects exactly the set of the plain sort + cumsum
    formula (kept in the module as its oracle), and the expanded value matches the plain one."""

    probs, q1, q2, mask, alpha, p = case
    sorted_sel = backup.top_p_select(probs, mask, p=p, method="sorted")
    plain = backup.top_p_soft_value(probs, q1, q2, mask, alpha=alpha, p=p, method="sorted")
    scale = _value_scale(q1, q2, alpha, probs.shape[-1])
    # the fast path also runs one row at a time, as it does on a big batch
    for chunk_bytes in (backup._CHUNK_BYTES, 1):
        with mock.patch.object(backup, "_CHUNK_BYTES", chunk_bytes):
            fast = backup.top_p_select(probs, mask, p=p, method="threshold")
            got = backup.top_p_soft_value(probs, q1, q2, mask, alpha=alpha, p=p)
        assert_equal(fast, sorted_sel, "SAC-TOPP-1", "fast == sorted")
        assert_close(got / scale, plain / scale, "SAC-TOPP-3", what="expanded == plain value / scale")


def _bits(*patterns: int) -> torch.Tensor:
    """float32 values from their bit patterns."""
    return torch.tensor(patterns, dtype=torch.int32).view(torch.float32)


@pytest.mark.meta
@pytest.mark.clause("SAC-TOPP-1")
def test_threshold_ranks_float64_probabilities_at_their_own_precision():
    """Two probabilities that only float64 tells apart: the larger one (the higher id) is kept, not the
    lower id that a float32 tie would keep. Set written by hand: mass 0.4 then 0.3 + 1e-12 reaches 0.65."""
    probs = torch.tensor([[0.3, 0.3 + 1e-12, 0.4 - 1e-12]], dtype=torch.float64)
    mask = torch.ones_like(probs, dtype=torch.bool)
    for method in ("threshold", "sorted"):
        got = backup.top_p_select(probs, mask, p=0.65, method=method)
        assert_equal(got, torch.tensor([[False, True, True]]), "SAC-TOPP-1", f"{method}: float64 ranking")


@pytest.mark.meta
@pytest.mark.clause("SAC-TOPP-1")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_threshold_takes_half_precision_probabilities(dtype):
    """Half and bfloat16 probabilities widen exactly to float32 keys; dyadic values, so the set is exact:
    0.5 + 0.25 reaches 0.7, the ties at 0.125 stay out."""
    probs = torch.tensor([[0.125, 0.5, 0.125, 0.25]], dtype=dtype)
    mask = torch.ones_like(probs, dtype=torch.bool)
    got = backup.top_p_select(probs, mask, p=0.7, method="threshold")
    assert_equal(got, torch.tensor([[False, True, False, True]]), "SAC-TOPP-1", f"{dtype} probabilities")


@pytest.mark.meta
@pytest.mark.clause("SAC-TOPP-1")
def test_threshold_finds_a_key_in_the_top_digit_of_a_window():
    """The threshold key's lower 20 bits all ones (0.49999997 = 0x3EFFFFFF): in the second and third radix
    passes its digit is the window's top one (1023). Two such ties, and p needs only the first of them."""
    x = _bits(0x3EFFFFFF)
    probs = torch.cat([x, x, 1 - 2 * x])[None]
    mask = torch.ones_like(probs, dtype=torch.bool)
    for method in ("threshold", "sorted"):
        got = backup.top_p_select(probs, mask, p=0.3, method=method)
        assert_equal(got, torch.tensor([[True, False, False]]), "SAC-TOPP-1", f"{method}: top digit of a window")


# float64 rows whose tied count m = ceil((p - above) / t) rounds the wrong way, so that one of the two exact
# corrections after the division decides the set (found by a search over such rows; the kept sets are the
# plain sort + cumsum formula's, written out). On float32 rows the division never needs them.
_ROUNDING_ROWS = [
    ([0.24205169752199365, 0.27756244132845936, *[0.03679391342700999] * 8, 0.02977714501431825,
      0.011340850364213171], 0.7035837059855029, [1] * 7 + [0] * 5),  # the quotient lands one above: m − 1
    ([*[0.047123218973707644] * 6, 0.013620930583392055, 0.02541357649256487, 0.03742417407126353],
     0.23561609486853824, [1] * 6 + [0] * 3),  # the quotient lands one below: m + 1
    ([*[0.023876137620936756] * 8, 0.008034969635208602, 0.006408956995371819, 0.008099097260555785],
     0.11938068810468379, [1] * 6 + [0] * 5),
]


@pytest.mark.meta
@pytest.mark.clause("SAC-TOPP-1")
@pytest.mark.parametrize("row, p, kept", _ROUNDING_ROWS, ids=["one-above", "one-below", "one-below-8-ties"])
def test_threshold_corrects_a_tie_count_that_the_division_rounds(row, p, kept):
    probs = torch.tensor([row], dtype=torch.float64)
    mask = torch.ones_like(probs, dtype=torch.bool)
    for method in ("threshold", "sorted"):
        got = backup.top_p_select(probs, mask, p=p, method=method)
        assert_equal(got, torch.tensor([kept], dtype=torch.bool), "SAC-TOPP-1", f"{method}: ties counted exactly")


@pytest.mark.meta
@pytest.mark.clause("SAC-TOPP-1")
def test_a_legal_mass_of_exactly_p_keeps_only_the_actions_that_carry_it():
    """The legal mass is exactly p (0.5 + 0.25; the illegal action holds the rest): the set is the two
    actions that reach it, not every legal action (the fallback for a legal mass short of p), so the legal
    action of probability 0 stays out."""
    probs = torch.tensor([[0.5, 0.25, 0.0, 0.25]])
    mask = torch.tensor([[True, True, True, False]])
    for method in ("threshold", "sorted"):
        got = backup.top_p_select(probs, mask, p=0.75, method=method)
        assert_equal(got, torch.tensor([[True, True, False, False]]), "SAC-TOPP-1", f"{method}: mass exactly p")
