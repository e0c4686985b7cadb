"""PPO §7 self-test and §11, on points the seed document leaves open: the share of log-prob jumps above 2,
ratio.std, and the "slowly decreasing" entropy trend."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_close,
    assert_equal,
    assert_that,
    generator,
    to_numpy,
    tolerance,
)
from conformance_tests.oracles import np_
from conformance_tests.test_ppo_update import HP, np_log_softmax, setup

F64 = torch.float64


# ----------------------------------------------------------------------------- PPO-SELFTEST-1
@pytest.mark.clause("PPO-SELFTEST-1")
@given(st_.log_prob_pairs(spread=6.0), st.floats(0.5, 4.0))
def test_jump_share_matches_numpy(ppo, pair, threshold):
    old, new = pair
    got = ppo.log_ratio_excess(new, old, threshold=threshold)
    assert_close(got, float(np.mean((np_(new) - np_(old)) > threshold)), "PPO-SELFTEST-1")
    assert_that(got.dtype == new.dtype, "PPO-SELFTEST-1", got.dtype, f"the log-probs' dtype {new.dtype}")


@pytest.mark.clause("PPO-SELFTEST-1")
def test_jump_share_golden_from_the_seed_symptom(ppo):
    # §0: the new distribution is uniform over 5 actions (log-prob -log 5 = -1.609) while the old one
    # was peaked. Old log-probs -4.0 and -3.7 give jumps 2.39 and 2.09 (> 2), -3.5 gives 1.89, a drop
    # (new below old) never counts, and a jump of exactly 2 is not "> 2".
    new = torch.full((5,), -math.log(5), dtype=torch.float64)
    old = torch.tensor([-4.0, -3.7, -3.5, -0.5, -math.log(5) - 2.0], dtype=torch.float64)
    assert_close(ppo.log_ratio_excess(new, old), 0.4, "PPO-SELFTEST-1", what="2 of 5 rows jump by more than 2")
    assert_equal(ppo.log_ratio_excess(new, new), 0.0, "PPO-SELFTEST-1", what="no jump at all")


@pytest.mark.clause("PPO-SELFTEST-1")
@given(st_.log_prob_pairs(spread=6.0))
def test_jump_share_is_the_ratio_above_e_squared(ppo, pair):
    """Differential: new − old > 2 is the same event as a ratio above e², counted through the ratio op."""
    old, new = pair
    r = ppo.ratio(new, old)
    log_r = np.log(np_(r))
    sure = np.abs(log_r - 2.0) > 1e-9  # rows decided the same way whatever the rounding of exp/log
    share = ppo.log_ratio_excess(new, old)
    want = np.mean(np.where(sure, log_r > 2.0, (np_(new) - np_(old)) > 2.0))
    assert_close(share, float(want), "PPO-SELFTEST-1")


@pytest.mark.clause("PPO-SELFTEST-1")
def test_log_ratio_excess_default_threshold_is_two_and_strict(ppo):
    """Rows with new - old of 1.5, exactly 2, 2.5 and 3.5 over the default threshold 2: two of four exceed it."""
    old = torch.tensor([-4.0, -4.0, -4.0, -4.0], dtype=F64)
    new = old + torch.tensor([1.5, 2.0, 2.5, 3.5], dtype=F64)
    assert_close(ppo.log_ratio_excess(new, old), 0.5, "PPO-SELFTEST-1", what="share of rows with new - old > 2")


# ----------------------------------------------------------------------------- PPO-RATIO-2
@pytest.mark.clause("PPO-RATIO-2")
@given(st_.ratios_and_advantages())
def test_ratio_std_is_the_bessel_corrected_std(ppo, case):
    r, _ = case
    want = float(np.std(np_(r), ddof=1)) if r.numel() > 1 else 0.0
    assert_close(ppo.ratio_std(r), want, "PPO-RATIO-2")


@pytest.mark.clause("PPO-RATIO-2")
def test_ratio_std_golden(ppo):
    r = torch.tensor([0.5, 1.0, 1.5, 1.0], dtype=torch.float64)  # deviations ±0.5, 0, 0 -> var 0.5/3
    assert_close(ppo.ratio_std(r), math.sqrt(0.5 / 3), "PPO-RATIO-2")
    assert_equal(float(ppo.ratio_std(torch.tensor([1.7], dtype=torch.float64))), 0.0, "PPO-RATIO-2",
                 what="a single row")


# Two rows have a Bessel-corrected std; only a single row gives 0.
@pytest.mark.clause("PPO-RATIO-2")
@pytest.mark.parametrize("rows", [[1.1], [0.9, 1.3], [0.8, 1.0, 1.5]])
def test_ratio_std_is_bessel_std_from_two_rows(ppo, rows):
    a = np.array(rows)
    want = a.std(ddof=1) if len(a) > 1 else 0.0
    assert_close(ppo.ratio_std(torch.tensor(a, dtype=F64)), want, "PPO-RATIO-2", what=f"ratio_std of {len(a)} row(s)")


@pytest.mark.clause("PPO-RATIO-2")
@given(st_.rollouts(), st.integers(2, 12))
@settings(max_examples=15, deadline=None)
def test_update_reports_ratio_std_of_each_replayed_minibatch(ppo, r, mb):
    actor, critic, opt, batch = setup(ppo, r)
    recs = ppo.ppo_update(actor, critic, opt, batch, epochs=2, minibatch_size=mb, max_grad_norm=1.0,
                          target_kl=None, generator=generator(0), **HP)
    assert_equal(recs[0]["ratio_std"], 0.0, "PPO-RATIO-2", what="first minibatch: every ratio is exactly 1")
    for rec, (states, table) in zip(recs, actor.forwards):  # one recorded forward per minibatch
        mask = to_numpy(batch["mask"])[states]
        lp = np_log_softmax(table[states], mask)
        new = lp[np.arange(len(states)), to_numpy(batch["action"])[states]]
        ratio = np.exp(new - to_numpy(batch["old_log_prob"])[states])
        want = float(np.std(ratio, ddof=1)) if len(states) > 1 else 0.0
        assert_close(rec["ratio_std"], want, "PPO-RATIO-2", what=f"epoch {rec['epoch']} minibatch {rec['minibatch']}")


# ----------------------------------------------------------------------------- PPO-SLO-6
def _np_trend(h: np.ndarray) -> tuple[float, float]:
    slope, intercept = np.polyfit(np.arange(len(h), dtype=np.float64), h, 1)
    return float(slope), float(intercept)


def _trend_margins(slope: float, intercept: float, n: int) -> dict[str, float]:
    """PPO-SLO-6's decisions as margins, positive where the decision holds: b < 0 and -b (U - 1) < a."""
    return {"decreasing": -slope, "slow": intercept + slope * (n - 1)}


