"""PPO §4, §8: ratio, the two KL estimators, clip fraction, PPO-Clip, value and total loss with mean
reductions, gradient-norm clipping, advantage normalisation, the KL guard and reward scaling."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from rlconform.spec import default_spec

from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_close,
    assert_dtype,
    assert_equal,
    assert_no_grad,
    assert_rejects,
    assert_that,
    convention,
    declares,
    finite_difference,
    generator,
    grad_leaves,
    not_applicable,
    np_approx_kl,
    np_clip_fraction,
    np_standardise,
    on_device,
    require_dtype,
    slack,
    to_numpy,
    tolerance,
    working_dtype,
)
from conformance_tests.oracles import clipped_surrogate_slope, kink_atol, kink_step

F64 = torch.float64


def spec_default(clause: str, key: str) -> float:
    return float(default_spec().clause(clause).value[key])


def _op_clip_fraction() -> str:
    """The clip_fraction convention the op-level test can check: active_clips needs the advantages,
    which the ``clip_fraction`` op does not take (the loss-level op checks it)."""
    conv = convention("clip_fraction")
    if conv != "ratio_outside":
        not_applicable("clip_fraction(ratio) takes no advantages; active_clips is checked at loss level")
    return conv


# ----------------------------------------------------------------------------- ratio and KL
@pytest.mark.clause("PPO-RATIO-1")
@given(st_.log_prob_pairs())
def test_ratio_is_exp_of_log_prob_difference(ppo, pair):
    old, new = pair
    assert_close(ppo.ratio(new, old), np.exp(to_numpy(new) - to_numpy(old)), "PPO-RATIO-1")


@pytest.mark.clause("PPO-RATIO-1")
def test_ratio_golden_from_the_symptom_log(ppo):
    # §0: ratio.mean ≈ 8.26 comes from log-prob differences near log 8.26 = 2.11
    old = torch.tensor([-3.72, -0.5], dtype=torch.float64)
    new = torch.tensor([-1.61, -0.5], dtype=torch.float64)
    assert_close(ppo.ratio(new, old), [math.exp(2.11), 1.0], "PPO-RATIO-1")


@pytest.mark.clause("PPO-RATIO-1")
def test_ratio_past_any_log_ratio_clamp(ppo):
    # a token 25 nats more likely than at sampling: exp(25), not exp(20) from a clamp on the log-ratio
    old = torch.tensor([-25.0, -0.5, 0.0], dtype=torch.float64)
    new = torch.tensor([0.0, -0.5, -25.0], dtype=torch.float64)
    assert_close(ppo.ratio(new, old), [math.exp(25.0), 1.0, math.exp(-25.0)], "PPO-RATIO-1")


@pytest.mark.clause("PPO-KL-1")
@given(st_.log_prob_pairs(), st_.float_dtypes())
def test_approx_kl_is_mean_old_minus_new(ppo, pair, dtype):
    old, new = (x.to(dtype) for x in pair)  # float32 too: trainers log approx_kl in their own dtype
    est = convention("approx_kl")
    assert_close(ppo.approx_kl(old, new), np_approx_kl(old.double().numpy(), new.double().numpy(), est), "PPO-KL-1")
    # normative whatever the estimator: exactly 0 when the policies agree
    assert_close(ppo.approx_kl(old, old), 0.0, "PPO-KL-1", what="approx_kl of identical log-probs")


@pytest.mark.clause("PPO-KL-1")
def test_approx_kl_golden_can_be_negative(ppo):
    old = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    new = torch.tensor([-0.5, -1.0, -0.5], dtype=torch.float64)
    # k1: (−0.5 − 1 + 0) / 3; k3 (never negative): ((e^0.5 − 1.5) + (e − 2) + 0) / 3
    expected = {"k1": -0.5, "k3": (math.exp(0.5) - 1.5 + math.e - 2.0) / 3}[convention("approx_kl")]
    assert_close(ppo.approx_kl(old, new), expected, "PPO-KL-1")


@pytest.mark.clause("PPO-KL-2")
@given(st_.log_prob_pairs())
def test_k3_kl_is_mean_r_minus_1_minus_log_r_and_non_negative(ppo, pair):
    old, new = pair
    lr = to_numpy(new) - to_numpy(old)
    got = ppo.k3_kl(old, new)
    assert_close(got, np.mean(np.expm1(lr) - lr), "PPO-KL-2")
    # (r - 1) - log r as written rounds to a hair below 0 at tiny log-ratios (-1e-8 in float32): within the tolerance
    assert_that(float(got) >= -float(slack("PPO-KL-2", 0.0)), "PPO-KL-2", got, "a non-negative estimate")


@pytest.mark.clause("PPO-KL-2")
def test_k3_kl_golden(ppo):
    old = torch.tensor([-1.0, -1.0], dtype=torch.float64)
    new = torch.tensor([-1.0 + math.log(2.0), -1.0], dtype=torch.float64)  # r = 2 and 1
    assert_close(ppo.k3_kl(old, new), ((2 - 1 - math.log(2)) + 0.0) / 2, "PPO-KL-2")


@pytest.mark.clause("PPO-CLIPFRAC-1")
@given(st_.ratios_and_advantages(), st_.keyword_arguments("ppo.clip_fraction"))
def test_clip_fraction_is_share_outside_the_clip_range(ppo, ra, kw):
    r, _ = ra
    conv = _op_clip_fraction()
    assert_close(ppo.clip_fraction(r, **kw), np_clip_fraction(to_numpy(r), kw["clip_eps"], conv), "PPO-CLIPFRAC-1")


@pytest.mark.clause("PPO-CLIPFRAC-1")
def test_clip_fraction_golden(ppo):
    _op_clip_fraction()
    r = torch.tensor([1.0, 1.2, 1.25, 0.7, 0.81], dtype=torch.float64)
    # |r−1| = 0, 0.2 (not strictly above), 0.25, 0.3, 0.19 -> 2 of 5
    assert_close(ppo.clip_fraction(r, clip_eps=0.2 + 1e-12), 0.4, "PPO-CLIPFRAC-1")


# A ratio exactly on the edge of [1 - eps, 1 + eps] is not clipped: clipped means |r - 1| > eps, strictly.
@pytest.mark.clause("PPO-CLIPFRAC-1")
def test_clip_fraction_excludes_ratios_exactly_on_the_edge(ppo):
    # r - 1 is exact in float64 for r in [0.5, 2]: 1.25 and 0.75 sit exactly on the edges of eps = 0.25
    r = torch.tensor([1.25, 0.75, 1.2500001, 0.7499999, 1.0], dtype=F64)
    assert_close(ppo.clip_fraction(r, clip_eps=0.25), 2 / 5, "PPO-CLIPFRAC-1", what="share of |r - 1| > 0.25")


# ----------------------------------------------------------------------------- losses
def np_clipped_loss(r, a, eps):
    return -np.mean(np.minimum(r * a, np.clip(r, 1 - eps, 1 + eps) * a))


@pytest.mark.clause("PPO-LOSS-1")
@given(st_.ratios_and_advantages(), st_.keyword_arguments("ppo.clipped_policy_loss"))
def test_clipped_policy_loss(ppo, ra, kw):
    r, a = ra
    eps = kw["clip_eps"]
    assert_close(ppo.clipped_policy_loss(r, a, **kw), np_clipped_loss(to_numpy(r), to_numpy(a), eps), "PPO-LOSS-1")


@pytest.mark.clause("PPO-LOSS-1")
def test_clipped_policy_loss_has_no_dual_clip(ppo):
    # r = 5 with A = -1: the seed's loss is -min(5·-1, 1.2·-1) = 5; a dual clip at c = 3 would give 3
    r = torch.tensor([5.0, 10.0], dtype=torch.float64)
    a = torch.tensor([-1.0, -2.0], dtype=torch.float64)
    assert_close(ppo.clipped_policy_loss(r, a, clip_eps=0.2), (5.0 + 20.0) / 2, "PPO-LOSS-1")


@pytest.mark.clause("PPO-LOSS-1")
def test_clipped_policy_loss_golden(ppo):
    # A>0: min(1.5·2, 1.2·2) = 2.4; A<0: min(0.5·−1, 0.8·−1) = −0.8; r=1: 1·3 = 3 -> loss = −(2.4 − 0.8 + 3)/3
    r = torch.tensor([1.5, 0.5, 1.0], dtype=torch.float64)
    a = torch.tensor([2.0, -1.0, 3.0], dtype=torch.float64)
    assert_close(ppo.clipped_policy_loss(r, a, clip_eps=0.2), -(2.4 - 0.8 + 3.0) / 3, "PPO-LOSS-1")


@pytest.mark.clause("PPO-LOSS-1")
@given(st_.ratios_and_advantages(max_batch=6))
def test_clipped_policy_loss_gradient_matches_finite_differences(ppo, ra):
    r, a = ra
    r = r[(np.abs(np.abs(to_numpy(r) - 1.0) - 0.2) > 1e-3)]  # away from the kinks of clip
    a = a[: len(r)]
    if len(r) == 0:
        return
    x = r.clone().requires_grad_(True)
    ppo.clipped_policy_loss(x, a, clip_eps=0.2).backward()
    fd = finite_difference(lambda v: np_clipped_loss(to_numpy(v), to_numpy(a), 0.2), r)
    assert_close(x.grad, fd, "PPO-LOSS-1", what="autograd vs finite differences", approx="gradient")


@pytest.mark.clause("PPO-LOSS-1")
@given(st_.ratios_and_advantages(max_batch=6), st_.keyword_arguments("ppo.clipped_policy_loss"), st.data())
def test_clipped_policy_loss_one_sided_derivatives_at_the_kinks(ppo, ra, kw, data):
    """One ratio sits exactly on a kink of the clip (r = 1 - eps or 1 + eps) with A != 0. The slopes of the two
    pieces that meet there are the closed-form ones: -A/n where the unclipped product is the minimum, 0 where
    the clipped constant is (they differ at r = 1 + eps for A > 0 and at r = 1 - eps for A < 0, and agree at
    the other two). The loss is linear in r on each piece, so each slope is the autograd derivative a step
    inside its piece (:func:`oracles.kink_step`, every probed ratio positive); no finite difference, so a
    library that computes in float32 is not failed for its rounding. At the kink autograd returns the slope
    of either piece or a mix of the two (the two products tie there, and a minimum may split a tie)."""
    dt = working_dtype()
    r, a = (x.to(dt) for x in ra)
    eps = kw["clip_eps"]
    i = data.draw(st.integers(0, len(r) - 1), label="row")
    r[i] = data.draw(st.sampled_from([1.0 - eps, 1.0 + eps]), label="kink")
    a[i] = data.draw(st.sampled_from([-1.0, 1.0])) * data.draw(st.floats(0.1, 3.0), label="|A|")
    n, rho, ai = len(r), float(r[i]), float(a[i])
    h = kink_step(eps, rho, torch.finfo(dt).eps)

    def slope_at(v: torch.Tensor) -> float:
        x = v.clone().requires_grad_(True)
        ppo.clipped_policy_loss(x, a, **kw).backward()
        return float(x.grad[i])

    for side in (-1, 1) if h else ():
        y = r.clone()
        y[i] += side * h
        want = -clipped_surrogate_slope(rho, ai, eps, side, atol=kink_atol(torch.finfo(dt).eps)) / n
        assert_close(slope_at(y), want, "PPO-LOSS-1", dtype=dt,
                     approx="gradient", what=f"the slope {'left' if side < 0 else 'right'} of r = {rho}, A = {ai}")
    rtol, atol = tolerance("PPO-LOSS-1", dt, approx="gradient")
    g, lo, hi, slack = slope_at(r), min(-ai / n, 0.0), max(-ai / n, 0.0), atol + rtol * abs(ai / n)
    assert_that(lo - slack <= g <= hi + slack, "PPO-LOSS-1", g,
                f"an autograd value between {lo} and {hi}, the slopes of the two pieces at r = {rho}, A = {ai}")


@pytest.mark.clause("PPO-LOSS-2")
@given(st_.ratios_and_advantages(), st_.float_dtypes())
def test_value_loss_is_half_mean_squared_error(ppo, va, dtype):
    v, ret = (x.to(dtype) for x in va)  # the declared factor on every declared dtype
    factor = convention("value_loss_factor")  # the seed's ½, or 1 when folded into vf_coef
    assert_close(ppo.value_loss(v, ret), factor * np.mean((ret.double().numpy() - v.double().numpy()) ** 2), "PPO-LOSS-2")


@pytest.mark.clause("PPO-LOSS-2")
def test_value_loss_golden(ppo):
    v = torch.tensor([1.0, 2.0], dtype=torch.float64)
    ret = torch.tensor([0.0, 4.0], dtype=torch.float64)
    assert_close(ppo.value_loss(v, ret), convention("value_loss_factor") * (1 + 4) / 2, "PPO-LOSS-2")


@pytest.mark.clause("PPO-LOSS-3")
@given(st.floats(-5, 5), st.floats(0, 5), st.floats(0, 3), st_.keyword_arguments("ppo.total_loss"))
def test_total_loss_combines_the_terms(ppo, pl, vl, ent, kw):
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    expected = pl + kw["vf_coef"] * vl - kw["ent_coef"] * ent
    assert_close(ppo.total_loss(t(pl), t(vl), t(ent), **kw), expected, "PPO-LOSS-3")


@pytest.mark.clause("PPO-LOSS-3")
def test_total_loss_golden_entropy_lowers_the_loss(ppo):
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    got = ppo.total_loss(t(0.3), t(2.0), t([1.0, 2.0]), vf_coef=0.5, ent_coef=0.01)
    assert_close(got, 0.3 + 1.0 - 0.015, "PPO-LOSS-3")  # per-row entropy averaged to 1.5


@pytest.mark.clause("PPO-LOSS-4")
@given(st_.ratios_and_advantages(), st.integers(2, 4))
def test_losses_do_not_scale_with_batch_size(ppo, ra, k):
    r, a = ra
    rep = lambda x: x.repeat(k)  # noqa: E731
    assert_close(ppo.clipped_policy_loss(rep(r), rep(a), clip_eps=0.2),
                 np_clipped_loss(to_numpy(r), to_numpy(a), 0.2), "PPO-LOSS-4", what="policy loss")
    want = convention("value_loss_factor") * np.mean((to_numpy(a) - to_numpy(r)) ** 2)
    assert_close(ppo.value_loss(rep(r), rep(a)), want, "PPO-LOSS-4", what="value loss")
    old, new = -r.abs(), -a.abs()
    assert_close(ppo.approx_kl(rep(old), rep(new)), np_approx_kl(to_numpy(old), to_numpy(new), convention("approx_kl")),
                 "PPO-LOSS-4", what="approx_kl")
    if convention("clip_fraction") == "ratio_outside":  # active_clips: the op has no advantages (loss level)
        assert_close(ppo.clip_fraction(rep(r), clip_eps=0.2), np_clip_fraction(to_numpy(r), 0.2, "ratio_outside"),
                     "PPO-LOSS-4", what="clip_fraction")


# ----------------------------------------------------------------------------- gradient clipping
def _param(grad: torch.Tensor) -> torch.nn.Parameter:
    """A zero parameter on the audited device holding ``grad`` (a gradient has its parameter's dtype and device)."""
    p = torch.nn.Parameter(on_device(torch.zeros_like(grad)))
    p.grad = on_device(grad)
    return p


@pytest.mark.clause("PPO-GRAD-1")
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.data(), st.floats(0.01, 10.0))
def test_clip_grad_norm_rescales_to_the_bound(ppo, sizes, data, max_norm):
    clip_grad_norm = ppo.clip_grad_norm  # not applicable before anything is drawn when the op is missing
    grads = [data.draw(st_.tensors((n,), lo=-5.0, hi=5.0)) for n in sizes]  # in a declared dtype
    params = [_param(grad) for grad in grads]
    g = np.concatenate([grad.double().numpy() for grad in grads])
    norm = np.linalg.norm(g)
    got_norm = clip_grad_norm(params, max_norm=max_norm)
    assert_close(got_norm, norm, "PPO-GRAD-1", what="returned norm (before clipping)")
    coef = min(1.0, max_norm / (norm + 1e-6))
    assert_close(torch.cat([p.grad for p in params]), g * coef, "PPO-GRAD-1")


