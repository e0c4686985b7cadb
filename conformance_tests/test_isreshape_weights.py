"""IS Reshape v4 §2-§4: clamped ratio, reward-modulated gamma, SAPO weight, reshaped weight w, the
closed-form objective f and the identity r f'(r) = w(r), low-precision stability.

Oracles are numpy/scipy closed forms; the golden tables are our own numpy values (the document's
tables of §2.2 and appendix B are wrong, see the errata of ISR-SAPO-1 and ISR-W-1).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from rlconform.spec import default_spec
from scipy.differentiate import derivative
from scipy.optimize import brentq
from scipy.special import expit

from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_close,
    assert_dtype,
    assert_low_precision,
    assert_rejects,
    assert_that,
    fail,
    fits,
    log_ratio_clamp,
    require_dtype,
    slack,
    to_numpy,
    tolerance,
    working_dtype,
)

F64 = torch.float64


# ----------------------------------------------------------------------------- numpy oracles
def np_sech2(x):
    with np.errstate(over="ignore"):
        return 1.0 / np.cosh(np.asarray(x, dtype=np.float64)) ** 2


def np_sapo(r, tau):
    r = np.asarray(r, dtype=np.float64)
    return r * np_sech2(tau * (r - 1.0) / 2.0)


def np_weight(r, gamma, tau):
    return (1.0 - gamma) + gamma * np_sapo(r, tau)


def np_f(r, gamma, tau):
    r = np.asarray(r, dtype=np.float64)
    return (1.0 - gamma) * np.log(r) + gamma * (2.0 / tau) * np.tanh(tau * (r - 1.0) / 2.0)


def np_gamma(adv, beta, gmin, gmax):
    return gmin + (gmax - gmin) * expit(beta * np.abs(np.asarray(adv, dtype=np.float64)))


def np_sapo_weight(r, tau):
    """w_SAPO(r) = r sech^2(tau (r - 1) / 2), numpy."""
    return r / np.cosh(tau * (r - 1.0) / 2.0) ** 2


def isr_defaults() -> dict:
    """Every ISR-DEFAULT-* value as the spec states it."""
    out = {}
    for cid in ("ISR-DEFAULT-1", "ISR-DEFAULT-2", "ISR-DEFAULT-3", "ISR-DEFAULT-4"):
        out.update(default_spec().clause(cid).value)
    return out


def np_peak(tau):
    """r* > 1 where d/dr [r sech^2(tau(r-1)/2)] = 0, i.e. r tau tanh(tau(r-1)/2) = 1 (scipy root)."""
    return brentq(lambda r: r * tau * math.tanh(tau * (r - 1.0) / 2.0) - 1.0, 1.0, 1.0 + 60.0 / tau)


def t64(x, like: torch.Tensor | None = None):
    """``x`` as a tensor in ``like``'s dtype (a companion of a drawn tensor), else in the working dtype (float64
    when declared): never a float64 argument next to float32 ones, which would hold the result to float64's
    tolerance. A value past the dtype's range is its largest finite one (1e6, "r -> inf", is 65504 in float16)."""
    dt = like.dtype if like is not None else working_dtype()
    return torch.tensor(fits(x, dt), dtype=dt)


R_TABLE = [0.2, 0.5, 1.0, 2.0, 5.0, 10.0]
# Ratios on both sides of r = 1, where tau matters: the operations called without tau use the spec's default.
R = np.array([0.05, 0.5, 1.0, 1.7, 6.0])
# w_SAPO(r) at tau = 1 (our numpy values; the document's §2.2 says 0.10, 0.39, 1.00, 0.79, 0.35, 0.002)
SAPO_TAU1 = [0.17112775721623558, 0.470007424403189, 1.0, 1.572895465931855, 0.35325412426582237,
             0.004935173990593957]
# w_0.5(r) at tau = 1 (appendix B says 0.55, 0.70, 1.00, 0.89, 0.67 for the first five)
W_HALF_TAU1 = [0.5855638786081178, 0.7350037122015944, 1.0, 1.2864477329659274, 0.6766270621329111,
               0.502467586995297]
# f_0.5(r) and f_1(r) at tau = 1
F_HALF_TAU1 = [-1.184667918472275, -0.5914922526836818, 0.0, 0.8086907475399824, 1.7687465362928672,
               2.1510457573450505]