def _assert_trend_decisions(got: dict, n: int, dtype: torch.dtype, oracle: tuple[float, float] | None = None) -> None:
    """The decisions follow the clause's strict rule. On the implementation's own line: always where that line
    sits exactly on an edge (b = 0, or -b (U - 1) = a: the decision is then "no"), and wherever it is clear of
    the edge by more than the rounding of the decision's own arithmetic. On the oracle's line: only where it is
    clear of the edge by more than the clause's tolerance, since the fitted numbers may land on either side
    of an edge within it (a constant series fits a slope of 0 exactly, or ±1e-16 by an SVD)."""
    own = _trend_margins(float(got["slope"]), float(got["intercept"]), n)
    scale = max(1.0, abs(float(got["intercept"])), abs(float(got["slope"])) * n)
    rounding = 8 * torch.finfo(dtype).eps * scale
    for key, m in own.items():
        if m == 0.0 or abs(m) > rounding:
            assert_equal(bool(got[key]), m > 0, "PPO-SLO-6", what=f"{key} on the returned line ({key} margin {m:.3g})")
    if oracle is not None:
        rtol, atol = tolerance("PPO-SLO-6", dtype)
        for key, m in _trend_margins(*oracle, n).items():
            if abs(m) > atol + rtol * scale:
                assert_equal(bool(got[key]), m > 0, "PPO-SLO-6", what=f"{key} (the fitted line's margin {m:.3g})")