@pytest.mark.clause("PPO-GRAD-1")
def test_clip_grad_norm_golden(ppo):
    clip_grad_norm, dt = ppo.clip_grad_norm, working_dtype()
    p = _param(torch.tensor([3.0, 4.0], dtype=dt))  # norm 5
    clip_grad_norm([p], max_norm=1.0)
    assert_close(p.grad, [0.6 / (1 + 2e-7), 0.8 / (1 + 2e-7)], "PPO-GRAD-1")
    q = _param(torch.tensor([0.3, 0.4], dtype=dt))  # already inside the bound: unchanged
    clip_grad_norm([q], max_norm=1.0)
    assert_close(q.grad, [0.3, 0.4], "PPO-GRAD-1")


# ----------------------------------------------------------------------------- advantages
@pytest.mark.clause("PPO-ADV-1")
@given(st_.advantages(), st_.keyword_arguments("ppo.normalize_advantages"), st_.float_dtypes())
def test_advantage_normalisation(ppo, adv, kw, dtype):
    # every declared dtype: a declared std convention must hold in float32 too, not only in float64
    adv = st_.well_conditioned(adv.to(dtype))
    z = np_standardise(adv.double().numpy(), convention("advantage_std"), kw["eps"])
    expected = z if kw["clamp"] is None else np.clip(z, -kw["clamp"], kw["clamp"])
    assert_close(ppo.normalize_advantages(adv, **kw), expected, "PPO-ADV-1")


