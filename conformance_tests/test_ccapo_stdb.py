"""CCAPO §7.2/§7.3: the STDB update rule, a pure contract operation.

The rule is checked through ``ccapo.stdb_update`` against an independent replay of the trajectory
stream (``replay`` below, which the tests of our own stores in meta/ share).
"""
from __future__ import annotations

import copy
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_close,
    assert_equal,
    assert_rejects,
    assert_that,
)

EMPTY = {"edges": {}, "anchors": {}, "n_succ_total": 0, "n_total_global": 0}
EPS = 1e-8


DEFAULT_HP = dict(v_rate=0.1, alpha_smooth=1.0, distance_exponent=0.5, lam=1.0, eps=EPS)


def _feed(ccapo, stream, **hp):
    stats = copy.deepcopy(EMPTY)
    for tr in stream:
        stats = ccapo.stdb_update(stats, tr, **hp)
    return stats


def _q(ns, nt, d_sum, gs, gt, *, alpha_smooth=1.0, distance_exponent=0.5, lam=1.0, eps=EPS):
    """Q_STDB from counts (independent of the implementation); the defaults are the document's."""
    i = (ns + alpha_smooth) / (nt + 2.0 * alpha_smooth)
    c = (ns / (nt + eps)) / (gs / (gt + eps) + eps)
    d = (d_sum / ns if ns > 0 else 0.0) + 1.0
    x = i * (1 + lam * c) * d ** -distance_exponent
    return x / (1 + x)


def replay(stream, eta=0.1, **q_hp):
    """Brute-force oracle: counts by set membership per trajectory, V-bar by an explicit EMA replay."""
    edges, anchors, gs, gt = {}, {}, 0, 0
    for tr in stream:
        T, ok = len(tr["fingerprints"]), tr["success"]
        gt += 1
        gs += int(ok)
        order = []
        for t, (a, f) in enumerate(zip(tr["anchors"], tr["fingerprints"])):
            k = (*a, f)
            if k not in order:
                order.append(k)
        for k in order:
            e = edges.setdefault(k, [0, 0, 0.0])
            e[0] += 1
            if ok:
                last = max(t for t, (a, f) in enumerate(zip(tr["anchors"], tr["fingerprints"])) if (*a, f) == k)
                e[1] += 1
                e[2] += T - 1 - last
        if ok:
            for k in order:
                q = _q(edges[k][1], edges[k][0], edges[k][2], gs, gt, **q_hp)
                u = k[:2]
                anchors[u] = q if u not in anchors else (1 - eta) * anchors[u] + eta * q
    return edges, anchors, gs, gt


@pytest.mark.clause("CCAPO-STDB-1")
@given(st_.ccapo_streams())
def test_n_total_counts_every_trajectory(ccapo, stream):
    got = _feed(ccapo, stream)
    edges, _, _, gt = replay(stream)
    assert_equal(got["n_total_global"], gt, "CCAPO-STDB-1", "N_total_global = number of trajectories")
    assert_equal(sorted(got["edges"]), sorted(edges), "CCAPO-STDB-1", "edges stored")
    for k, e in edges.items():
        assert_equal(got["edges"][k]["n_total"], e[0], "CCAPO-STDB-1", f"N_total{k}")


@pytest.mark.clause("CCAPO-STDB-1")
def test_failed_trajectory_still_counts(ccapo):
    tr = {"anchors": [("hall", "<START>"), ("hall", "GOTO(hall)")], "fingerprints": ["GOTO(hall)", "GOTO(hall)"],
          "success": False}
    got = ccapo.stdb_update(copy.deepcopy(EMPTY), tr)
    assert_equal(got["n_total_global"], 1, "CCAPO-STDB-1")
    assert_equal(got["edges"][("hall", "<START>", "GOTO(hall)")]["n_total"], 1, "CCAPO-STDB-1", "failure adds N_total")
    twice = {"anchors": [("hall", "<START>")] * 2, "fingerprints": ["OPEN(chest)"] * 2, "success": False}
    got2 = ccapo.stdb_update(got, twice)
    assert_equal(got2["edges"][("hall", "<START>", "OPEN(chest)")]["n_total"], 1, "CCAPO-STDB-1",
                 "an edge counts once per trajectory")


