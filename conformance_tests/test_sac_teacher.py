"""SAC §7: dual-buffer mix, DAgger schedule and teacher-conflict handling."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance_tests import strategies as st_
from conformance_tests.harness import assert_close, assert_equal, assert_that, to_numpy


@pytest.mark.clause("SAC-MIX-1")
@given(st.integers(1, 5000), st.floats(0.01, 0.99))
def test_mix_counts_split_the_batch_by_rho(sac, batch, rho):
    n_agent, n_demo = sac.mix_counts(batch, rho=rho)
    assert_equal(n_agent + n_demo, batch, "SAC-MIX-1", "the two parts sum to B")
    assert_equal(n_agent, int(np.floor(rho * batch + 0.5)), "SAC-MIX-1", "|B_agent| = floor(ρB + 1/2)")


@pytest.mark.clause("SAC-MIX-1")
def test_mix_counts_golden(sac):
    assert_equal(sac.mix_counts(2048, rho=0.75), (1536, 512), "SAC-MIX-1")


@pytest.mark.clause("SAC-MIX-1")
def test_mix_counts_default_rho_is_three_quarters(sac):
    assert_equal(sac.mix_counts(2048), (1536, 512), "SAC-MIX-1", "ρ left out: the document's 0.75")


@pytest.mark.clause("SAC-DAGGER-1")
@given(st.integers(0, 600_000), st.integers(0, 600_000), st.integers(1, 300_000))
def test_teacher_ratio_anneals_linearly_then_holds(sac, s1, s2, horizon):
    lo, hi = sorted((s1, s2))
    r_lo = sac.dagger_teacher_ratio(lo, horizon=horizon)
    r_hi = sac.dagger_teacher_ratio(hi, horizon=horizon)
    assert_that(r_hi <= r_lo + 1e-12, "SAC-DAGGER-1", (r_lo, r_hi), "non-increasing in the step count")
    expected = 1.0 + (0.1 - 1.0) * min(hi / horizon, 1.0)
    assert_close(float(r_hi), expected, "SAC-DAGGER-1")


@pytest.mark.clause("SAC-DAGGER-1")
@given(st.integers(0, 400_000), st.floats(0.5, 1.0), st.floats(0.0, 0.5), st.integers(1, 300_000))
def test_teacher_ratio_anneals_between_the_endpoints_it_is_given(sac, step, start, end, horizon):
    got = sac.dagger_teacher_ratio(step, start=start, end=end, horizon=horizon)
    assert_close(float(got), start + (end - start) * min(step / horizon, 1.0), "SAC-DAGGER-1",
                 what=f"start {start}, end {end}, horizon {horizon}")


@pytest.mark.clause("SAC-DAGGER-1")
def test_teacher_ratio_golden(sac):
    got = [sac.dagger_teacher_ratio(s) for s in (0, 100_000, 200_000, 400_000)]
    assert_close(np.array(got, dtype=float), [1.0, 0.55, 0.1, 0.1], "SAC-DAGGER-1")


@st.composite
def teacher_cases(draw):
    B, V = draw(st_.batch_shapes(max_batch=8, min_actions=3, max_actions=12))
    mask = draw(st_.legal_masks((B, V)))
    a = torch.tensor(draw(st.lists(st.integers(0, V - 1), min_size=B, max_size=B)))
    return a, mask


@pytest.mark.clause("SAC-TEACHER-1")
@given(teacher_cases())
def test_reject_mode_drops_only_illegal_teacher_actions(sac, case):
    a, mask = case
    action, accepted, relabeled = sac.resolve_teacher_action(a, mask, mode="reject")
    legal = mask[torch.arange(len(a)), a]
    assert_equal(accepted, legal, "SAC-TEACHER-1", "accepted exactly when legal")
    assert_equal(relabeled, torch.zeros_like(legal), "SAC-TEACHER-1", "reject never relabels")
    assert_equal(action[legal], a[legal], "SAC-TEACHER-1", "legal actions unchanged")


@pytest.mark.clause("SAC-TEACHER-1")
@given(teacher_cases())
def test_relabel_mode_maps_to_nearest_legal_action(sac, case):
    a, mask = case
    action, accepted, relabeled = sac.resolve_teacher_action(a, mask, mode="relabel")
    mn = to_numpy(mask)
    for b, t in enumerate(a.tolist()):
        legal_ids = np.flatnonzero(mn[b])
        want = t if mn[b, t] else int(legal_ids[np.argmin(np.abs(legal_ids - t))])  # first minimum = lower id
        assert_equal(int(action[b]), want, "SAC-TEACHER-1", f"row {b}")
        assert_equal(bool(relabeled[b]), not mn[b, t], "SAC-TEACHER-1", f"is_relabeled of row {b}")
        assert_equal(bool(accepted[b]), True, "SAC-TEACHER-1", "relabelled samples are kept")


@pytest.mark.clause("SAC-TEACHER-1")
def test_reject_is_the_default_mode(sac):
    """mode left out: an illegal teacher action is dropped, not relabelled (the contract's default)."""
    mask = torch.tensor([[True, False, False, True], [False, True, True, False]])
    action, accepted, relabeled = sac.resolve_teacher_action(torch.tensor([2, 1]), mask)
    assert_equal(accepted, [False, True], "SAC-TEACHER-1", "accepted exactly when legal")
    assert_equal(relabeled, [False, False], "SAC-TEACHER-1", "the default never relabels")
    assert_equal(action[1:], [1], "SAC-TEACHER-1", "a legal action passes unchanged")


@pytest.mark.clause("SAC-TEACHER-1")
def test_relabel_golden_with_distance_matrix(sac):
    mask = torch.tensor([[True, False, False, True]])
    # by id distance action 2 is nearest to 3; an embedding distance can say 0 instead
    action, _, rel = sac.resolve_teacher_action(torch.tensor([2]), mask, mode="relabel")
    assert_equal(action, [3], "SAC-TEACHER-1")
    assert_equal(rel, [True], "SAC-TEACHER-1")
    dist = torch.tensor([[0, 1, 1, 1], [1, 0, 1, 1], [0.5, 1, 0, 2.0], [1, 1, 1, 0]], dtype=torch.float64)
    action, _, _ = sac.resolve_teacher_action(torch.tensor([2]), mask, mode="relabel", distance=dist)
    assert_equal(action, [0], "SAC-TEACHER-1")
    # d(a*, a) is the row of the teacher's action: an asymmetric matrix whose column of 2 says 3 instead
    dist[3, 2] = 0.1
    action, _, _ = sac.resolve_teacher_action(torch.tensor([2]), mask, mode="relabel", distance=dist)
    assert_equal(action, [0], "SAC-TEACHER-1", "the nearest legal action by distance[a*, a] (the row of a* = 2)")