@pytest.mark.clause("PPO-ADV-1")
def test_advantage_normalisation_golden(ppo):
    adv = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)  # mean 2, Bessel std 1, population std sqrt(2/3)
    conv = convention("advantage_std")
    sd = 1.0 if conv["ddof"] == 1 else math.sqrt(2 / 3)
    z = 1 / (max(sd, conv["eps"]) if conv["eps_mode"] == "clamp" else sd + conv["eps"])
    assert_close(ppo.normalize_advantages(adv), [-z, 0.0, z], "PPO-ADV-1")


@pytest.mark.clause("PPO-ADV-2")
@given(st_.advantages(min_size=12, scale=1.0))
def test_advantage_clamp(ppo, adv):
    adv = adv.clone()
    adv[0] = 1e6  # one outlier: its standardised value is about sqrt(N-1) > 3
    z = np_standardise(to_numpy(adv), convention("advantage_std"), 1e-8)
    assert_close(ppo.normalize_advantages(adv, clamp=3.0), np.clip(z, -3, 3), "PPO-ADV-2")
    assert_close(ppo.normalize_advantages(adv, clamp=10.0), np.clip(z, -10, 10), "PPO-ADV-2")


@pytest.mark.clause("PPO-ADV-2")
def test_advantage_clamp_golden(ppo):
    adv = torch.tensor([0.0] * 199 + [1.0], dtype=torch.float64)  # the outlier standardises to 14.1
    got = ppo.normalize_advantages(adv, clamp=10.0)
    assert_close(got[-1:], [10.0], "PPO-ADV-2")
    conv = convention("advantage_std")
    sd = math.sqrt(0.005 if conv["ddof"] else 0.005 * 0.995)  # mean 1/200: Bessel var 1/200, population 0.995/200
    den = max(sd, conv["eps"]) if conv["eps_mode"] == "clamp" else sd + conv["eps"]
    assert_close(got[:1], [-0.005 / den], "PPO-ADV-2")


