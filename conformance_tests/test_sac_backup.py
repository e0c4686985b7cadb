"""SAC §6: exact soft value, Top-p selection / renormalisation / soft value, and the TD target."""
from __future__ import annotations

import math

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
)
from conformance_tests.oracles import np_, top_p_bounds

F64 = torch.float64


def _np_soft_value(p, q1, q2, support, alpha):
    """Σ_{support} π (min q − α log π), computed entry by entry in numpy."""
    out = []
    for b in range(p.shape[0]):
        out.append(sum(p[b, a] * (min(q1[b, a], q2[b, a]) - alpha * math.log(p[b, a]))
                       for a in range(p.shape[1]) if support[b, a]))
    return np.array(out)


def _rounding_band(pn, dtype=torch.float64):
    """SAC-TOPP-1's |A| units of rounding: how far a prefix mass summed in ``dtype`` (the probabilities'
    dtype, which an implementation may sum in) may sit from its exact value, for masses up to 2."""
    return pn.shape[-1] * 2.0 * torch.finfo(dtype).eps


def _exact_sum_band(probs, pn):
    """The band of rows built so that float64 sums are exact (dyadic, or float32 values >= 2^-27): none
    for float64 rows, which an implementation sums in float64; float32 rows may be summed in float32."""
    return 0.0 if probs.dtype == torch.float64 else _rounding_band(pn, probs.dtype)


def _check_top_p_set(sel, pn, mn, p, band=0.0):
    """SAC-TOPP-1 against the brute force: each row's set is a prefix of its ranked legal actions
    (legal, most probable, ties by lower id) whose length the rule allows (exact hit of p: kept;
    next: dropped; p = 1: every legal action); detached."""
    assert_that(not getattr(sel, "requires_grad", False), "SAC-TOPP-1", sel, "a detached selection")
    sn = np_(sel).astype(bool)
    assert_that(not (sn & ~mn).any(), "SAC-TOPP-1", sel, "a subset of the legal set")
    for b in range(pn.shape[0]):
        ranked, lo, hi = top_p_bounds(pn[b], mn[b], p, band)
        k = int(sn[b].sum())
        assert_that(lo <= k <= hi and bool(sn[b, ranked[:k]].all()), "SAC-TOPP-1",
                    f"row {b}: {k} actions, ids {np.flatnonzero(sn[b])[:12].tolist()}...",
                    f"the first {lo}..{hi} legal actions by decreasing pi, ties by lower id (p={p!r})")


def _np_top_p_row(p_row, q1, q2, ids, alpha):
    """SAC-TOPP-3 on one row's set ``ids``: the value, its gradients in π and in the twin minimum, the set's mass."""
    z = p_row[ids].sum()
    pp, qm = p_row[ids] / z, np.minimum(q1[ids], q2[ids])
    value = float(np.sum(pp * (qm - alpha * np.log(pp))))
    d_pi, d_q = np.zeros_like(p_row), np.zeros_like(p_row)
    d_pi[ids], d_q[ids] = (qm - alpha * np.log(pp) - value) / z, pp
    return value, d_pi, d_q, z