F_ONE_TAU1 = [-0.7598979245104498, -0.48983732480741826, 0.0, 0.9242343145200195, 1.9280551601516338,
              1.999506421696055]


# ----------------------------------------------------------------------------- ISR-RATIO-1
@pytest.mark.clause("ISR-RATIO-1")
@given(st_.isr_token_batches(), st_.keyword_arguments("isreshape.importance_ratio"))
def test_ratio_is_exp_of_clamped_log_ratio(isreshape, batch, kw):
    lp, ref, _, _ = batch
    c = kw["log_ratio_clamp"]
    expected = np.exp(np.clip(to_numpy(lp) - to_numpy(ref), -c, c))
    assert_close(isreshape.importance_ratio(lp, ref, **kw), expected, "ISR-RATIO-1")


@pytest.mark.clause("ISR-RATIO-1")
def test_ratio_golden(isreshape):
    ref = torch.zeros(5, dtype=torch.float64)
    lp = torch.tensor([-30.0, -1.0, 0.0, 2.0, 25.0], dtype=torch.float64)
    c = log_ratio_clamp()  # the seed's 20: exp(-20), exp(-1), 1, exp(2), exp(20)
    expected = [math.exp(max(min(x, c), -c)) for x in (-30.0, -1.0, 0.0, 2.0, 25.0)]
    assert_close(isreshape.importance_ratio(lp, ref), expected, "ISR-RATIO-1")


# Half-precision inputs give the ratio of their exact log-ratio, formed in the float32 working dtype:
# log pi - log mu = 4 + 2^-8 - (-4) is exact in float32 but rounds to 8 in float16 (spacing 2^-7 above 8),
# a 0.4% error in r, twice float16's identity tolerance.
@pytest.mark.clause("ISR-RATIO-1", "ISR-STAB-1")
def test_importance_ratio_of_half_inputs_takes_the_exact_log_ratio(isreshape):

    require_dtype(torch.float16)
    lp, ref = np.array([4.0 + 2.0 ** -8, -0.5]), np.array([-4.0, -0.75])  # exactly representable in float16
    got = isreshape.importance_ratio(torch.tensor(lp, dtype=torch.float16), torch.tensor(ref, dtype=torch.float16))
    assert_close(got, np.exp(lp - ref), "ISR-RATIO-1", dtype=torch.float16,
                 what="importance_ratio of float16 inputs whose log-ratio float16 cannot hold")


# ----------------------------------------------------------------------------- ISR-GAMMA-*
@st.composite
def gamma_cases(draw):
    adv = draw(hnp.arrays(np.float64, st.integers(1, 8), elements=st.floats(-10, 10, allow_nan=False)))
    lo, hi = sorted(draw(st.tuples(st_.isr_gammas(), st_.isr_gammas())))
    return adv, draw(st_.isr_betas()), lo, hi


@pytest.mark.clause("ISR-GAMMA-1")
@given(gamma_cases())
def test_gamma_is_rescaled_sigmoid_of_abs_advantage(isreshape, case):
    adv, beta, lo, hi = case
    got = isreshape.reward_gamma(t64(adv), beta=beta, gamma_min=lo, gamma_max=hi)
    assert_close(got, np_gamma(adv, beta, lo, hi), "ISR-GAMMA-1")


@pytest.mark.clause("ISR-GAMMA-1")
def test_gamma_golden(isreshape):
    # sigma(ln 3) = 3/4 and the sign of A does not matter: sigma(|-ln 3|) = 3/4, not 1/4
    adv = t64([0.0, math.log(3.0), -math.log(3.0)])
    assert_close(isreshape.reward_gamma(adv), [0.5, 0.75, 0.75], "ISR-GAMMA-1")
    assert_close(isreshape.reward_gamma(adv, beta=1.0, gamma_min=0.1, gamma_max=0.9), [0.5, 0.7, 0.7], "ISR-GAMMA-1")