@pytest.mark.clause("PPO-ADV-1", "PPO-DEFAULT-3")
def test_normalize_advantages_default_eps(ppo):
    """(A - mean) / (std + eps) with the Bessel std and eps at its default, on a batch with a tiny spread,
    where eps is not negligible. A spread of 1e-8 around 1 exists only in float64 (float32's spacing at 1 is
    1.2e-7), so the check is not applicable to an implementation without float64."""
    require_dtype(F64)
    a = np.array([1.0, 1.0 + 2e-8, 1.0 - 1e-8, 1.0 + 4e-8])
    std = convention("advantage_std")  # the seed's Bessel std plus eps, or the declared ddof and eps form
    eps = spec_default("PPO-DEFAULT-3", "adv_eps") if not declares("advantage_std") else std["eps"]
    want = np_standardise(a, std, eps)
    assert_close(ppo.normalize_advantages(torch.tensor(a, dtype=F64)), want, "PPO-ADV-1", approx="reduction",
                 what="normalize_advantages without eps (the default must be 1e-8)")


# ----------------------------------------------------------------------------- KL guard, reward scale
def kl_values(target: float):
    """approx_kl values around the guard: anywhere, and on purpose between 1.5x and 2x the target (where SB3's
    1.5 and the seed's 2 disagree) and exactly at both multiples (the strict edge)."""
    return st.one_of(st.floats(-0.1, 0.5), st.floats(1.4 * target, 2.1 * target),
                     st.sampled_from([1.5 * target, 2.0 * target]))


