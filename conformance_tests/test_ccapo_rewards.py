"""CCAPO §4 and §7.1: the time-penalised macro return, the micro reward and the loop filter."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance_tests import strategies as st_
from conformance_tests.harness import assert_close, assert_equal, assert_rejects

F64 = torch.float64


@pytest.mark.clause("CCAPO-R-1")
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 200)), min_size=1, max_size=10))
def test_macro_return_formula(ccapo, rows):
    succ = torch.tensor([s for s, _ in rows])
    steps = torch.tensor([n for _, n in rows])
    want = np.array([10.0 * s for s, _ in rows]) + np.array([n for _, n in rows]) * -0.1
    assert_close(ccapo.macro_return(succ, steps), want, "CCAPO-R-1", what="defaults R_terminal=10, R_penalty=-0.1")


@pytest.mark.clause("CCAPO-R-1")
@given(st.floats(0.0, 100.0), st.floats(-1.0, 0.0), st.integers(0, 100), st.booleans())
def test_macro_return_constants_are_parameters(ccapo, r_term, r_pen, n, s):
    got = ccapo.macro_return(torch.tensor([s]), torch.tensor([n]), r_terminal=r_term, r_penalty=r_pen)
    assert_close(got, [r_term * s + n * r_pen], "CCAPO-R-1")


@pytest.mark.clause("CCAPO-R-2")
def test_document_table(ccapo):
    # §4.1 table: success 10/20/40 steps, failure 30/50 steps
    succ = torch.tensor([True, True, True, False, False])
    steps = torch.tensor([10, 20, 40, 30, 50])
    assert_close(ccapo.macro_return(succ, steps), [9.0, 8.0, 6.0, -3.0, -5.0], "CCAPO-R-2")


@pytest.mark.clause("CCAPO-R-2")
def test_ten_vs_forty_step_gap(ccapo):
    r = ccapo.macro_return(torch.tensor([True, True]), torch.tensor([10, 40]))
    assert_close(r[0] - r[1], 3.0, "CCAPO-R-2", what="v4.1 gap")
    old = ccapo.macro_return(torch.tensor([True, True]), torch.tensor([10, 40]), r_penalty=-0.05)
    assert_close(old[0] - old[1], 1.5, "CCAPO-R-2", what="v4.0 gap (R_penalty=-0.05)")
    assert_close((r[0] - r[1]) / (old[0] - old[1]), 2.0, "CCAPO-R-2", what="doubled")


# ---------------------------------------------------------------------------------------- loops
def np_loops(ids):
    ids = list(ids)
    return [t > 0 and (ids[t] == ids[t - 1] or (t > 1 and ids[t] == ids[t - 2])) for t in range(len(ids))]


@pytest.mark.clause("CCAPO-LOOP-1")
@given(st_.ccapo_fingerprint_seqs())
def test_loop_mask_matches_brute_force(ccapo, ids):
    assert_equal(ccapo.loop_mask(ids), torch.tensor(np_loops(ids.tolist())), "CCAPO-LOOP-1", f"ids {ids.tolist()}")


@pytest.mark.clause("CCAPO-LOOP-1")
@pytest.mark.parametrize("ids, want", [
    ([0, 0], [False, True]),                      # A -> A
    ([0, 1, 0], [False, False, True]),            # A -> B -> A
    ([0, 1, 2, 0], [False, False, False, False]),  # A -> B -> C -> A is not a short loop
    ([3], [False]),
])
def test_loop_mask_golden(ccapo, ids, want):
    assert_equal(ccapo.loop_mask(torch.tensor(ids)), torch.tensor(want), "CCAPO-LOOP-1", f"ids {ids}")


@pytest.mark.clause("CCAPO-LOOP-1")
@given(st_.ccapo_fingerprint_seqs(), st_.ccapo_fingerprint_seqs())
def test_loop_mask_batched_equals_rows(ccapo, a, b):
    T = min(len(a), len(b))
    batch = torch.stack([a[:T], b[:T]])
    got = ccapo.loop_mask(batch)
    assert_equal(got, torch.stack([ccapo.loop_mask(a[:T]), ccapo.loop_mask(b[:T])]), "CCAPO-LOOP-1", "row-wise")


@pytest.mark.clause("CCAPO-MICRO-1")
@given(st.lists(st.tuples(st.floats(0.01, 0.99), st.booleans(), st.booleans()), min_size=1, max_size=10))
def test_micro_reward_is_q_of_seen_edges(ccapo, rows):
    q = torch.tensor([r[0] for r in rows], dtype=F64)
    seen = torch.tensor([r[1] for r in rows])
    loop = torch.tensor([r[2] for r in rows])
    want = np.array([r[0] if (r[1] and not r[2]) else 0.0 for r in rows])
    assert_equal(ccapo.micro_reward(q, seen, loop), torch.tensor(want, dtype=F64), "CCAPO-MICRO-1")


@pytest.mark.clause("CCAPO-MICRO-1")
def test_micro_reward_golden(ccapo):
    got = ccapo.micro_reward(torch.tensor([0.6, 0.3, 0.8], dtype=F64), torch.tensor([True, False, True]),
                             torch.zeros(3, dtype=torch.bool))
    assert_equal(got, torch.tensor([0.6, 0.0, 0.8], dtype=F64), "CCAPO-MICRO-1", "missing edge -> 0")


@pytest.mark.clause("CCAPO-LOOP-2")
def test_loops_lose_micro_reward_but_pay_time(ccapo):
    # A B A A C, success: steps 3 (A->B->A) and 4 (A->A) are loops; all 5 steps are charged
    ids = torch.tensor([0, 1, 0, 0, 2])
    loops = ccapo.loop_mask(ids)
    q = torch.full((5,), 0.7, dtype=F64)
    r_micro = ccapo.micro_reward(q, torch.ones(5, dtype=torch.bool), loops)
    assert_equal(r_micro, torch.tensor([0.7, 0.7, 0.0, 0.0, 0.7], dtype=F64), "CCAPO-LOOP-2", "R_micro of loops")
    r_tau = ccapo.macro_return(torch.tensor([True]), torch.tensor([len(ids)]))
    assert_close(r_tau, [10.0 - 0.5], "CCAPO-LOOP-2", what="N_step counts the looped steps")


@pytest.mark.clause("CCAPO-INPUT-2")
def test_negative_steps_rejected(ccapo):
    assert_rejects("CCAPO-INPUT-2", ccapo.raw("macro_return"), torch.tensor([True]), torch.tensor([-1]))


@pytest.mark.clause("CCAPO-INPUT-3")
def test_reward_shape_mismatch_rejected(ccapo):
    assert_rejects("CCAPO-INPUT-3", ccapo.raw("macro_return"), torch.tensor([True, False]), torch.tensor([3]))
    assert_rejects("CCAPO-INPUT-3", ccapo.raw("micro_reward"), torch.tensor([0.5, 0.5], dtype=F64),
                   torch.tensor([True]), torch.tensor([False, False]))


# A 0-d id tensor has no step axis and is rejected as bad input naming CCAPO-INPUT-3.
@pytest.mark.clause("CCAPO-INPUT-3")
def test_loop_mask_rejects_ids_without_a_step_axis(ccapo):

    assert_rejects("CCAPO-INPUT-3", ccapo.raw("loop_mask"), torch.tensor(7))