@pytest.mark.clause("ISR-GAMMA-2")
@given(gamma_cases())
def test_gamma_even_monotone_and_above_midpoint(isreshape, case):
    adv, beta, lo, hi = case
    g = isreshape.reward_gamma(t64(adv), beta=beta, gamma_min=lo, gamma_max=hi)
    g_neg = isreshape.reward_gamma(t64(-adv), beta=beta, gamma_min=lo, gamma_max=hi)
    assert_close(g, to_numpy(g_neg), "ISR-GAMMA-2", what="gamma(A) vs gamma(-A)")
    mid = (lo + hi) / 2
    within = (g >= mid - slack("ISR-GAMMA-2", mid)) & (g <= hi + slack("ISR-GAMMA-2", hi))  # the dtype's rounding
    assert_that(within, "ISR-GAMMA-2", g, f"within [{mid}, {hi}]")
    order = np.argsort(np.abs(adv), kind="stable")
    gs = to_numpy(g)[order]
    assert_that(bool(np.all(np.diff(gs) >= -slack("ISR-GAMMA-2", gs[1:]))), "ISR-GAMMA-2", gs, "non-decreasing in |A|")


@pytest.mark.clause("ISR-GAMMA-2")
def test_gamma_default_never_below_one_half(isreshape):
    adv = t64(np.linspace(-50, 50, 201))
    g = isreshape.reward_gamma(adv)
    assert_close(g[100:101], [0.5], "ISR-GAMMA-2", what="gamma at A = 0")
    assert_that(g >= 0.5, "ISR-GAMMA-2", g.min(), ">= 0.5 everywhere with the defaults (no SFT limit)")


# ----------------------------------------------------------------------------- ISR-SAPO-*
@pytest.mark.clause("ISR-SAPO-1")
@given(st_.isr_ratios(), st_.isr_taus())
def test_sapo_weight_matches_closed_form(isreshape, r, tau):
    assert_close(isreshape.sapo_weight(r, tau=tau), np_sapo(to_numpy(r), tau), "ISR-SAPO-1")


@pytest.mark.clause("ISR-SAPO-1")
def test_sapo_weight_golden_corrected_table(isreshape):
    assert_close(isreshape.sapo_weight(t64(R_TABLE), tau=1.0), SAPO_TAU1, "ISR-SAPO-1",
                 what="corrected §2.2 table (tau = 1)")


@pytest.mark.clause("ISR-SAPO-1")
@pytest.mark.parametrize("tau,r_star,w_star", [(0.5, 3.5505627649872333, 2.423980793406628),
                                               (1.0, 2.0600903198932103, 1.574674709546652),
                                               (2.0, 1.3796564370406224, 1.1984519043119868)])
def test_sapo_weight_peaks_above_one(isreshape, tau, r_star, w_star):
    assert_close(isreshape.sapo_weight(t64([r_star]), tau=tau), [w_star], "ISR-SAPO-1", what="peak value")
    grid = t64(np.linspace(0.01, 4 * r_star, 400))
    w = isreshape.sapo_weight(grid, tau=tau)
    assert_that(w <= w_star + 1e-12, "ISR-SAPO-1", w.max(), f"max {w_star} at r* = {r_star}, not 1 at r = 1")


@pytest.mark.clause("ISR-SAPO-2")
@given(st_.isr_ratios(), st_.isr_taus())
def test_sapo_gate_gradient_weight_is_sapo_weight(isreshape, r, tau):
    x = r.clone().requires_grad_(True)
    f = isreshape.sapo_gate(x, tau=tau)
    assert_close(f.detach(), 4.0 / tau * expit(tau * (to_numpy(r) - 1.0)), "ISR-SAPO-2", what="f_SAPO value")
    (g,) = torch.autograd.grad(f.sum(), x)
    assert_close(r * g, np_sapo(to_numpy(r), tau), "ISR-SAPO-2", what="r f'_SAPO(r) by autograd")


@pytest.mark.clause("ISR-SAPO-2")
def test_sapo_gate_golden(isreshape):
    # f_SAPO(1) = 2/tau; f_SAPO(2) at tau = 1 is 4 sigma(1)
    got = isreshape.sapo_gate(t64([1.0, 2.0]), tau=1.0)
    assert_close(got, [2.0, 4.0 / (1.0 + math.exp(-1.0))], "ISR-SAPO-2")
    assert_close(isreshape.sapo_gate(t64([1.0]), tau=4.0), [0.5], "ISR-SAPO-2")


@pytest.mark.clause("ISR-SAPO-3")
@given(st_.isr_ratios(), st_.isr_taus(), st_.isr_taus(), st.data())
def test_sapo_signed_temperature(isreshape, r, tau_pos, tau_neg, data):
    adv = data.draw(hnp.arrays(np.float64, len(r), elements=st.sampled_from([-1.5, -0.2, 0.0, 0.3, 2.0])))
    tau = np.where(adv > 0, tau_pos, tau_neg)
    got = isreshape.sapo_weight_signed(r, t64(adv, like=r), tau_pos=tau_pos, tau_neg=tau_neg)
    assert_close(got, np_sapo(to_numpy(r), tau), "ISR-SAPO-3")