def _np_top_p_value(pn, q1, q2, mn, alpha, p, band=0.0, got=None, got_d_pi=None):
    """SAC-TOPP-3 oracle per row: brute-force set, renormalise, Σ π_p (min q − α log π_p); also the
    gradients dV/dπ = (q − α log π_p − V)/Z and dV/dq_min = π_p on the set (0 elsewhere), and the set's mass Z.
    Where ``band``
    lets a row's set take several sizes (sums that are not exact), the size nearest the implementation's
    values ``got`` and, when given, its gradient in π ``got_d_pi`` is the one compared (an action of
    near-zero mass moves the value by nothing, and its gradient by a lot)."""
    value, d_pi, d_q, mass = np.zeros(pn.shape[0]), np.zeros_like(pn), np.zeros_like(pn), np.ones(pn.shape[0])

    def distance(o, b):  # a gradient that overflowed a half-precision dtype (inf, NaN) tells no set apart
        d = np.abs(o[1] - got_d_pi[b]) if got_d_pi is not None else np.zeros(1)
        return abs(o[0] - got[b]) + float(d[np.isfinite(d)].max(initial=0.0))

    for b in range(pn.shape[0]):
        ranked, lo, hi = top_p_bounds(pn[b], mn[b], p, band)
        options = [_np_top_p_row(pn[b], q1[b], q2[b], ranked[:k], alpha) for k in range(max(lo, 1), max(hi, 1) + 1)]
        best = min(options, key=lambda o: distance(o, b)) if got is not None else options[0]
        value[b], d_pi[b], d_q[b], mass[b] = best
    return value, d_pi, d_q, mass


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
    _check_top_p_set(sac.top_p_select(probs, mask, p=p), pn, mn, p, band=_rounding_band(pn, probs.dtype))


@pytest.mark.clause("SAC-TOPP-1")
@given(st.one_of(st_.top_p_cases(), st_.top_p_cases(float32_rows=True)))
def test_top_p_boundaries_exact_hits_ties_and_degenerate_rows(sac, case):
    """Rows with exact float64 sums (dyadic, or float32 softmax rows) and p on a cumulative mass,
    just off it, 1, or anywhere; flat, peaked, tied (> 256 ties on wide rows), one-legal and short
    rows, mixed in one batch, up to 6144 actions."""
    probs, mask, p = case
    pn = np_(probs).astype(np.float64)
    _check_top_p_set(sac.top_p_select(probs, mask, p=p), pn, np_(mask), p, band=_exact_sum_band(probs, pn))


def _vocabulary_rows(g: np.random.Generator, B: int, A: int = 600):
    """B peaked rows over an A-character vocabulary (Zipf-like, as a trained policy), ε-clipped, with a
    random 5% of the actions illegal (never action 0)."""
    z = -3.0 * np.log(g.permuted(np.tile(np.arange(1, A + 1), (B, 1)), axis=1)) + 0.3 * g.standard_normal((B, A))
    mask = g.random((B, A)) > 0.05
    mask[:, 0] = True
    zz = np.where(mask, z, -np.inf)
    pn = np.exp(zz - zz.max(-1, keepdims=True))
    pn = np.maximum(pn / pn.sum(-1, keepdims=True), 1e-8)
    return torch.tensor(pn), torch.tensor(mask)


@st.composite
def vocabulary_policies(draw):
    """Peaked rows over a 600-character vocabulary (Zipf-like, as a trained policy)."""
    return _vocabulary_rows(np.random.default_rng(draw(st.integers(0, 2**31 - 1))), draw(st.integers(1, 4)))


@pytest.mark.clause("SAC-TOPP-1")
@given(vocabulary_policies(), st.sampled_from([0.9, 0.95, 0.98, 0.99]))
def test_top_p_over_a_large_vocabulary(sac, pm, p):
    probs, mask = pm
    pn, mn = np_(probs), np_(mask)
    _check_top_p_set(sac.top_p_select(probs, mask, p=p), pn, mn, p, band=_rounding_band(pn, probs.dtype))


# Rows are independent: a row's Top-p set and soft value cannot depend on the rows beside it or on how many
# there are. An implementation may cut a large batch into row chunks (the reference does, past a few MB, to
# stay in cache; a GPU kernel has its own tiling): 2,400 copies of six template rows, shuffled, cross such a
# cut, and each must get its template's result computed alone.
def _template_rows():
    """Six template rows (probabilities, mask, twin Q) and 2,400 shuffled picks among them."""
    g = np.random.default_rng(98)
    probs, mask = _vocabulary_rows(g, 6)
    q1, q2 = (torch.tensor(g.normal(0.0, 3.0, probs.shape)) for _ in range(2))
    return probs, mask, q1, q2, torch.tensor(g.integers(0, 6, 2400))