# A trajectory that ended before its first action is still a finished trajectory: it passes no edge, and it counts
# in N_total_global (and, successful, in N_succ_total), which every criticality C(E) divides by.
@pytest.mark.clause("CCAPO-STDB-1")
def test_a_trajectory_without_steps_still_counts(ccapo):
    tr = {"anchors": [("hall", "<START>")], "fingerprints": ["GOTO(hall)"], "success": True}
    stats = ccapo.stdb_update(copy.deepcopy(EMPTY), tr)
    got = ccapo.stdb_update(stats, {"anchors": [], "fingerprints": [], "success": False})
    assert_equal(got["n_total_global"], 2, "CCAPO-STDB-1", "N_total_global after a trajectory of no step")
    assert_equal(got["n_succ_total"], 1, "CCAPO-STDB-1", "N_succ_total after a failed trajectory of no step")
    assert_equal(sorted(got["edges"]), [("hall", "<START>", "GOTO(hall)")], "CCAPO-STDB-1", "edges stored")
    assert_equal(got["edges"][("hall", "<START>", "GOTO(hall)")]["n_total"], 1, "CCAPO-STDB-1", "N_total of the edge")


@pytest.mark.clause("CCAPO-STDB-2")
@given(st_.ccapo_streams())
def test_n_succ_counts_successes_only(ccapo, stream):
    got = _feed(ccapo, stream)
    edges, _, gs, _ = replay(stream)
    assert_equal(got["n_succ_total"], gs, "CCAPO-STDB-2", "N_succ_total = successful trajectories")
    for k, e in edges.items():
        assert_equal(got["edges"][k]["n_succ"], e[1], "CCAPO-STDB-2", f"N_succ{k}")


@pytest.mark.clause("CCAPO-STDB-2")
def test_failure_leaves_n_succ(ccapo):
    tr = {"anchors": [("hall", "<START>")], "fingerprints": ["OPEN(chest)"], "success": True}
    one = ccapo.stdb_update(copy.deepcopy(EMPTY), tr)
    two = ccapo.stdb_update(one, {**tr, "success": False})
    e = two["edges"][("hall", "<START>", "OPEN(chest)")]
    assert_equal([e["n_succ"], e["n_total"], two["n_succ_total"]], [1, 2, 1], "CCAPO-STDB-2")


@st.composite
def stdb_hyper_parameters(draw):
    """The document's values, or every keyword drawn: a fold that scores with its defaults whatever it is
    passed gives other V-bars."""
    if draw(st.booleans()):
        return dict(DEFAULT_HP)
    return dict(v_rate=draw(st.floats(0.05, 1.0)), alpha_smooth=draw(st.floats(0.1, 5.0)),
                distance_exponent=draw(st.floats(0.0, 2.0)), lam=draw(st.floats(0.0, 3.0)),
                eps=draw(st.floats(1e-8, 0.5)))


@pytest.mark.clause("CCAPO-STDB-3")
@given(st_.ccapo_streams(), stdb_hyper_parameters())
def test_v_bar_is_moving_average_of_successes(ccapo, stream, hp):
    got = _feed(ccapo, stream, **hp)
    q_hp = {k: v for k, v in hp.items() if k != "v_rate"}
    _, anchors, _, _ = replay(stream, eta=hp["v_rate"], **q_hp)
    assert_equal(sorted(got["anchors"]), sorted(anchors), "CCAPO-STDB-3", "anchors with a V-bar")
    for u, v in anchors.items():
        assert_close(got["anchors"][u]["v_bar"], v, "CCAPO-STDB-3", what=f"V-bar{u} under {hp}")