@pytest.mark.clause("ISR-SAPO-3")
def test_sapo_signed_golden(isreshape):
    # r = 2: tau_pos = 1 gives 2 sech^2(1/2) = 1.5729; tau_neg = 2 gives 2 sech^2(1) (A < 0 and A = 0)
    got = isreshape.sapo_weight_signed(t64([2.0, 2.0, 2.0]), t64([1.0, -1.0, 0.0]), tau_pos=1.0, tau_neg=2.0)
    w_neg = 2.0 / math.cosh(1.0) ** 2
    assert_close(got, [1.572895465931855, w_neg, w_neg], "ISR-SAPO-3")


@pytest.mark.clause("ISR-DEFAULT-1", "ISR-SAPO-1")
def test_sapo_weight_default_tau(isreshape):
    tau = isr_defaults()["tau"]
    assert_close(isreshape.sapo_weight(torch.tensor(R, dtype=F64)), np_sapo_weight(R, tau), "ISR-SAPO-1",
                 what="sapo_weight without tau")


@pytest.mark.clause("ISR-DEFAULT-1", "ISR-SAPO-2")
def test_sapo_gate_default_tau(isreshape):
    tau = isr_defaults()["tau"]
    assert_close(isreshape.sapo_gate(torch.tensor(R, dtype=F64)), expit(tau * (R - 1)) * 4 / tau, "ISR-SAPO-2",
                 what="sapo_gate without tau")


# The SAPO weights and gate take no log, so r = 0 is a valid ratio (ISR-INPUT-2 asks r > 0 only where a log
# is taken): a guard stricter than the clause rejects it. The weight there is 0.
@pytest.mark.clause("ISR-SAPO-1", "ISR-SAPO-3", "ISR-INPUT-2")
def test_sapo_weights_accept_a_zero_ratio(isreshape):
    r = np.array([0.0, 1.5])
    adv = np.array([1.0, -1.0])
    assert_close(isreshape.sapo_weight(torch.tensor(r, dtype=F64), tau=2.0), np_sapo_weight(r, 2.0), "ISR-SAPO-1",
                 what="sapo_weight at r = 0")
    got = isreshape.sapo_weight_signed(torch.tensor(r, dtype=F64), torch.tensor(adv, dtype=F64), tau_pos=1.0, tau_neg=3.0)
    assert_close(got, np_sapo_weight(r, np.array([1.0, 3.0])), "ISR-SAPO-3", what="sapo_weight_signed at r = 0")


@pytest.mark.clause("ISR-SAPO-2", "ISR-INPUT-2")
def test_sapo_gate_accepts_a_zero_ratio(isreshape):
    r = np.array([0.0, 1.0])
    assert_close(isreshape.sapo_gate(torch.tensor(r, dtype=F64), tau=2.0), expit(2.0 * (r - 1)) * 4 / 2.0, "ISR-SAPO-2",
                 what="sapo_gate at r = 0")


# ----------------------------------------------------------------------------- ISR-W-*
@pytest.mark.clause("ISR-W-1")
@given(st_.isr_ratios(), st_.isr_taus(), st.data())
def test_weight_matches_closed_form(isreshape, r, tau, data):
    gam = data.draw(hnp.arrays(np.float64, len(r), elements=st.floats(0.0, 1.0)))
    assert_close(isreshape.reshape_weight(r, t64(gam, like=r), tau=tau), np_weight(to_numpy(r), gam, tau), "ISR-W-1")


@pytest.mark.clause("ISR-W-1")
@pytest.mark.parametrize("gamma,expected", [(0.0, [1.0] * 6), (0.5, W_HALF_TAU1), (1.0, SAPO_TAU1)])
def test_weight_golden_corrected_appendix_b(isreshape, gamma, expected):
    assert_close(isreshape.reshape_weight(t64(R_TABLE), gamma, tau=1.0), expected, "ISR-W-1",
                 what=f"corrected appendix B column gamma = {gamma}")