@pytest.mark.clause("PPO-KLSTOP-1")
@given(st_.keyword_arguments("ppo.kl_early_stop"), st.data())
def test_kl_guard_stops_above_factor_times_the_target(ppo, kw, data):
    kl = data.draw(kl_values(kw["target_kl"]), label="approx_kl")
    assert_equal(bool(ppo.kl_early_stop(kl, **kw)), kl > kw["factor"] * kw["target_kl"], "PPO-KLSTOP-1")


@pytest.mark.clause("PPO-KLSTOP-1")
@pytest.mark.parametrize("kl", [0.01, 0.0224, 0.0225, 0.0226, 0.029, 0.03, 0.0301, 0.04, 0.05])
def test_kl_guard_golden_with_the_document_defaults(ppo, kl):
    # §8: 2 × 0.015 = 0.03 (the kl_stop_factor convention: SB3 stops above 1.5 × 0.015 = 0.0225); §11's 0.05
    # is errata (an implementation stopping at 0.05 misses 0.0301 and 0.04)
    stop = kl > convention("kl_stop_factor") * 0.015
    assert_equal(bool(ppo.kl_early_stop(kl)), stop, "PPO-KLSTOP-1", f"approx_kl={kl}")


# Called without target_kl: the spec's default, and the strict threshold (equality does not stop).
@pytest.mark.clause("PPO-KLSTOP-1", "PPO-DEFAULT-2")
@pytest.mark.parametrize("scale, stop", [(0.5, False), (1.0, False), (1.0 + 1e-6, True), (1.2, True)])
def test_kl_early_stop_defaults_and_strict_threshold(ppo, scale, stop):
    """Stop exactly when approx_kl > kl_stop_factor * target_kl (0.03 with the seed's defaults), equality
    excluded; the factor follows the kl_stop_factor convention."""
    bound = convention("kl_stop_factor") * spec_default("PPO-DEFAULT-2", "target_kl")
    assert_equal(bool(ppo.kl_early_stop(bound * scale)), stop, "PPO-KLSTOP-1",
                 what=f"kl_early_stop({bound * scale}) with target_kl and factor at their defaults")