@pytest.mark.clause("CCAPO-STDB-3")
def test_v_bar_golden(ccapo):
    # success k->GOTO(hall), hall->TAKE(key): I = 2/3, C = 1 (up to eps), d = 1 and 0
    tr = {"anchors": [("kitchen", "<START>"), ("hall", "GOTO(hall)")], "fingerprints": ["GOTO(hall)", "TAKE(key)"],
          "success": True}
    one = ccapo.stdb_update(copy.deepcopy(EMPTY), tr)
    c1 = (1 / (1 + EPS)) / (1 / (1 + EPS) + EPS)
    x0, x1 = (2 / 3) * (1 + c1) / math.sqrt(2), (2 / 3) * (1 + c1)
    q0, q1 = x0 / (1 + x0), x1 / (1 + x1)
    assert_close(one["anchors"][("kitchen", "<START>")]["v_bar"], q0, "CCAPO-STDB-3", what="first V-bar = Q")
    assert_close(one["anchors"][("hall", "GOTO(hall)")]["v_bar"], q1, "CCAPO-STDB-3", what="first V-bar = Q (4/7)")
    failed = ccapo.stdb_update(one, {**tr, "success": False})
    assert_equal(failed["anchors"], one["anchors"], "CCAPO-STDB-3", "a failure leaves V-bar unchanged")
    # second success: counts (2 succ of 3), global 2 of 3 -> C = 1; V-bar = 0.9 V + 0.1 Q
    two = ccapo.stdb_update(failed, tr)
    c2 = (2 / (3 + EPS)) / (2 / (3 + EPS) + EPS)
    x1b = (3 / 5) * (1 + c2)
    assert_close(two["anchors"][("hall", "GOTO(hall)")]["v_bar"], 0.9 * q1 + 0.1 * x1b / (1 + x1b), "CCAPO-STDB-3")


@pytest.mark.clause("CCAPO-STDB-4")
@given(st_.ccapo_streams())
def test_d_goal_from_successes(ccapo, stream):
    got = _feed(ccapo, stream)
    edges, _, _, _ = replay(stream)
    for k, e in edges.items():
        assert_equal(got["edges"][k]["d_sum"], e[2], "CCAPO-STDB-4", f"d_sum{k}")


@pytest.mark.clause("CCAPO-STDB-4")
def test_d_goal_golden(ccapo):
    # actions A B A C at one anchor (success, T = 4): A's last visit is t = 2 -> d = 1; B -> 2; C -> 0
    tr = {"anchors": [("r", "x")] * 4, "fingerprints": ["A", "B", "A", "C"], "success": True}
    got = ccapo.stdb_update(copy.deepcopy(EMPTY), tr)
    assert_equal({k[2]: v["d_sum"] for k, v in got["edges"].items()}, {"A": 1.0, "B": 2.0, "C": 0.0}, "CCAPO-STDB-4")


@pytest.mark.clause("CCAPO-STDB-1", "CCAPO-STDB-2", "CCAPO-STDB-3")
def test_update_does_not_modify_its_input(ccapo):
    tr = {"anchors": [("hall", "<START>")], "fingerprints": ["OPEN(chest)"], "success": True}
    one = ccapo.stdb_update(copy.deepcopy(EMPTY), tr)
    before = copy.deepcopy(one)
    ccapo.stdb_update(one, tr)
    assert_that(one == before, "CCAPO-STDB-1", one, "the input state unchanged (stdb_update returns a new one)")


@pytest.mark.clause("CCAPO-INPUT-3")
def test_anchor_fingerprint_length_mismatch_rejected(ccapo):
    tr = {"anchors": [("hall", "<START>")], "fingerprints": ["OPEN(chest)", "TAKE(key)"], "success": True}
    assert_rejects("CCAPO-INPUT-3", ccapo.raw("stdb_update"), copy.deepcopy(EMPTY), tr)
    assert_rejects("CCAPO-INPUT-3", ccapo.raw("score_steps"), copy.deepcopy(EMPTY), tr["anchors"], tr["fingerprints"])


@pytest.mark.clause("CCAPO-INPUT-5")
@pytest.mark.parametrize("v_rate", [0.0, 1.5, -0.1])
def test_bad_moving_average_rate_rejected(ccapo, v_rate):
    tr = {"anchors": [("hall", "<START>")], "fingerprints": ["OPEN(chest)"], "success": True}
    assert_rejects("CCAPO-INPUT-5", ccapo.raw("stdb_update"), copy.deepcopy(EMPTY), tr, v_rate=v_rate)