@pytest.mark.clause("ISR-W-2")
@given(st_.isr_ratios(), st_.isr_taus(), st_.isr_gammas())
def test_weight_limits_in_gamma(isreshape, r, tau, gamma):
    w0 = isreshape.reshape_weight(r, 0.0, tau=tau)
    assert_close(w0, np.ones(len(r)), "ISR-W-2", what="gamma = 0 gives weight 1")
    w1 = isreshape.reshape_weight(r, 1.0, tau=tau)
    assert_close(w1, np_sapo(to_numpy(r), tau), "ISR-W-2", what="gamma = 1 gives the SAPO weight")
    wg = isreshape.reshape_weight(r, gamma, tau=tau)
    assert_close(wg, (1 - gamma) * to_numpy(w0) + gamma * to_numpy(w1), "ISR-W-2", what="affine in gamma")
    assert_close(isreshape.reshape_weight(t64([1.0]), gamma, tau=tau), [1.0], "ISR-W-2", what="w(1) = 1")


@pytest.mark.clause("ISR-W-2")
def test_weight_limits_golden(isreshape):
    r = t64(R_TABLE)
    assert_close(isreshape.reshape_weight(r, 0.0, tau=2.0), [1.0] * 6, "ISR-W-2", what="gamma = 0: SFT weight 1")
    assert_close(isreshape.reshape_weight(r, 1.0, tau=1.0), SAPO_TAU1, "ISR-W-2", what="gamma = 1: SAPO weight")
    assert_close(isreshape.reshape_weight(t64([1.0, 1.0]), 0.3, tau=3.0), [1.0, 1.0], "ISR-W-2", what="w(1) = 1")


@pytest.mark.clause("ISR-W-3")
def test_soft_trust_region_golden(isreshape):
    # gamma = 0.5, tau = 1: floor 0.5 at both ends, peak 0.5 + 0.5 * 1.5746747 at r* = 2.0600903
    got = isreshape.reshape_weight(t64([1e-12, 2.0600903198932103, 1e6]), 0.5, tau=1.0)
    assert_close(got, [0.5, 0.5 + 0.5 * 1.574674709546652, 0.5], "ISR-W-3")


@pytest.mark.clause("ISR-W-3")
@given(st_.isr_ratios(log_lo=-12, log_hi=12), st_.isr_taus(), st_.isr_gammas())
def test_weight_bounded_by_floor_and_peak(isreshape, r, tau, gamma):
    w = isreshape.reshape_weight(r, gamma, tau=tau)
    peak = (1 - gamma) + gamma * float(np_sapo(np_peak(tau), tau))
    assert_that(w >= (1 - gamma) - 1e-12, "ISR-W-3", w, f">= 1 - gamma = {1 - gamma}")
    assert_that(w <= peak + 1e-12, "ISR-W-3", w, f"<= the peak {peak}")


@pytest.mark.clause("ISR-W-3")
@given(st_.isr_taus(), st.floats(0.05, 1.0))
def test_weight_soft_trust_region_limits_and_shape(isreshape, tau, gamma):
    ends = isreshape.reshape_weight(t64([1e-12, 1e6]), gamma, tau=tau)
    assert_close(ends, [1 - gamma, 1 - gamma], "ISR-W-3", what="w -> 1 - gamma as r -> 0 and r -> inf")
    r_star = np_peak(tau)
    up = to_numpy(isreshape.reshape_weight(t64(np.linspace(1e-3, r_star, 200)), gamma, tau=tau))
    down = to_numpy(isreshape.reshape_weight(t64(np.linspace(r_star, r_star + 40.0 / tau, 200)), gamma, tau=tau))
    assert_that(bool(np.all(np.diff(up) >= -1e-12)), "ISR-W-3", up, f"rising on (0, r* = {r_star:.4f})")
    assert_that(bool(np.all(np.diff(down) <= 1e-12)), "ISR-W-3", down, "falling after r*")


@pytest.mark.clause("ISR-DEFAULT-1", "ISR-W-1")
@pytest.mark.parametrize("gamma", [0.3, 1.0])
def test_reshape_weight_default_tau(isreshape, gamma):
    tau = isr_defaults()["tau"]
    assert_close(isreshape.reshape_weight(torch.tensor(R, dtype=F64), gamma), (1 - gamma) + gamma * np_sapo_weight(R, tau),
                 "ISR-W-1", what="reshape_weight without tau")


