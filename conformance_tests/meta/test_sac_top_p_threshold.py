"""The reference's radix-threshold Top-p path (reference_impl.sac.backup), differentially against the
plain sort + cumsum formula kept beside it as its oracle: the same selected set and the same soft value,
also when the fast path runs one row at a time as it does on a big batch.
"""
from __future__ import annotations

from unittest import mock

import pytest
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