@pytest.mark.clause("SAC-TOPP-1")
def test_top_p_rows_do_not_depend_on_the_batch_around_them(sac):
    probs, mask, _, _, which = _template_rows()
    alone = np_(sac.top_p_select(probs, mask, p=0.98)).astype(bool)
    _check_top_p_set(alone, np_(probs), np_(mask), 0.98, band=_rounding_band(np_(probs), probs.dtype))
    in_batch = np_(sac.top_p_select(probs[which], mask[which], p=0.98)).astype(bool)
    assert_equal(in_batch, alone[np_(which)], "SAC-TOPP-1",
                 "each of 2,400 rows selects what its template selects alone")


@pytest.mark.clause("SAC-TOPP-3")
def test_top_p_soft_values_do_not_depend_on_the_batch_around_them(sac):
    probs, mask, q1, q2, which = _template_rows()
    alone = sac.top_p_soft_value(probs, q1, q2, mask, alpha=0.3, p=0.98)
    in_batch = sac.top_p_soft_value(probs[which], q1[which], q2[which], mask[which], alpha=0.3, p=0.98)
    assert_close(in_batch, np_(alone)[np_(which)], "SAC-TOPP-3", what="each row's soft value as its template's alone")


@pytest.mark.clause("SAC-TOPP-1")
def test_top_p_golden_and_detached(sac):
    probs = torch.tensor([[0.1, 0.6, 0.05, 0.25]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, True, True]])
    sel = sac.top_p_select(probs, mask, p=0.8)
    # 0.6 + 0.25 = 0.85 >= 0.8 with two actions; 0.6 alone is short
    assert_equal(sel, [[False, True, False, True]], "SAC-TOPP-1")
    assert_that(not sel.requires_grad, "SAC-TOPP-1", "selection requires grad", "a detached selection")


@pytest.mark.clause("SAC-TOPP-1")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p, expected", [
    (0.75, [True, True, False, False]),   # 0.5 + 0.25 hits 0.75 exactly: kept; the next is not
    (0.5, [True, False, False, False]),   # the first action alone hits p exactly
    (0.875, [True, True, True, False]),   # the tie (0.125, 0.125) at the boundary: lower id first
    (1.0, [True, True, True, True]),
])
def test_top_p_exact_hit_and_tie_golden(sac, dtype, p, expected):
    probs = torch.tensor([[0.5, 0.25, 0.125, 0.125]], dtype=dtype)
    assert_equal(sac.top_p_select(probs, torch.ones(1, 4, dtype=torch.bool), p=p), [expected], "SAC-TOPP-1")


def _ties_beyond_256():
    """1/8 at id 7, 399 tied actions of 1/512 at ids 300..698, ε elsewhere (1000 actions)."""
    probs = torch.full((1, 1000), 1e-8, dtype=torch.float64)
    tied = torch.arange(300, 699)
    probs[0, tied] = 1 / 512
    probs[0, 7] = 1 / 8
    return probs, tied


@pytest.mark.clause("SAC-TOPP-1")
def test_top_p_ties_by_lower_id_beyond_256_candidates(sac):
    # 399 equal actions of 1/512 behind one of 1/8 (+ tail): p = 0.5 needs 192 of the tied ones,
    # and the rule takes the 192 lowest ids among them
    probs, tied = _ties_beyond_256()
    sel = sac.top_p_select(probs, torch.ones(1, 1000, dtype=torch.bool), p=0.5)
    expected = torch.zeros(1, 1000, dtype=torch.bool)
    expected[0, 7] = True
    expected[0, tied[:192]] = True  # 1/8 + 192/512 = 0.5 exactly
    assert_equal(sel, expected, "SAC-TOPP-1")


@pytest.mark.clause("SAC-TOPP-1")
def test_top_p_ignores_illegal_mass(sac):
    # the illegal action holds most raw probability: selecting before masking would pick it
    probs = torch.tensor([[0.7, 0.2, 0.1]], dtype=torch.float64)
    mask = torch.tensor([[False, True, True]])
    sel = sac.top_p_select(probs, mask, p=0.15)
    assert_equal(sel, [[False, True, False]], "SAC-TOPP-1")


