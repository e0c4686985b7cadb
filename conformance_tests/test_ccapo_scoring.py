"""CCAPO §3.2: I(E), C(E), D(E), Q_STDB and the per-step STDB lookup."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import expit

from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_close,
    assert_equal,
    assert_rejects,
    assert_that,
    to_numpy,
)

EPS = 1e-8
F64 = torch.float64


def np_importance(ns, nt, a=1.0):
    return (np.asarray(ns, float) + a) / (np.asarray(nt, float) + 2 * a)


def np_criticality(ns, nt, gs, gt, eps=EPS):
    return (np.asarray(ns, float) / (np.asarray(nt, float) + eps)) / (gs / (gt + eps) + eps)


def np_q(i, c, d, lam=1.0):
    return expit(np.log(i * (1 + lam * c) * d))  # the document's form, sigma(log x)


# ---------------------------------------------------------------------------------------- I(E)
@pytest.mark.clause("CCAPO-I-1")
@given(st_.ccapo_edge_counts(), st.floats(0.1, 5.0))
def test_importance_formula(ccapo, counts, a):
    ns, nt = counts
    got = ccapo.importance(ns, nt, alpha_smooth=a)
    assert_close(got, np_importance(to_numpy(ns), to_numpy(nt), a), "CCAPO-I-1")
    assert_that((got > 0) & (got < 1), "CCAPO-I-1", got, "I in (0, 1)")


@pytest.mark.clause("CCAPO-I-1")
def test_importance_golden(ccapo):
    # unseen edge -> 0.5 (prior); 3/4 successes -> 4/6; 0/10 -> 1/12; 1000/1000 -> 1001/1002
    ns = torch.tensor([0, 3, 0, 1000])
    nt = torch.tensor([0, 4, 10, 1000])
    assert_close(ccapo.importance(ns, nt), [0.5, 4 / 6, 1 / 12, 1001 / 1002], "CCAPO-I-1")


@pytest.mark.clause("CCAPO-I-1")
def test_importance_tends_to_conditional_rate(ccapo):
    nt = torch.tensor([10.0, 1e3, 1e6], dtype=F64)
    got = ccapo.importance(0.3 * nt, nt)
    assert_that(bool((got[1:] - 0.3).abs().lt((got[:-1] - 0.3).abs()).all()), "CCAPO-I-1", got,
                "approaching N_succ/N_total = 0.3 as data grows")


@pytest.mark.clause("CCAPO-I-1", "CCAPO-STDB-5")
@pytest.mark.parametrize("n_total", [0, 1, 7])
def test_lookup_uses_smoothed_conditional_importance(ccapo, n_total):
    # nothing has succeeded anywhere: C = 0 and D = 1, so Q = I/(1+I) with I = 1/(n_total + 2).
    # v4.0's marginal I = 0/(0 + eps) = 0 would give Q = 0.
    stats = {"edges": {("hall", "<START>", "OPEN(chest)"): {"n_total": n_total, "n_succ": 0, "d_sum": 0.0}},
             "anchors": {}, "n_succ_total": 0, "n_total_global": max(n_total, 1)}
    got = ccapo.score_steps(stats, [("hall", "<START>")], ["OPEN(chest)"])
    i = 1 / (n_total + 2)
    assert_close(got["q"], [i / (1 + i)], "CCAPO-I-1")


# ---------------------------------------------------------------------------------------- C(E)
@pytest.mark.clause("CCAPO-C-1")
@given(st_.ccapo_edge_counts(), st_.ccapo_global_counts(), st.one_of(st.just(EPS), st.floats(1e-6, 0.5)))
def test_criticality_formula(ccapo, counts, glob, eps):
    ns, nt = counts
    got = ccapo.criticality(ns, nt, float(glob[0]), float(glob[1]), eps=eps)
    assert_close(got, np_criticality(to_numpy(ns), to_numpy(nt), *glob, eps=eps), "CCAPO-C-1", what=f"eps {eps}")


@pytest.mark.clause("CCAPO-C-1")
def test_criticality_golden(ccapo):
    # global rate 40/100 = 0.4; edge 8/10 = 0.8 -> lift 2; edge 2/10 -> 0.5; average edge -> 1
    got = ccapo.criticality(torch.tensor([8, 2, 4]), torch.tensor([10, 10, 10]), 40.0, 100.0)
    assert_close(got, [(k / (10 + EPS)) / (40 / (100 + EPS) + EPS) for k in (8, 2, 4)], "CCAPO-C-1")
    assert_that(np.allclose(to_numpy(got), [2.0, 0.5, 1.0], rtol=1e-7), "CCAPO-C-1", got, "[2, 0.5, 1] up to eps")
    none = ccapo.criticality(torch.tensor([0]), torch.tensor([5]), 0.0, 5.0)
    assert_equal(none, torch.tensor([0.0], dtype=F64), "CCAPO-C-1", "no success anywhere: C = 0, not NaN")


# ---------------------------------------------------------------------------------------- D(E)
@pytest.mark.clause("CCAPO-D-1")
@given(st.lists(st.floats(0, 100), min_size=1, max_size=8), st.floats(0.0, 2.0))
def test_distance_decay_formula(ccapo, d, k):
    got = ccapo.distance_decay(torch.tensor(d, dtype=F64), distance_exponent=k)
    assert_close(got, (np.array(d) + 1.0) ** (-k), "CCAPO-D-1")


@pytest.mark.clause("CCAPO-D-1")
def test_distance_decay_golden(ccapo):
    # default exponent 0.5: d = 0 -> 1, d = 3 -> 1/2, d = 8 -> 1/3
    assert_close(ccapo.distance_decay(torch.tensor([0.0, 3.0, 8.0], dtype=F64)), [1.0, 0.5, 1 / 3], "CCAPO-D-1")


# ---------------------------------------------------------------------------------------- Q_STDB
@st.composite
def _icd(draw):
    n = draw(st.integers(1, 8))
    i = draw(st.lists(st.floats(1e-3, 1.0), min_size=n, max_size=n))
    c = draw(st.lists(st.floats(0.0, 50.0), min_size=n, max_size=n))
    d = draw(st.lists(st.floats(1e-2, 1.0), min_size=n, max_size=n))
    return [torch.tensor(v, dtype=F64) for v in (i, c, d)]


@pytest.mark.clause("CCAPO-Q-1")
@given(_icd(), st.floats(0.0, 3.0))
def test_q_is_sigmoid_of_log(ccapo, icd, lam):
    i, c, d = icd
    got = ccapo.q_stdb(i, c, d, lam=lam)
    assert_close(got, np_q(to_numpy(i), to_numpy(c), to_numpy(d), lam), "CCAPO-Q-1")
    x = (i * (1 + lam * c) * d).numpy()
    assert_close(got, x / (1 + x), "CCAPO-Q-1", what="sigma(log x) = x/(1+x)")
    assert_that((got > 0) & (got < 1), "CCAPO-Q-1", got, "Q in (0, 1)")


@pytest.mark.clause("CCAPO-Q-1")
@given(_icd())
def test_q_is_monotone(ccapo, icd):
    i, c, d = icd
    base = ccapo.q_stdb(i, c, d)
    for name, bumped in (("I", (i * 1.01, c, d)), ("C", (i, c + 0.5, d)), ("D", (i, c, d * 1.01))):
        assert_that(ccapo.q_stdb(*bumped) > base, "CCAPO-Q-1", name, f"Q increasing in {name}")


@pytest.mark.clause("CCAPO-Q-1")
def test_q_golden(ccapo):
    # I = 2/3, C = 1, D = 1/sqrt(2), lambda = 1: x = (2/3)(2)(1/sqrt 2) = 2 sqrt(2)/3; Q = x/(1+x)
    x = 2 * math.sqrt(2) / 3
    got = ccapo.q_stdb(torch.tensor([2 / 3], dtype=F64), torch.tensor([1.0], dtype=F64),
                       torch.tensor([1 / math.sqrt(2)], dtype=F64))
    assert_close(got, [x / (1 + x)], "CCAPO-Q-1")
    # x = 1 -> Q = 1/2 exactly
    half = ccapo.q_stdb(torch.tensor([0.5], dtype=F64), torch.tensor([1.0], dtype=F64), torch.tensor([1.0], dtype=F64))
    assert_close(half, [0.5], "CCAPO-Q-1")


# ---------------------------------------------------------------------------------------- lookup
@pytest.mark.clause("CCAPO-STDB-5")
def test_score_steps_golden(ccapo):
    # one stored edge: 3 of 4 passes succeeded at mean distance 1; global 5 of 10 trajectories
    e = ("hall", "GOTO(hall)", "TAKE(key)")
    stats = {"edges": {e: {"n_total": 4, "n_succ": 3, "d_sum": 3.0}},
             "anchors": {("hall", "GOTO(hall)"): {"v_bar": 0.4, "n_updates": 3}},
             "n_succ_total": 5, "n_total_global": 10}
    anchors = [("kitchen", "<START>"), ("hall", "GOTO(hall)")]
    got = ccapo.score_steps(stats, anchors, ["GOTO(hall)", "TAKE(key)"])
    i, c, d = 4 / 6, (3 / (4 + EPS)) / (5 / (10 + EPS) + EPS), 1 / math.sqrt(2)
    x = i * (1 + c) * d
    assert_close(got["q"], [0.0, x / (1 + x)], "CCAPO-STDB-5", what="q")
    assert_equal(got["edge_seen"], torch.tensor([False, True]), "CCAPO-STDB-5", "edge_seen")
    assert_close(got["v_bar"], [0.0, 0.4], "CCAPO-STDB-5", what="v_bar")
    assert_equal(got["anchor_seen"], torch.tensor([False, True]), "CCAPO-STDB-5", "anchor_seen")


# V̄ belongs to the anchor (location, previous fingerprint), not to the location (CCAPO-ANCHOR-1): two anchors in
# one room keep their own baselines, and a third one there is unseen. A seen anchor stays seen when the edge taken
# from it is new: the MICRO-2 errata read A_raw = 0 − V̄ there, so its V̄ must reach the advantage.
@pytest.mark.clause("CCAPO-STDB-5")
def test_score_steps_looks_v_bar_up_by_the_whole_anchor(ccapo):
    stats = {"edges": {("hall", "GOTO(hall)", "TAKE(key)"): {"n_total": 4, "n_succ": 3, "d_sum": 3.0}},
             "anchors": {("hall", "<START>"): {"v_bar": 0.7, "n_updates": 2},
                         ("hall", "GOTO(hall)"): {"v_bar": 0.4, "n_updates": 3}},
             "n_succ_total": 5, "n_total_global": 10}
    anchors = [("hall", "<START>"), ("hall", "GOTO(hall)"), ("hall", "GOTO(hall)"), ("hall", "OPEN(door)")]
    got = ccapo.score_steps(stats, anchors, ["GOTO(hall)", "TAKE(key)", "DROP(key)", "TAKE(key)"])
    assert_equal(got["edge_seen"], torch.tensor([False, True, False, False]), "CCAPO-STDB-5", "edge_seen")
    assert_equal(got["anchor_seen"], torch.tensor([True, True, True, False]), "CCAPO-STDB-5",
                 "anchor_seen: by (location, previous fingerprint), whether or not the edge is stored")
    assert_close(got["v_bar"], [0.7, 0.4, 0.4, 0.0], "CCAPO-STDB-5", what="v_bar of each step's own anchor")


@pytest.mark.clause("CCAPO-STDB-5")
@given(st_.ccapo_edge_counts(max_len=4), st.data())
def test_score_steps_matches_formula(ccapo, counts, data):
    """At the document's values or at drawn ones: the scoring keywords are the caller's."""
    ns, nt = counts
    n = len(ns)
    keys = [(f"loc{k}", "<START>", f"A{k}") for k in range(n)]
    dsum = [float(data.draw(st.integers(0, 5 * int(s)))) for s in ns.tolist()]
    gt = int(nt.max()) + data.draw(st.integers(0, 5))
    gs = data.draw(st.integers(int(ns.max()), max(int(ns.max()), gt)))
    stats = {"edges": {k: {"n_total": int(t), "n_succ": int(s), "d_sum": ds}
                       for k, t, s, ds in zip(keys, nt.tolist(), ns.tolist(), dsum)},
             "anchors": {}, "n_succ_total": gs, "n_total_global": gt}
    hp = data.draw(st.one_of(st.just(dict(alpha_smooth=1.0, distance_exponent=0.5, lam=1.0, eps=EPS)),
                             st.fixed_dictionaries(dict(alpha_smooth=st.floats(0.1, 5.0),
                                                        distance_exponent=st.floats(0.0, 2.0),
                                                        lam=st.floats(0.0, 3.0), eps=st.floats(1e-8, 0.5)))))
    got = ccapo.score_steps(stats, [k[:2] for k in keys], [k[2] for k in keys], **hp)
    nsn, ntn = to_numpy(ns).astype(float), to_numpy(nt).astype(float)
    dg = np.where(nsn > 0, np.array(dsum) / np.maximum(nsn, 1), 0.0)
    want = np_q(np_importance(nsn, ntn, hp["alpha_smooth"]), np_criticality(nsn, ntn, gs, gt, eps=hp["eps"]),
                (dg + 1) ** -hp["distance_exponent"], lam=hp["lam"])
    assert_close(got["q"], want, "CCAPO-STDB-5", what=f"under {hp}")


# ---------------------------------------------------------------------------------------- bad input
@pytest.mark.clause("CCAPO-INPUT-1")
def test_nan_counts_rejected(ccapo):
    assert_rejects("CCAPO-INPUT-1", ccapo.raw("importance"), torch.tensor([float("nan")]), torch.tensor([1.0]))
    assert_rejects("CCAPO-INPUT-1", ccapo.raw("q_stdb"), torch.tensor([0.5]), torch.tensor([float("inf")]),
                   torch.tensor([1.0]))


@pytest.mark.clause("CCAPO-INPUT-2")
def test_impossible_counts_rejected(ccapo):
    assert_rejects("CCAPO-INPUT-2", ccapo.raw("importance"), torch.tensor([5]), torch.tensor([3]))
    assert_rejects("CCAPO-INPUT-2", ccapo.raw("importance"), torch.tensor([-1]), torch.tensor([3]))
    assert_rejects("CCAPO-INPUT-2", ccapo.raw("criticality"), torch.tensor([1]), torch.tensor([3]), -1.0, 4.0)
    assert_rejects("CCAPO-INPUT-2", ccapo.raw("distance_decay"), torch.tensor([-2.0]))


@pytest.mark.clause("CCAPO-INPUT-5")
def test_bad_scoring_hyper_parameters_rejected(ccapo):
    one = torch.tensor([1.0], dtype=F64)
    assert_rejects("CCAPO-INPUT-5", ccapo.raw("importance"), one, one, alpha_smooth=0.0)
    assert_rejects("CCAPO-INPUT-5", ccapo.raw("distance_decay"), one, distance_exponent=-0.5)
    assert_rejects("CCAPO-INPUT-5", ccapo.raw("q_stdb"), one * 0.5, one, one, lam=-1.0)
