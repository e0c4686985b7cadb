"""CCAPO §5: macro (group z-score), micro (historical baseline, batch z-score with sigma_min), fusion."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_close,
    assert_equal,
    assert_rejects,
    assert_that,
    convention,
    np_standardise,
    require_dtype,
    to_numpy,
)

F64 = torch.float64


def np_single_member(r: np.ndarray) -> np.ndarray:
    """A one-member group under min_group_size "raw": standardised with mean 0 and std 1 (its raw score,
    divided by 1 + eps, or by max(1, eps) in clamp mode, as the advantage_std convention says)."""
    conv = convention("advantage_std")
    return r / (max(1.0, conv["eps"]) if conv["eps_mode"] == "clamp" else 1.0 + conv["eps"])


def np_macro(r):
    """The group z-score under the advantage_std convention (the seed: population std + 1e-8); an all-equal
    group of two or more is exactly 0 whatever is declared (CCAPO-MACRO-2, normative), a one-member group
    is 0 too unless min_group_size "raw" is declared."""
    r = np.asarray(r, float)
    if r.shape[-1] == 1 and convention("min_group_size") == "raw":
        return np_single_member(r)
    out = np_standardise(r, convention("advantage_std"))
    flat = np.ptp(r, axis=-1, keepdims=True) == 0
    return np.where(flat, 0.0, out)


def _z(centred: np.ndarray, sum_sq: float) -> np.ndarray:
    """Hand z-scores of one group from its centred values and their sum of squares, under the convention."""
    conv = convention("advantage_std")
    sd = np.sqrt(sum_sq / (len(centred) - conv["ddof"]))
    return centred / (max(sd, conv["eps"]) if conv["eps_mode"] == "clamp" else sd + conv["eps"])


# ---------------------------------------------------------------------------------------- macro
@pytest.mark.clause("CCAPO-MACRO-1")
@given(st_.ccapo_return_groups(), st_.float_dtypes())
def test_macro_advantage_is_group_z_score(ccapo, r, dtype):
    r = r.to(dtype)  # the declared std convention on every declared dtype, not only float64
    got = ccapo.macro_advantage(r)
    r64 = r.double().numpy()
    # all-equal groups are CCAPO-MACRO-2's (exactly 0, every dtype): checked there, not counted twice here
    keep = (np.ptp(r64, axis=-1) > 0) | (r64.shape[-1] == 1)
    assert_close(to_numpy(got)[keep], np_macro(r64)[keep], "CCAPO-MACRO-1")


@pytest.mark.clause("CCAPO-MACRO-1")
@given(st_.ccapo_return_groups(max_groups=3, max_n=6))
def test_macro_advantage_rows_are_independent(ccapo, r):
    got = ccapo.macro_advantage(r)
    loop = torch.stack([ccapo.macro_advantage(row) for row in r])
    assert_close(got, to_numpy(loop), "CCAPO-MACRO-1", what="batched vs one group at a time")


@pytest.mark.clause("CCAPO-MACRO-1")
def test_macro_advantage_golden(ccapo):
    # the §4.1 table as one group: R = [9, 8, 6, -3, -5], mean 3, sum of squares 170 (population std sqrt(170/5))
    r = torch.tensor([9.0, 8.0, 6.0, -3.0, -5.0], dtype=F64)
    assert_close(ccapo.macro_advantage(r), _z(np.array([6.0, 5, 3, -6, -8]), 170.0), "CCAPO-MACRO-1")
    # two members: +-1 whatever the gap with the seed's population std (half the gap)
    assert_close(ccapo.macro_advantage(torch.tensor([9.0, 6.0], dtype=F64)), _z(np.array([1.5, -1.5]), 4.5),
                 "CCAPO-MACRO-1")


@pytest.mark.clause("CCAPO-MACRO-2")
@given(st.floats(-10, 10), st.integers(1, 9), st_.float_dtypes())
def test_degenerate_group_gives_zero(ccapo, value, n, dtype):
    n = max(n, 1 if convention("min_group_size") == 1 else 2)  # "raw": a single member keeps its score
    got = ccapo.macro_advantage(torch.full((n,), value, dtype=dtype))  # float32 too: its mean rounds more
    assert_equal(got, torch.zeros(n, dtype=dtype), "CCAPO-MACRO-2", f"{n} equal returns {value} in {dtype}")


@pytest.mark.clause("CCAPO-MACRO-2")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_seven_equal_returns_golden(ccapo, dtype):
    # seven successes of 10.1 (R_tau = 10 - 0.1·1): in float32 their computed mean is not 10.1, and a plain
    # z-score turns that rounding into advantages near ±1 (0.93 in one library)
    got = ccapo.macro_advantage(torch.full((1, 7), 10.1, dtype=dtype))
    assert_equal(got, torch.zeros(1, 7, dtype=dtype), "CCAPO-MACRO-2", f"seven equal returns of 10.1 in {dtype}")


@pytest.mark.clause("CCAPO-MACRO-2")
def test_single_member_group_is_zero_not_nan(ccapo):
    singles = torch.tensor([[7.3], [-2.0]], dtype=F64)
    smallest = convention("min_group_size")
    if smallest == 1:
        assert_equal(ccapo.macro_advantage(singles), torch.zeros(2, 1, dtype=F64), "CCAPO-MACRO-2",
                     "one trajectory per prompt")
    elif smallest == "raw":  # declared: the raw score (finite, never NaN)
        # the raw score divided by a computed 1 + eps: a reduction's rounding, not the exact zero of the rule
        assert_close(ccapo.macro_advantage(singles), np_single_member(to_numpy(singles)), "CCAPO-MACRO-2",
                     approx="reduction", what="one trajectory per prompt keeps its raw score")
    else:  # declared minimum of two: a single-member group is rejected, never NaN
        assert_rejects("CCAPO-MACRO-2", ccapo.raw("macro_advantage"), singles)
    tenths = ccapo.macro_advantage(torch.tensor([0.1, 0.1, 0.1], dtype=F64))  # mean rounds away from 0.1
    assert_equal(tenths, torch.zeros(3, dtype=F64), "CCAPO-MACRO-2", "rounding of the mean")


# The macro advantage's eps at its default: CCAPO-MACRO-1 states eps = 1e-8, and returns spread by ~1e-8
# make eps comparable to the std, so another default shows. Such a spread exists only in float64.
@pytest.mark.clause("CCAPO-MACRO-1")
def test_macro_advantage_default_eps_on_a_tiny_spread(ccapo):

    require_dtype(F64)
    r = np.array([1.0, 1.0 + 2e-8, 1.0 - 1e-8, 1.0 + 4e-8])
    # the seed's eps 1e-8 and population std, or the declared advantage_std convention
    want = np_standardise(r, convention("advantage_std", "CCAPO-MACRO-1"))
    assert_close(ccapo.macro_advantage(torch.tensor(r, dtype=F64)), want, "CCAPO-MACRO-1", approx="reduction",
                 what="macro_advantage without eps on returns 1e-8 apart")


# ---------------------------------------------------------------------------------------- micro raw
@pytest.mark.clause("CCAPO-MICRO-2")
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), st.booleans()), min_size=1, max_size=10))
def test_raw_micro_advantage(ccapo, rows):
    r = torch.tensor([x[0] for x in rows], dtype=F64)
    v = torch.tensor([x[1] for x in rows], dtype=F64)
    seen = torch.tensor([x[2] for x in rows])
    want = [x[0] - x[1] if x[2] else 0.0 for x in rows]
    assert_close(ccapo.micro_raw_advantage(r, v, seen), want, "CCAPO-MICRO-2")


@pytest.mark.clause("CCAPO-MICRO-2")
def test_raw_micro_advantage_golden(ccapo):
    # better than history, worse than history, unseen anchor, missing edge at a known anchor
    r = torch.tensor([0.7, 0.2, 0.9, 0.0], dtype=F64)
    v = torch.tensor([0.5, 0.5, 0.0, 0.4], dtype=F64)
    seen = torch.tensor([True, True, False, True])
    got = ccapo.micro_raw_advantage(r, v, seen)
    assert_close(got, [0.2, -0.3, 0.0, -0.4], "CCAPO-MICRO-2")
    assert_equal(got[2], torch.tensor(0.0, dtype=F64), "CCAPO-MICRO-2", "unseen anchor gives exactly 0")


# ---------------------------------------------------------------------------------------- micro z
def np_micro(raw, valid, sigma_min=0.1):
    v = raw[valid]
    z = (raw - v.mean()) / max(v.std(ddof=0), sigma_min)
    return np.where(valid, z, 0.0)


@pytest.mark.clause("CCAPO-MICRO-3")
@given(st_.ccapo_step_batches(), st.floats(0.01, 1.0))
def test_micro_advantage_batch_z_score(ccapo, batch, sigma_min):
    raw, valid = batch
    got = ccapo.micro_advantage(raw, sigma_min=sigma_min, valid=valid)
    assert_close(got, np_micro(to_numpy(raw), to_numpy(valid), sigma_min), "CCAPO-MICRO-3")


@pytest.mark.clause("CCAPO-MICRO-3")
@given(st_.ccapo_step_batches())
def test_micro_advantage_without_mask_uses_every_step(ccapo, batch):
    raw, _ = batch
    assert_close(ccapo.micro_advantage(raw), np_micro(to_numpy(raw), np.ones(raw.shape, bool)), "CCAPO-MICRO-3")


@pytest.mark.clause("CCAPO-MICRO-3")
def test_sigma_min_floor_golden(ccapo):
    # early training: 9 zeros and one 0.05 -> mean 0.005, std 0.015 < sigma_min = 0.1
    raw = torch.tensor([0.0] * 9 + [0.05], dtype=F64)
    got = ccapo.micro_advantage(raw)
    assert_close(got, (to_numpy(raw) - 0.005) / 0.1, "CCAPO-MICRO-3")
    assert_that(got.abs().max() < 1.0, "CCAPO-MICRO-3", got, "the lone non-zero value is not blown up to 3 sigma")
    # std above the floor: a plain population z-score
    wide = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=F64)
    assert_close(ccapo.micro_advantage(wide), [1.0, -1.0, 1.0, -1.0], "CCAPO-MICRO-3")


# ---------------------------------------------------------------------------------------- fusion
@pytest.mark.clause("CCAPO-FUSE-1")
@given(st.integers(1, 4), st.integers(1, 6), st.floats(0.0, 1.0), st.data())
def test_fusion(ccapo, B, T, beta, data):
    ma = data.draw(st_.tensors((B,), lo=-3, hi=3))
    mi = data.draw(st_.tensors((B, T), lo=-3, hi=3))
    got = ccapo.fuse_advantages(ma, mi, beta=beta)
    assert_close(got, to_numpy(ma)[:, None] + beta * to_numpy(mi), "CCAPO-FUSE-1")


@pytest.mark.clause("CCAPO-FUSE-1")
def test_fusion_golden_default_beta(ccapo):
    got = ccapo.fuse_advantages(torch.tensor([1.0, -0.5], dtype=F64), torch.tensor([[2.0, 0.0], [-1.0, 1.0]], dtype=F64))
    assert_close(got, [[2.0, 1.0], [-1.0, 0.0]], "CCAPO-FUSE-1", what="beta = 0.5")


# ---------------------------------------------------------------------------------------- bad input
@pytest.mark.clause("CCAPO-INPUT-1")
def test_nan_returns_rejected(ccapo):
    assert_rejects("CCAPO-INPUT-1", ccapo.raw("macro_advantage"), torch.tensor([1.0, float("nan")], dtype=F64))
    assert_rejects("CCAPO-INPUT-1", ccapo.raw("micro_advantage"), torch.tensor([0.1, float("inf")], dtype=F64))


@pytest.mark.clause("CCAPO-INPUT-3")
def test_advantage_shape_mismatch_rejected(ccapo):
    assert_rejects("CCAPO-INPUT-3", ccapo.raw("fuse_advantages"), torch.zeros(3, dtype=F64), torch.zeros(2, 4, dtype=F64))
    assert_rejects("CCAPO-INPUT-3", ccapo.raw("micro_raw_advantage"), torch.zeros(3, dtype=F64),
                   torch.zeros(2, dtype=F64), torch.ones(3, dtype=torch.bool))
    assert_rejects("CCAPO-INPUT-3", ccapo.raw("micro_advantage"), torch.zeros(3, dtype=F64),
                   valid=torch.ones(4, dtype=torch.bool))


@pytest.mark.clause("CCAPO-INPUT-5")
def test_bad_advantage_hyper_parameters_rejected(ccapo):
    assert_rejects("CCAPO-INPUT-5", ccapo.raw("micro_advantage"), torch.zeros(3, dtype=F64), sigma_min=0.0)
    assert_rejects("CCAPO-INPUT-5", ccapo.raw("fuse_advantages"), torch.zeros(2, dtype=F64),
                   torch.zeros(2, 3, dtype=F64), beta=-0.5)


# A 0-d tensor (no group axis) and an empty group are each rejected as bad input naming CCAPO-INPUT-3, not
# left to fail later on indexing or on an empty reduction.
@pytest.mark.clause("CCAPO-INPUT-3")
@pytest.mark.parametrize("returns", [torch.tensor(1.5, dtype=F64), torch.zeros(2, 0, dtype=F64)], ids=["0-d", "empty group"])
def test_macro_advantage_rejects_a_missing_or_empty_group(ccapo, returns):

    assert_rejects("CCAPO-INPUT-3", ccapo.raw("macro_advantage"), returns)