@pytest.mark.clause("PPO-REWARD-1")
@given(st_.advantages(scale=20.0), st_.keyword_arguments("ppo.scale_reward"))
def test_reward_scaling(ppo, r, kw):
    assert_close(ppo.scale_reward(r, **kw), np.clip(to_numpy(r) / kw["scale"], -1, 1), "PPO-REWARD-1")


@pytest.mark.clause("PPO-REWARD-1")
def test_reward_scaling_golden(ppo):
    r = torch.tensor([-30.0, -5.0, 0.0, 2.5, 100.0], dtype=torch.float64)
    assert_close(ppo.scale_reward(r, scale=10.0), [-1.0, -0.5, 0.0, 0.25, 1.0], "PPO-REWARD-1")


@pytest.mark.clause("PPO-SLO-4")
def test_entropy_ratio_golden(ppo):
    # rows with 4, 2 and 1 legal actions; entropies log 4, 0.5 and 0: (log 4 + 0.5) / (log 4 + log 2)
    mask = torch.tensor([[True] * 4, [True, True, False, False], [True, False, False, False]])
    ent = torch.tensor([math.log(4), 0.5, 0.0], dtype=torch.float64)
    assert_close(ppo.entropy_ratio(ent, mask), (math.log(4) + 0.5) / (math.log(4) + math.log(2)), "PPO-SLO-4")


# No row has a choice (sum log|A| = 0): the contract gives 0 whatever the per-row entropies (a one-action
# row's entropy is 0 up to rounding), never H / tiny.
@pytest.mark.clause("PPO-SLO-4")
@pytest.mark.parametrize("noise", [0.0, 1e-12, 3e-9])
def test_entropy_ratio_is_zero_when_no_row_has_a_choice(ppo, noise):
    mask = torch.tensor([[True, False, False], [False, False, True]])
    got = ppo.entropy_ratio(torch.full((2,), noise, dtype=F64), mask)
    assert_close(got, 0.0, "PPO-SLO-4", dtype=F64, what="entropy_ratio with one legal action in every row")