@pytest.mark.clause("PPO-SLO-6")
@given(st.integers(2, 64).flatmap(lambda n: st_.tensors((n,), lo=0.0, hi=3.0)))
def test_entropy_trend_matches_a_least_squares_fit(ppo, h):
    got = ppo.entropy_trend(h)
    slope, intercept = _np_trend(np_(h))
    assert_close(got["slope"], slope, "PPO-SLO-6", what="slope")
    assert_close(got["intercept"], intercept, "PPO-SLO-6", what="intercept")
    _assert_trend_decisions(got, len(h), h.dtype, oracle=(slope, intercept))


@pytest.mark.clause("PPO-SLO-6")
def test_entropy_trend_golden(ppo):
    slow = ppo.entropy_trend(torch.tensor([1.6, 1.5, 1.4, 1.3], dtype=torch.float64))  # b = -0.1, a = 1.6
    assert_close(slow["slope"], -0.1, "PPO-SLO-6")
    assert_that(slow["decreasing"] and slow["slow"], "PPO-SLO-6", slow, "decreasing and slow (decline 0.3 < 1.6)")
    stuck = ppo.entropy_trend(torch.full((6,), math.log(5), dtype=torch.float64))  # §0: pinned at log 5
    assert_close(stuck["slope"], 0.0, "PPO-SLO-6", what="the slope of a constant entropy")
    # a constant fits b = 0 (not decreasing) or, by a solver's rounding, ±1e-16: the decision follows the sign
    # the implementation reports, and b = 0 exactly must read as not decreasing
    _assert_trend_decisions(stuck, 6, torch.float64)
    collapse = ppo.entropy_trend(torch.tensor([1.6, 0.8, 0.1, 0.0], dtype=torch.float64))  # b = -0.55, a = 1.525
    assert_that(collapse["decreasing"] and not collapse["slow"], "PPO-SLO-6", collapse,
                "a collapse (decline 1.65 >= start 1.525) is not slow")
    # over U updates the decline is -b (U - 1): the fitted line's fall from the first update to the last
    near = ppo.entropy_trend(torch.tensor([1.0, 0.75, 0.5], dtype=torch.float64))  # b = -0.25, a = 1
    assert_that(near["slow"], "PPO-SLO-6", near, "slow: the line falls 0.5 over the run, short of its start 1")
    # U - 1 steps of the line, not U: a fall of 0.5 (2 steps of 0.25) against a start of 0.6 is slow, while
    # 3 steps (0.75) would pass the start
    steps = ppo.entropy_trend(torch.tensor([0.6, 0.35, 0.1], dtype=torch.float64))  # b = -0.25, a = 0.6
    assert_that(steps["slow"], "PPO-SLO-6", steps, "slow: 3 updates span 2 steps of the line, a fall of 0.5 < 0.6")
    edge = ppo.entropy_trend(torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64))  # b = -0.5, a = 1: exact in binary
    assert_close(edge["slope"], -0.5, "PPO-SLO-6", what="the edge's slope")
    assert_close(edge["intercept"], 1.0, "PPO-SLO-6", what="the edge's intercept")
    assert_that(edge["decreasing"], "PPO-SLO-6", edge, "decreasing (b = -0.5)")
    # not slow: the line reaches zero entropy at the last update (-b (U - 1) = a, and slow needs <); a solver
    # may land a rounding either side of that edge, and the decision must then follow its own line
    _assert_trend_decisions(edge, 3, torch.float64)


@pytest.mark.clause("PPO-SLO-6")
@given(st.integers(2, 40), st.floats(-0.05, 0.05), st.floats(0.5, 2.0))
def test_entropy_trend_recovers_an_exact_line(ppo, n, b, a):
    """Differential: on an exact line the fit returns that line (closed form, no noise)."""
    h = torch.tensor(a + b * np.arange(n), dtype=torch.float64)
    got = ppo.entropy_trend(h)
    assert_close(got["slope"], b, "PPO-SLO-6", what="slope of an exact line")
    assert_close(got["intercept"], a, "PPO-SLO-6", what="intercept of an exact line")