# ----------------------------------------------------------------------------- ISR-F-*
@pytest.mark.clause("ISR-F-1")
@given(st_.isr_ratios(), st_.isr_taus(), st_.isr_gammas())
def test_f_matches_closed_form(isreshape, r, tau, gamma):
    assert_close(isreshape.reshape_f(r, gamma, tau=tau), np_f(to_numpy(r), gamma, tau), "ISR-F-1")


@pytest.mark.clause("ISR-F-1")
@pytest.mark.parametrize("gamma,expected", [(0.5, F_HALF_TAU1), (1.0, F_ONE_TAU1)])
def test_f_golden(isreshape, gamma, expected):
    assert_close(isreshape.reshape_f(t64(R_TABLE), gamma, tau=1.0), expected, "ISR-F-1")


@pytest.mark.clause("ISR-F-2")
@given(st_.isr_ratios(), st_.isr_taus(), st_.isr_gammas())
def test_r_times_f_prime_is_weight_by_autograd(isreshape, r, tau, gamma):
    x = r.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(isreshape.reshape_f(x, gamma, tau=tau).sum(), x)
    assert_close(r * g, np_weight(to_numpy(r), gamma, tau), "ISR-F-2", what="r f'(r) (autograd) vs closed-form w")
    assert_close(r * g, to_numpy(isreshape.reshape_weight(r, gamma, tau=tau)), "ISR-F-2",
                 what="r f'(r) (autograd) vs the implementation's w")


@pytest.mark.clause("ISR-F-2")
@given(st_.isr_ratios(max_len=4, log_lo=-4, log_hi=4), st_.isr_taus(), st_.isr_gammas())
def test_r_times_f_prime_is_weight_by_finite_differences(isreshape, r, tau, gamma):
    # d f(e^u) / du = r f'(r): differentiating in u = log r keeps every probe point at r > 0
    def f_of_log(u):
        return to_numpy(isreshape.reshape_f(torch.from_numpy(np.exp(np.asarray(u, dtype=np.float64))), gamma, tau=tau))

    # an absolute tolerance: where w is ~1e-7 (far tails) a purely relative criterion never converges
    res = derivative(f_of_log, np.log(to_numpy(r)), tolerances={"atol": 1e-10, "rtol": 1e-9})
    if not np.all(res.success):
        fail("ISR-F-2", res.df, "a converged scipy finite difference", "scipy.differentiate did not converge")
    assert_close(res.df, np_weight(to_numpy(r), gamma, tau), "ISR-F-2",
                 what="scipy finite-difference r f'(r) vs the closed-form w")
    assert_close(res.df, to_numpy(isreshape.reshape_weight(r, gamma, tau=tau)), "ISR-F-2",
                 what="scipy finite-difference r f'(r) vs the implementation's w")


@pytest.mark.clause("ISR-F-2")
def test_r_times_f_prime_golden(isreshape):
    # gamma = 0: f = log r so r f' = 1 (the 'w = r f' + f' reading would give 1 + log r)
    r = t64([0.5, 2.0, 5.0])
    assert_close(isreshape.reshape_weight(r, 0.0, tau=1.0), [1.0, 1.0, 1.0], "ISR-F-2")
    assert_close(isreshape.reshape_weight(r, 0.5, tau=1.0), [W_HALF_TAU1[1], W_HALF_TAU1[3], W_HALF_TAU1[4]], "ISR-F-2")


@pytest.mark.clause("ISR-F-3")
@given(st_.isr_ratios(), st_.isr_taus())
def test_f_limits_and_sapo_relation(isreshape, r, tau):
    assert_close(isreshape.reshape_f(r, 0.0, tau=tau), np.log(to_numpy(r)), "ISR-F-3", what="f_0 = log r")
    f1 = isreshape.reshape_f(r, 1.0, tau=tau)
    # f_SAPO is of size 4/tau and f_1 its difference with 2/tau: both are held to the rounding of that size
    scale = max(1.0, 4.0 / tau)
    assert_close(f1, 4.0 / tau * expit(tau * (to_numpy(r) - 1.0)) - 2.0 / tau, "ISR-F-3", scale=scale,
                 what="f_1 = f_SAPO - 2/tau")
    sapo = to_numpy(isreshape.sapo_gate(r, tau=tau)).astype(np.float64)
    assert_close(f1, sapo - 2.0 / tau, "ISR-F-3", scale=scale, what="f_1 vs the implementation's f_SAPO - 2/tau")