# ----------------------------------------------------------------------------- bad input
T = lambda *x: torch.tensor(x, dtype=torch.float64)  # noqa: E731


def _bad_input_id(op: str, args: tuple, kwargs: dict) -> str:
    """``value_loss-inf``, ``clip_fraction-clip_eps=-0.1``, ``ratio-shapes``, ``normalize_advantages-1-sample``:
    what is bad about the call."""
    flat = [float(v) for a in args if torch.is_tensor(a) for v in a.flatten()]
    bad = [k for k, f in (("nan", math.isnan), ("inf", math.isinf)) if any(f(v) for v in flat)]
    tensors = [a for a in args if torch.is_tensor(a)]
    same = all(a.shape == tensors[0].shape for a in tensors)
    if not bad and same:
        bad = [",".join(f"{k}={v}" for k, v in kwargs.items()) if kwargs else f"{tensors[0].numel()}-sample"]
    return f"{op}-{'-'.join(bad) or 'shapes'}"


@pytest.mark.clause("PPO-INPUT-4")
@pytest.mark.parametrize("case", [
    ("ratio", (T(0.0, 1.0), T(0.0)), {}),
    ("ratio", (T(float("nan")), T(0.0)), {}),
    ("approx_kl", (T(0.0, 1.0), T(0.0)), {}),
    ("k3_kl", (T(0.0), T(float("nan"))), {}),
    ("clipped_policy_loss", (T(1.0, 1.0), T(1.0)), {"clip_eps": 0.2}),
    ("clipped_policy_loss", (T(1.0), T(1.0)), {"clip_eps": 0.0}),
    ("clipped_policy_loss", (T(1.0), T(1.0)), {"clip_eps": 1.5}),
    ("clipped_policy_loss", (T(1.0), T(float("nan"))), {"clip_eps": 0.2}),
    ("clip_fraction", (T(1.0),), {"clip_eps": -0.1}),
    ("value_loss", (T(1.0, 2.0), T(1.0)), {}),
    ("value_loss", (T(float("inf")), T(1.0)), {}),
    ("value_loss", (T(1.0), T(float("nan"))), {}),
    ("normalize_advantages", (T(1.0),), {}),
    ("normalize_advantages", (T(1.0, float("nan")),), {}),
    ("kl_early_stop", (0.01,), {"target_kl": 0.0}),
    ("scale_reward", (T(1.0),), {"scale": 0.0}),
], ids=lambda c: _bad_input_id(*c))
def test_bad_loss_inputs_are_rejected(ppo, case):
    op, args, kwargs = case
    assert_rejects("PPO-INPUT-4", ppo.raw(op), *args, **kwargs)


@pytest.mark.clause("PPO-INPUT-4")
def test_non_positive_grad_norm_is_rejected(ppo):
    clip_grad_norm = ppo.raw("clip_grad_norm")
    assert_rejects("PPO-INPUT-4", clip_grad_norm, [_param(torch.ones(2))], max_norm=0.0)


# The clip range is the open interval (0, 1): clip_eps = 1 is rejected.
@pytest.mark.clause("PPO-INPUT-4")
@pytest.mark.parametrize("op", ["clip_fraction", "clipped_policy_loss"])
def test_clip_eps_of_one_rejected(ppo, op):

    r = torch.tensor([0.9, 1.1, 1.3], dtype=F64)
    args = (r,) if op == "clip_fraction" else (r, torch.tensor([1.0, -1.0, 0.5], dtype=F64))
    assert_rejects("PPO-INPUT-4", ppo.raw(op), *args, clip_eps=1.0)