@pytest.mark.clause("SAC-TOPP-1")
def test_top_p_one_legal_action_and_p_one_on_clipped_rows(sac):
    mask = torch.tensor([[False, True, False], [True, True, True]])
    # row 2: the clip lifts the last action to ε, so 0.5 + 0.5 reaches 1 before it; p = 1 keeps it
    probs = torch.tensor([[1e-8, 1.0, 1e-8], [0.5, 0.5, 1e-8]], dtype=torch.float64)
    assert_equal(sac.top_p_select(probs, mask, p=1.0), mask, "SAC-TOPP-1")
    assert_equal(sac.top_p_select(probs, mask, p=0.01), [[False, True, False], [True, False, False]], "SAC-TOPP-1")


# Boundaries a float64 row decides by less than float32 can see. Every mass is dyadic, so the float64 prefix sums
# are exact and the band is 0: one set only. p = 1 − 5e−7 is not p = 1 (a "close enough to 1" shortcut keeps the
# whole legal set); δ = 2^−41 (4.5e−13) vanishes in float32 sums (spacing 6e−8 at 0.75).
_D = 2.0 ** -41


@pytest.mark.clause("SAC-TOPP-1")
@pytest.mark.parametrize("row, p", [
    ([1 - 2.0**-20, 2.0**-21, 2.0**-21], 0.9999995),  # mass before the third 1 − 2^−21 >= p: dropped
    ([2.0**-21, 1 - 2.0**-20 - 2.0**-30, 2.0**-21, 2.0**-30], 1 - 2.0**-21 - 2.0**-23),  # {1, 0}: tie to lower id
    ([0.5, 0.25 - _D, 0.25 - _D, 2 * _D], 0.75 - _D / 2),  # mass before the third 0.75 − δ < p: kept
    ([0.5, 0.25 + _D, 0.25 - _D], 0.75 + _D / 2),  # mass before the third 0.75 + δ >= p: dropped
], ids=["p-just-below-one", "p-just-below-one-tie", "delta-below-p", "delta-above-p"])
def test_top_p_float64_boundaries_finer_than_float32(sac, row, p):
    probs = torch.tensor([row], dtype=F64)
    mask = torch.ones_like(probs, dtype=torch.bool)
    pn = np_(probs)
    _check_top_p_set(sac.top_p_select(probs, mask, p=p), pn, np_(mask), p, band=_exact_sum_band(probs, pn))


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


def _value_scale(q1, q2, alpha, width):
    """The natural size of a soft value: tolerances are relative to it, not to a value near 0."""
    return float(np.maximum(np.abs(np_(q1)), np.abs(np_(q2))).max()) + alpha * math.log(width + 1) + 1.0


@pytest.mark.clause("SAC-TOPP-3")
@given(st.one_of(st_.top_p_backups(), st_.top_p_backups(float32_rows=True)))
def test_top_p_soft_value_and_gradient_match_the_loop(sac, case):
    """Value and gradient on the boundary rows of SAC-TOPP-1 (exact hits, ties, one legal action,
    flat / peaked / mixed batches up to 6144 actions, |Q| up to 1e4), float32 and float64."""
    probs, q1, q2, mask, alpha, p = case
    probs, q1, q2 = (t.clone().requires_grad_(True) for t in (probs, q1, q2))
    got = sac.top_p_soft_value(probs, q1, q2, mask, alpha=alpha, p=p)
    got.sum().backward()
    pn, q1n, q2n = (np_(t).astype(np.float64) for t in (probs, q1, q2))
    value, d_pi, d_q, mass = _np_top_p_value(pn, q1n, q2n, np_(mask), alpha, p, band=_exact_sum_band(probs, pn),
                                             got=np_(got.detach()).astype(np.float64),
                                             got_d_pi=np_(probs.grad).astype(np.float64))
    scale = _value_scale(q1, q2, alpha, pn.shape[-1])
    assert_close(got.detach(), value, "SAC-TOPP-3", scale=scale, what="value")
    # dV/dπ is (q − α log π_p − V)/Z on the set: its terms are of size scale/Z, and renormalising by a small
    # set mass Z in half precision leaves a residue of that size where the exact gradient cancels to 0
    assert_close(probs.grad, d_pi, "SAC-TOPP-3", approx="gradient", scale=scale / mass[:, None], what="dV/dpi")
    # min(q1, q2) may split a tie between the critics, but the two gradients add up to π_p
    assert_close(q1.grad + q2.grad, d_q, "SAC-TOPP-3", approx="gradient", what="dV/dq1 + dV/dq2")
    g1, g2 = np_(q1.grad), np_(q2.grad)
    assert_that(not ((g1 != 0) & (q1n > q2n)).any() and not ((g2 != 0) & (q2n > q1n)).any(),
                "SAC-TOPP-3", "gradient on the larger critic", "gradient only through the twin-Q minimum")