@pytest.mark.clause("ISR-F-3")
def test_f_sapo_offset_golden(isreshape):
    # at r = 1: f_1 = 0 and f_SAPO = 2/tau, the whole difference is the constant
    assert_close(isreshape.reshape_f(t64([1.0]), 1.0, tau=0.5), [0.0], "ISR-F-3")
    assert_close(isreshape.sapo_gate(t64([1.0]), tau=0.5), [4.0], "ISR-F-3")


@pytest.mark.clause("ISR-DEFAULT-1", "ISR-F-1")
@pytest.mark.parametrize("gamma", [0.0, 0.3, 1.0])
def test_reshape_f_default_tau(isreshape, gamma):
    tau = isr_defaults()["tau"]
    want = (1 - gamma) * np.log(R) + gamma * (2 / tau) * np.tanh(tau * (R - 1) / 2)
    assert_close(isreshape.reshape_f(torch.tensor(R, dtype=F64), gamma), want, "ISR-F-1", what="reshape_f without tau")


# ----------------------------------------------------------------------------- ISR-STAB-1
@pytest.mark.clause("ISR-STAB-1")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@given(r=st_.isr_ratios(log_lo=-20, log_hi=20), tau=st_.isr_taus(), gamma=st_.isr_gammas())
def test_weight_finite_and_bounded_in_low_precision(isreshape, dtype, r, tau, gamma):
    x = r.clamp(max=torch.finfo(dtype).max).to(dtype)
    w = isreshape.reshape_weight(x, gamma, tau=tau)
    assert_that(torch.isfinite(w), "ISR-STAB-1", w, "finite weights")
    _, atol = tolerance_for(dtype)
    peak = (1 - gamma) + gamma * float(np_sapo(np_peak(tau), tau))
    wf = w.double()
    assert_that((wf >= (1 - gamma) - atol - 0.01 * (1 - gamma)) & (wf <= peak * 1.01 + atol), "ISR-STAB-1", w,
                f"within [1 - gamma, peak] = [{1 - gamma}, {peak}]")


@pytest.mark.clause("ISR-STAB-1")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@given(r=st_.isr_ratios(log_lo=-20, log_hi=20), tau=st_.isr_taus(), gamma=st_.isr_gammas())
def test_weight_values_in_low_precision(isreshape, dtype, r, tau, gamma):
    """Not only finite: the value against the float64 weight of the same rounded ratios."""
    x = r.clamp(max=torch.finfo(dtype).max).to(dtype)
    w = isreshape.reshape_weight(x, gamma, tau=tau)
    assert_low_precision(w, np_weight(x.double().numpy(), gamma, tau), "ISR-STAB-1", dtype, "weight")


@pytest.mark.clause("ISR-STAB-1")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@given(batch=st_.isr_token_batches(log_ratio=25.0))
def test_loss_and_gradient_in_low_precision(isreshape, dtype, batch):
    """Value and gradient against the float64 answer for the same rounded tokens: a constant or
    zero-gradient half-precision loss fails, not only a NaN."""
    lp, ref, adv, mask = (t.to(dtype) for t in batch)
    c = log_ratio_clamp()
    if math.isinf(c):  # no clamp declared: the normative domain is where the ratio itself is finite
        span = math.log(torch.finfo(dtype).max) - 1.0
        ref = (lp.double() - (lp.double() - ref.double()).clamp(-span, span)).to(dtype)
    x = lp.clone().requires_grad_(True)
    loss = isreshape.policy_loss(x, ref, adv, mask)
    assert_that(torch.isfinite(loss), "ISR-STAB-1", loss, "a finite loss")
    (g,) = torch.autograd.grad(loss, x) if loss.requires_grad else (torch.zeros_like(x),)
    assert_that(torch.isfinite(g), "ISR-STAB-1", g, "a finite gradient")
    nlp, nref, nadv, nm = (t.double().numpy() for t in (lp, ref, adv, mask))
    w = np_weight(np.exp(np.clip(nlp - nref, -c, c)), np_gamma(nadv, 1.0, 0.0, 1.0), 1.0)
    denom = nm.sum() + 1e-8
    terms = w * nadv * nlp * nm
    scale = max(1.0, float(np.abs(terms).sum() / denom))  # rounding error scales with the terms, not the sum
    assert_low_precision(loss.double() / scale, -terms.sum() / denom / scale, "ISR-STAB-1", dtype, "loss / scale")
    assert_low_precision(g, -w * nadv * nm / denom, "ISR-STAB-1", dtype, "dL/dlog pi")