# ----------------------------------------------------------------------------- PPO-DTYPE-1
def _ppo_dtype_calls(dtype):
    """One call of every float-returning operation on inputs of ``dtype``, with a reader of its floats."""
    z = torch.tensor([[0.5, -1.0, 2.0], [0.1, 0.2, -0.3]], dtype=dtype)
    mask = torch.tensor([[True, False, True], [True, True, True]])
    act = torch.tensor([2, 1])
    old = torch.tensor([-1.1, -0.4, -2.0], dtype=dtype)
    new = torch.tensor([-1.0, -0.6, -1.5], dtype=dtype)
    r, a = torch.exp(new - old), torch.tensor([1.0, -2.0, 0.5], dtype=dtype)
    one = torch.tensor(0.3, dtype=dtype)
    gen = generator(0)
    return [
        ("masked_logits", (z, mask), {}, lambda o: o),
        ("masked_distribution", (z, mask), {}, lambda o: (o.probs, o.log_prob(on_device(act)), o.entropy())),
        ("sample_actions", (z, mask), dict(generator=gen), lambda o: o[1]),
        ("evaluate_actions", (z, mask, act), {}, lambda o: o),
        ("ratio", (new, old), {}, lambda o: o), ("approx_kl", (old, new), {}, lambda o: o),
        ("k3_kl", (old, new), {}, lambda o: o), ("clip_fraction", (r,), dict(clip_eps=0.2), lambda o: o),
        ("clipped_policy_loss", (r, a), dict(clip_eps=0.2), lambda o: o), ("value_loss", (new, old), {}, lambda o: o),
        ("total_loss", (one, one, new), dict(vf_coef=0.5, ent_coef=0.01), lambda o: o),
        ("entropy_ratio", (new.abs()[:2], mask), {}, lambda o: o), ("normalize_advantages", (a,), {}, lambda o: o),
        ("scale_reward", (a,), dict(scale=2.0), lambda o: o),
        ("local_sample", (z[0], mask[0]), dict(generator=gen), lambda o: o[3]),
        ("local_log_prob", (z[0], torch.tensor([0, 2]), torch.tensor(1)), {}, lambda o: o),
        ("log_ratio_excess", (new, old), {}, lambda o: o), ("ratio_std", (r,), {}, lambda o: o),
    ]


@pytest.mark.clause("PPO-DTYPE-1")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("index", range(18))
def test_outputs_keep_the_input_dtype(ppo, dtype, index):
    op, args, kwargs, floats = _ppo_dtype_calls(dtype)[index]
    assert_dtype(floats(getattr(ppo, op)(*args, **kwargs)), dtype, "PPO-DTYPE-1", op)


# ----------------------------------------------------------------------------- PPO-GRAD-2
@pytest.mark.clause("PPO-GRAD-2")
@given(st_.ratios_and_advantages(), st_.keyword_arguments("ppo.clipped_policy_loss"))
def test_no_gradient_into_advantage_or_returns(ppo, ra, kw):
    """Every input a loss treats as given is a requires-grad leaf here; only the live input may get
    a gradient."""
    r, a = ra
    r_live, adv = grad_leaves(r, a)
    ppo.clipped_policy_loss(r_live, adv, **kw).backward()
    assert_no_grad("PPO-GRAD-2", "advantage", adv)
    values, returns = grad_leaves(a, r)
    ppo.value_loss(values, returns).backward()
    assert_no_grad("PPO-GRAD-2", "returns", returns)
    assert_that(values.grad is not None and bool((values.grad != 0).any()) or bool((a == r).all()), "PPO-GRAD-2",
                values.grad, "a gradient in the values (the live input)")


@pytest.mark.clause("PPO-SLO-4")
@given(st_.logits_and_masks(max_actions=6), st.data())
def test_entropy_ratio_with_zero_choice_rows(ppo, zm, data):
    """Rows with one legal action (no choice: log 1 = 0 in the denominator, zero entropy) are aimed
    at on purpose, up to a batch made only of them (ratio 0, never NaN)."""
    z, mask = zm
    mask = mask.clone()
    for b in data.draw(st.sets(st.integers(0, len(mask) - 1))):  # force some rows down to one legal action
        keep = int(mask[b].nonzero()[0])
        mask[b] = False
        mask[b, keep] = True
    ent = torch.tensor(-np.where(to_numpy(mask), np.exp(_np_lsm(z, mask)) * _np_lsm(z, mask), 0.0).sum(-1))
    den = np.log(to_numpy(mask).sum(-1)).sum()
    expected = to_numpy(ent).sum() / den if den > 0 else 0.0
    assert_close(ppo.entropy_ratio(ent, mask), expected, "PPO-SLO-4")


def _np_lsm(z, mask):
    zz = np.where(to_numpy(mask), to_numpy(z), -np.inf)
    m = zz.max(-1, keepdims=True)
    out = zz - m - np.log(np.exp(zz - m).sum(-1, keepdims=True))
    return np.where(to_numpy(mask), out, 0.0)