@pytest.mark.clause("SAC-TOPP-3")
@given(backups())
def test_top_p_soft_value_at_p_one_is_the_exact_value_of_the_legal_policy(sac, case):
    # ε-clipped legal entries push the legal mass past 1: p = 1 must still sum over every legal action
    probs, q1, q2, mask, alpha = case
    pn, mn = np_(probs), np_(mask)
    renorm = np.where(mn, pn, 0.0) / np.where(mn, pn, 0.0).sum(-1, keepdims=True)
    expected = _np_soft_value(np.where(mn, renorm, 1.0), np_(q1), np_(q2), mn, alpha)
    assert_close(sac.top_p_soft_value(probs, q1, q2, mask, alpha=alpha, p=1.0), expected, "SAC-TOPP-3")


@pytest.mark.clause("SAC-TOPP-3")
def test_top_p_soft_value_at_p_one_keeps_the_clipped_tail_golden(sac):
    # legal mass 1 + 1e-8: 0.5 + 0.5 reaches 1 before the clipped action, whose Q = 1e3 still counts
    probs = torch.tensor([[0.5, 0.5, 1e-8]], dtype=torch.float64)
    q = torch.tensor([[1.0, 2.0, 1e3]], dtype=torch.float64)
    z = 1.0 + 1e-8
    expected = sum(pi / z * (qa - 0.3 * math.log(pi / z)) for pi, qa in ((0.5, 1.0), (0.5, 2.0), (1e-8, 1e3)))
    got = sac.top_p_soft_value(probs, q, q, torch.ones(1, 3, dtype=torch.bool), alpha=0.3, p=1.0)
    assert_close(got, [expected], "SAC-TOPP-3")