def tolerance_for(dtype):

    return tolerance("ISR-STAB-1", dtype)


# ----------------------------------------------------------------------------- ISR-INPUT-2/3/4 (weights)
@pytest.mark.clause("ISR-INPUT-2")
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.5])
def test_bad_ratio_is_rejected(isreshape, bad):
    r = t64([1.0, bad])
    assert_rejects("ISR-INPUT-2", isreshape.raw("reshape_weight"), r, 0.5)
    assert_rejects("ISR-INPUT-2", isreshape.raw("reshape_f"), r, 0.5)


@pytest.mark.clause("ISR-INPUT-2")
def test_zero_ratio_is_rejected_by_f(isreshape):
    assert_rejects("ISR-INPUT-2", isreshape.raw("reshape_f"), t64([0.0, 1.0]), 0.5)


@pytest.mark.clause("ISR-INPUT-3")
@pytest.mark.parametrize("tau", [0.0, -1.0])
def test_non_positive_tau_is_rejected(isreshape, tau):
    r = t64([0.5, 2.0])
    assert_rejects("ISR-INPUT-3", isreshape.raw("reshape_weight"), r, 0.5, tau=tau)
    assert_rejects("ISR-INPUT-3", isreshape.raw("reshape_f"), r, 0.5, tau=tau)
    assert_rejects("ISR-INPUT-3", isreshape.raw("sapo_weight"), r, tau=tau)
    assert_rejects("ISR-INPUT-3", isreshape.raw("sapo_weight_signed"), r, t64([1.0, -1.0]), tau_pos=1.0, tau_neg=tau)


@pytest.mark.clause("ISR-INPUT-3")
def test_negative_beta_is_rejected(isreshape):
    assert_rejects("ISR-INPUT-3", isreshape.raw("reward_gamma"), t64([1.0]), beta=-0.5)


@pytest.mark.clause("ISR-INPUT-4")
@pytest.mark.parametrize("gamma", [-0.1, 1.5, "tensor"])
def test_gamma_outside_unit_interval_is_rejected(isreshape, gamma):
    r = t64([0.5, 2.0])
    g = t64([0.5, 1.2]) if gamma == "tensor" else gamma
    assert_rejects("ISR-INPUT-4", isreshape.raw("reshape_weight"), r, g)
    assert_rejects("ISR-INPUT-4", isreshape.raw("reshape_f"), r, g)


@pytest.mark.clause("ISR-INPUT-4")
@pytest.mark.parametrize("lo,hi", [(-0.1, 1.0), (0.0, 1.1), (0.8, 0.2)])
def test_bad_gamma_bounds_are_rejected(isreshape, lo, hi):
    assert_rejects("ISR-INPUT-4", isreshape.raw("reward_gamma"), t64([1.0]), gamma_min=lo, gamma_max=hi)


# ----------------------------------------------------------------------------- ISR-DTYPE-1
def _isr_dtype_calls(dtype):
    """One call of every float-returning operation on inputs of ``dtype``, as (op, args, kwargs)."""
    lp = torch.tensor([-0.3, -1.7, -2.2, -0.01], dtype=dtype)
    ref = torch.tensor([-0.5, -1.0, -4.0, -0.02], dtype=dtype)
    adv = torch.tensor([1.5, -0.5, 0.0, 2.0], dtype=dtype)
    m = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=dtype)
    r = torch.exp(lp - ref)
    return [
        ("importance_ratio", (lp, ref), {}), ("reward_gamma", (adv,), {}), ("sapo_weight", (r,), {}),
        ("sapo_weight_signed", (r, adv), dict(tau_pos=1.0, tau_neg=1.05)), ("reshape_weight", (r, 0.5), {}),
        ("reshape_f", (r, 0.5), {}), ("sapo_gate", (r,), {}), ("policy_loss", (lp, ref, adv, m), {}),
        ("sft_loss", (lp, ref, m), {}), ("aggregate_loss", (lp[None], m[None]), {}),
    ]


@pytest.mark.clause("ISR-DTYPE-1")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("index", range(10))
def test_outputs_keep_the_input_dtype(isreshape, dtype, index):
    op, args, kwargs = _isr_dtype_calls(dtype)[index]
    assert_dtype(getattr(isreshape, op)(*args, **kwargs), dtype, "ISR-DTYPE-1", op)
