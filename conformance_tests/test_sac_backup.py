"""SAC §6: exact soft value, Top-p selection / renormalisation / soft value, and the TD target."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from conformance_tests import strategies as st_
from conformance_tests.harness import assert_close, assert_equal, assert_rejects, assert_that
from conformance_tests.oracles import np_


def _np_soft_value(p, q1, q2, support, alpha):
    """Σ_{support} π (min q − α log π), computed entry by entry in numpy."""
    out = []
    for b in range(p.shape[0]):
        out.append(sum(p[b, a] * (min(q1[b, a], q2[b, a]) - alpha * math.log(p[b, a]))
                       for a in range(p.shape[1]) if support[b, a]))
    return np.array(out)


def _np_top_p_sizes(p, mask, thr):
    """Brute force: the minimal number of legal actions whose mass reaches thr, per row."""
    sizes = []
    for b in range(p.shape[0]):
        legal = sorted((p[b, a] for a in range(p.shape[1]) if mask[b, a]), reverse=True)
        total, k = 0.0, 0
        while k < len(legal) and total < thr:
            total += legal[k]
            k += 1
        sizes.append(k)
    return sizes


def _assume_clear_of_thresholds(pn, mn, p):
    """Skip draws where a cumulative legal mass sits within rounding distance of p."""
    for b in range(pn.shape[0]):
        cums = np.cumsum(sorted(pn[b][mn[b]], reverse=True))
        assume(np.all(np.abs(cums - p) > 1e-9))


def _check_top_p_set(sel, pn, mn, p):
    """SAC-TOPP-1 against the brute-force oracle: legal, non-empty, mass >= p, minimal, most probable."""
    sn = np_(sel).astype(bool)
    assert_that(not (sn & ~mn).any(), "SAC-TOPP-1", sel, "a subset of the legal set")
    assert_that(sn.any(-1).all(), "SAC-TOPP-1", sel, "a non-empty set in every row")
    mass = np.where(sn, pn, 0).sum(-1)
    legal_mass = np.where(mn, pn, 0).sum(-1)
    assert_that(np.all((mass >= p) | np.isclose(mass, legal_mass)), "SAC-TOPP-1", mass.tolist(), f"mass >= p={p}")
    assert_equal(sn.sum(-1), np.array(_np_top_p_sizes(pn, mn, p)), "SAC-TOPP-1", "set size (minimal)")
    for b in range(pn.shape[0]):
        if sn[b].any() and (mn[b] & ~sn[b]).any():
            assert_that(pn[b][sn[b]].min() >= pn[b][mn[b] & ~sn[b]].max(), "SAC-TOPP-1", sel,
                        "the most probable legal actions")


@st.composite
def backups(draw, **kw):
    p, mask = draw(st_.policies(**kw))
    q1 = draw(st_.q_values(tuple(p.shape)))
    q2 = draw(st_.q_values(tuple(p.shape)))
    alpha = draw(st.floats(1e-4, 2.0))
    return p, q1, q2, mask, alpha


# ----------------------------------------------------------------------------- exact soft value
@pytest.mark.clause("SAC-V-1")
@given(backups())
def test_soft_value_matches_loop(sac, case):
    p, q1, q2, mask, alpha = case
    got = sac.soft_value(p, q1, q2, mask, alpha=alpha)
    assert_close(got, _np_soft_value(*(np_(t) for t in (p, q1, q2, mask)), alpha), "SAC-V-1")


@pytest.mark.clause("SAC-V-1")
def test_soft_value_golden(sac):
    # π = (0.5, 0.5, ε), illegal third action; min Q = (1, 2); α = 0.1: V = 1.5 + 0.1·log 2
    p = torch.tensor([[0.5, 0.5, 1e-8]], dtype=torch.float64)
    q1 = torch.tensor([[1.0, 3.0, 100.0]], dtype=torch.float64)
    q2 = torch.tensor([[2.0, 2.0, 100.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    assert_close(sac.soft_value(p, q1, q2, mask, alpha=0.1), [1.5 + 0.1 * math.log(2)], "SAC-V-1")


# ----------------------------------------------------------------------------- Top-p selection
@pytest.mark.clause("SAC-TOPP-1")
@given(st_.policies(min_legal=1, max_actions=10), st.floats(0.05, 1.0))
def test_top_p_is_the_smallest_legal_set_reaching_p(sac, pm, p):
    probs, mask = pm
    pn, mn = np_(probs), np_(mask)
    _assume_clear_of_thresholds(pn, mn, p)
    _check_top_p_set(sac.top_p_select(probs, mask, p=p), pn, mn, p)


@st.composite
def vocabulary_policies(draw):
    """Peaked rows over a 600-character vocabulary (Zipf-like, as a trained policy): the regime in
    which an implementation may sort only the leading candidates."""
    B, A = draw(st.integers(1, 4)), 600
    seed = draw(st.integers(0, 2**31 - 1))
    g = np.random.default_rng(seed)
    z = -3.0 * np.log(g.permuted(np.tile(np.arange(1, A + 1), (B, 1)), axis=1)) + 0.3 * g.standard_normal((B, A))
    mask = g.random((B, A)) > 0.05
    mask[:, 0] = True
    zz = np.where(mask, z, -np.inf)
    pn = np.exp(zz - zz.max(-1, keepdims=True))
    pn = np.maximum(pn / pn.sum(-1, keepdims=True), 1e-8)
    return torch.tensor(pn), torch.tensor(mask)


@pytest.mark.clause("SAC-TOPP-1")
@given(vocabulary_policies(), st.sampled_from([0.9, 0.95, 0.98, 0.99]))
def test_top_p_over_a_large_vocabulary(sac, pm, p):
    probs, mask = pm
    pn, mn = np_(probs), np_(mask)
    _assume_clear_of_thresholds(pn, mn, p)
    _check_top_p_set(sac.top_p_select(probs, mask, p=p), pn, mn, p)


@pytest.mark.clause("SAC-TOPP-1")
def test_top_p_golden_and_detached(sac):
    probs = torch.tensor([[0.1, 0.6, 0.05, 0.25]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, True, True]])
    sel = sac.top_p_select(probs, mask, p=0.8)
    # 0.6 + 0.25 = 0.85 >= 0.8 with two actions; 0.6 alone is short
    assert_equal(sel, [[False, True, False, True]], "SAC-TOPP-1")
    assert_that(not sel.requires_grad, "SAC-TOPP-1", "selection requires grad", "a detached selection")


@pytest.mark.clause("SAC-TOPP-1")
def test_top_p_ignores_illegal_mass(sac):
    # the illegal action holds most raw probability: selecting before masking would pick it
    probs = torch.tensor([[0.7, 0.2, 0.1]], dtype=torch.float64)
    mask = torch.tensor([[False, True, True]])
    sel = sac.top_p_select(probs, mask, p=0.15)
    assert_equal(sel, [[False, True, False]], "SAC-TOPP-1")


@pytest.mark.clause("SAC-INPUT-3")
@pytest.mark.parametrize("p", [0.0, -0.1, 1.01, float("nan")])
def test_top_p_rejects_p_outside_unit_interval(sac, p):
    probs = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    assert_rejects("SAC-INPUT-3", sac.raw("top_p_select"), probs, torch.ones(1, 2, dtype=torch.bool), p=p)


# ----------------------------------------------------------------------------- π_p and \hat V
@pytest.mark.clause("SAC-TOPP-2")
@given(st_.policies(), st.data())
def test_top_p_probs_renormalise_over_the_selection(sac, pm, data):
    probs, mask = pm
    sel = data.draw(st_.legal_masks(tuple(probs.shape)))
    got = sac.top_p_probs(probs, sel)
    pn, sn = np_(probs), np_(sel).astype(bool)
    expected = np.where(sn, pn, 0.0) / np.where(sn, pn, 0.0).sum(-1, keepdims=True)
    assert_close(got, expected, "SAC-TOPP-2")


@pytest.mark.clause("SAC-TOPP-2")
def test_top_p_probs_golden(sac):
    probs = torch.tensor([[0.6, 0.25, 0.1, 0.05]], dtype=torch.float64)
    sel = torch.tensor([[True, True, False, False]])
    assert_close(sac.top_p_probs(probs, sel), [[0.6 / 0.85, 0.25 / 0.85, 0.0, 0.0]], "SAC-TOPP-2")


@pytest.mark.clause("SAC-TOPP-3")
@given(backups(max_actions=8), st.floats(0.3, 0.99))
def test_top_p_soft_value_matches_loop(sac, case, p):
    probs, q1, q2, mask, alpha = case
    pn, mn = np_(probs), np_(mask)
    _assume_clear_of_thresholds(pn, mn, p)
    got = sac.top_p_soft_value(probs, q1, q2, mask, alpha=alpha, p=p)
    # oracle: brute-force selection, renormalise, then the soft sum with log π_p
    sizes = _np_top_p_sizes(pn, mn, p)
    expected = []
    for b in range(pn.shape[0]):
        order = sorted((a for a in range(pn.shape[1]) if mn[b, a]), key=lambda a: -pn[b, a])[: sizes[b]]
        z = sum(pn[b, a] for a in order)
        expected.append(sum(pn[b, a] / z * (min(np_(q1)[b, a], np_(q2)[b, a]) - alpha * math.log(pn[b, a] / z))
                            for a in order))
    assert_close(got, np.array(expected), "SAC-TOPP-3")


@pytest.mark.clause("SAC-TOPP-3")
@given(backups())
def test_top_p_soft_value_at_p_one_is_the_exact_value_of_the_legal_policy(sac, case):
    probs, q1, q2, mask, alpha = case
    pn, mn = np_(probs), np_(mask)
    # a legal probability clipped up to ε can push the mass past 1 before the last action; keep clear of that
    assume(np.all(np.where(mn, pn, 1.0) > 1e-6))
    renorm = np.where(mn, pn, 0.0) / np.where(mn, pn, 0.0).sum(-1, keepdims=True)
    expected = _np_soft_value(np.where(mn, renorm, 1.0), np_(q1), np_(q2), mn, alpha)
    assert_close(sac.top_p_soft_value(probs, q1, q2, mask, alpha=alpha, p=1.0), expected, "SAC-TOPP-3")


@pytest.mark.clause("SAC-TOPP-3")
def test_top_p_soft_value_golden(sac):
    # p = 0.8 keeps {0.6, 0.25}; π_p = (12/17, 5/17); min Q = (1, 2); α = 0.5
    probs = torch.tensor([[0.1, 0.6, 0.05, 0.25]], dtype=torch.float64)
    q = torch.tensor([[9.0, 1.0, 9.0, 2.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    a, b = 12 / 17, 5 / 17
    expected = a * (1 - 0.5 * math.log(a)) + b * (2 - 0.5 * math.log(b))
    assert_close(sac.top_p_soft_value(probs, q, q + 1, mask, alpha=0.5, p=0.8), [expected], "SAC-TOPP-3")


# ----------------------------------------------------------------------------- TD target
@pytest.mark.clause("SAC-TD-1")
@given(st.integers(1, 16).flatmap(lambda n: st.tuples(
    st_.tensors((n,)), st_.tensors((n,)), st.lists(st.booleans(), min_size=n, max_size=n))),
    st_.open_unit_interval())
def test_td_target_truncates_at_terminal_steps(sac, case, gamma):
    r, v, done = case
    d = torch.tensor(done)
    got = sac.td_target(r, d, v, gamma=gamma)
    expected = np_(r) + gamma * (1.0 - np.array(done, dtype=float)) * np_(v)
    assert_close(got, expected, "SAC-TD-1")
    # a terminal step's target is the reward alone, whatever the next value
    if any(done):
        got2 = sac.td_target(r, d, v + 1e3, gamma=gamma)
        assert_close(got2[d], np_(r)[np.array(done)], "SAC-TD-1", what="terminal targets ignore V(s')")


@pytest.mark.clause("SAC-TD-1")
def test_td_target_golden(sac):
    r = torch.tensor([1.0, 1.0], dtype=torch.float64)
    v = torch.tensor([10.0, 10.0], dtype=torch.float64)
    done = torch.tensor([0.0, 1.0], dtype=torch.float64)
    assert_close(sac.td_target(r, done, v, gamma=0.995), [1.0 + 9.95, 1.0], "SAC-TD-1")


@pytest.mark.clause("SAC-INPUT-4")
@pytest.mark.parametrize("gamma", [0.0, 1.0, 1.5, -0.5])
def test_td_target_rejects_gamma_outside_open_unit_interval(sac, gamma):
    x = torch.zeros(2, dtype=torch.float64)
    assert_rejects("SAC-INPUT-4", sac.raw("td_target"), x, x, x, gamma=gamma)