@pytest.mark.clause("SAC-TOPP-3")
def test_top_p_soft_value_golden(sac):
    # p = 0.8 keeps {0.6, 0.25}; π_p = (12/17, 5/17); min Q = (1, 2); α = 0.5
    probs = torch.tensor([[0.1, 0.6, 0.05, 0.25]], dtype=torch.float64)
    q = torch.tensor([[9.0, 1.0, 9.0, 2.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    a, b = 12 / 17, 5 / 17
    expected = a * (1 - 0.5 * math.log(a)) + b * (2 - 0.5 * math.log(b))
    assert_close(sac.top_p_soft_value(probs, q, q + 1, mask, alpha=0.5, p=0.8), [expected], "SAC-TOPP-3")


@pytest.mark.clause("SAC-TOPP-3")
def test_top_p_soft_value_tie_golden_beyond_256_candidates(sac):
    # 1/8 at id 7 (Q = 0) and 399 tied actions of 1/512 whose Q rises with the id; p = 0.5 keeps id 7
    # and the 192 lowest tied ids (Z = 1/2): π_p = 1/4 and 1/256 each, V = Σ π_p q − α Σ π_p log π_p
    probs, tied = _ties_beyond_256()
    q = torch.zeros(1, 1000, dtype=torch.float64)
    q[0, tied] = (tied - 300).double() / 100
    alpha = 0.1
    mean_q = sum(j / 100 for j in range(192)) / 256
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(1 / 256))
    got = sac.top_p_soft_value(probs, q, q + 1, torch.ones(1, 1000, dtype=torch.bool), alpha=alpha, p=0.5)
    assert_close(got, [mean_q + alpha * entropy], "SAC-TOPP-3")


@pytest.mark.clause("SAC-TOPP-3")
def test_top_p_soft_value_of_one_legal_action_is_its_q_minimum(sac):
    probs = torch.tensor([[1e-8, 1.0, 1e-8]], dtype=torch.float32)
    q1 = torch.tensor([[5.0, -1234.5, 7.0]])
    mask = torch.tensor([[False, True, False]])
    for p in (0.3, 1.0):
        assert_close(sac.top_p_soft_value(probs, q1, q1 + 3, mask, alpha=0.7, p=p), [-1234.5], "SAC-TOPP-3")


# Only legal mass counts toward p (SAC-TOPP-1), in the value as in the selection: an illegal action holding real
# probability would otherwise take the set's place (row 0: 0.35 at id 1) or end it early (row 1: 0.6 at id 0).
# p = 0.2: row 0 keeps {2} (0.3), row 1 keeps {1} (0.25); each value is that action's twin-Q minimum.
ILLEGAL_MASS_PROBS = [[0.2, 0.35, 0.3, 0.15], [0.6, 0.25, 0.1, 0.05]]
ILLEGAL_MASS_LEGAL = [[True, False, True, True], [False, True, True, True]]
ILLEGAL_MASS_Q = [[1.0, 50.0, 2.0, 3.0], [40.0, -1.5, 4.0, 5.0]]


@pytest.mark.clause("SAC-TOPP-3")
def test_top_p_soft_value_ignores_illegal_mass(sac):
    probs, q = torch.tensor(ILLEGAL_MASS_PROBS, dtype=F64), torch.tensor(ILLEGAL_MASS_Q, dtype=F64)
    got = sac.top_p_soft_value(probs, q, q + 0.5, torch.tensor(ILLEGAL_MASS_LEGAL), alpha=0.4, p=0.2)
    assert_close(got, [2.0, -1.5], "SAC-TOPP-3", what="one-action sets {2} and {1}: V = min Q there")


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
    if gamma == 1.0 and convention("gamma_one") == "accept":  # γ = 1 legitimate: undiscounted, terminal cut
        r, v, done = torch.tensor([1.0, 1.0], dtype=torch.float64), torch.tensor([5.0, 5.0], dtype=torch.float64), x.clone()
        done[1] = 1.0
        assert_close(sac.td_target(r, done, v, gamma=gamma), [6.0, 1.0], "SAC-INPUT-4", what="gamma = 1 accepted")
        return
    if gamma == 0.0 and convention("gamma_zero") == "accept":  # γ = 0 legitimate: the reward alone
        r, v, done = torch.tensor([1.0, -2.0], dtype=torch.float64), torch.tensor([5.0, 5.0], dtype=torch.float64), x.clone()
        done[1] = 1.0
        assert_close(sac.td_target(r, done, v, gamma=gamma), [1.0, -2.0], "SAC-INPUT-4", what="gamma = 0 accepted")
        return
    assert_rejects("SAC-INPUT-4", sac.raw("td_target"), x, x, x, gamma=gamma)


# The shaping discount is held to the same range: gamma = 1 and gamma in [1, 2) are rejected (SAC-INPUT-4).
@pytest.mark.clause("SAC-INPUT-4")
@pytest.mark.parametrize("gamma", [1.0, 1.5])
def test_shaped_reward_rejects_gamma_of_one_or_more(sac, gamma):

    t = torch.tensor([0.5, -1.0], dtype=F64)
    assert_rejects("SAC-INPUT-4", sac.raw("shaped_reward"), t, t, t, torch.tensor([0.0, 1.0], dtype=F64), gamma=gamma)
