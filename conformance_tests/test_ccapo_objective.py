"""CCAPO §6: PPO-clip surrogate averaged per trajectory, KL penalty to the reference policy."""
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
    assert_no_grad,
    assert_rejects,
    assert_that,
    convention,
    finite_difference,
    grad_leaves,
    host,
    np_approx_kl,
    np_clip_fraction,
    reported,
    supports_dtype,
    to_numpy,
    tolerance,
)
from conformance_tests.oracles import clipped_surrogate_slope, kink_atol, kink_step

F64 = torch.float64


def np_k3(d: float, kl_clamp=None) -> tuple[float, float]:
    """k3 = e^D - D - 1 at D = log pi_ref - log pi_theta, and its derivative in log pi_theta, under the kl_clamp
    convention (default: the declared one): D clamped to [-log_ratio, log_ratio], k3 to at most ``value``;
    a clamped token is a constant of the loss (no KL gradient). The declared clamp is recorded as a deviation
    only where it binds."""
    unclamped = (math.exp(d) - d - 1, 1.0 - math.exp(d))
    kl_clamp = convention("kl_clamp", record=False) if kl_clamp is None else kl_clamp
    if kl_clamp == "none":
        return unclamped
    dc = min(max(d, -kl_clamp["log_ratio"]), kl_clamp["log_ratio"])
    k = math.exp(dc) - dc - 1
    if dc == d and k <= kl_clamp["value"]:
        return unclamped
    convention("kl_clamp")  # the oracle departs from the seed's unclamped k3 on this token
    return (float(kl_clamp["value"]), 0.0) if k > kl_clamp["value"] else (k, 0.0)


# CCAPO-PPO-1 notes: a per-trajectory mean may divide by T + 1e-8 (verl's agg_loss guard) instead of T.
TOKEN_COUNT_GUARD = 1e-8


def np_objective(new, old, ref, adv, mask, clip=0.2, beta=0.04, kl_clamp=None, guard=0.0):
    """Loop oracle: per trajectory (1/(T + guard)) sum over real steps, then the mean over trajectories; the
    KL under the kl_clamp convention (:func:`np_k3`)."""
    surr, kl = [], []
    for b in range(new.shape[0]):
        s = k = 0.0
        T = int(mask[b].sum())
        for t in range(new.shape[1]):
            if not mask[b, t]:
                continue
            rho = math.exp(new[b, t] - old[b, t])
            s += min(rho * adv[b, t], min(max(rho, 1 - clip), 1 + clip) * adv[b, t])
            k += np_k3(ref[b, t] - new[b, t], kl_clamp)[0]
        surr.append(s / (T + guard))
        kl.append(k / (T + guard))
    return float(np.mean(surr)), float(np.mean(kl))


def admitted(got, value_for_guard) -> float:
    """The oracle value (of ``value_for_guard(guard)``) nearest ``got`` among the per-trajectory means the
    CCAPO-PPO-1 notes admit: dividing by T, or by T + 1e-8. The guard moves a trajectory's mean by a relative
    1e-8/T, which a loss that cancels across trajectories cannot absorb in its own relative tolerance."""
    g = float(got)
    return min((value_for_guard(guard) for guard in (0.0, TOKEN_COUNT_GUARD)), key=lambda v: abs(v - g))


@pytest.mark.clause("CCAPO-PPO-1", "CCAPO-PPO-2")
@given(st_.ccapo_logp_batches(), st_.keyword_arguments("ccapo.policy_loss"))
def test_objective_matches_loop_oracle(ccapo, batch, kw):
    new, old, ref, adv, mask = batch
    out = ccapo.policy_loss(new, old, ref, adv, mask, **kw)
    arrays, beta = [to_numpy(x) for x in batch], kw["beta_kl"]
    oracle = lambda guard: np_objective(*arrays, clip=kw["clip_eps"], beta=beta, guard=guard)  # noqa: E731
    assert_close(out["loss"], admitted(out["loss"], lambda g: -(oracle(g)[0] - beta * oracle(g)[1])), "CCAPO-PPO-1",
                 what="loss")
    assert_close(out["loss_clip"], admitted(out["loss_clip"], lambda g: -oracle(g)[0]), "CCAPO-PPO-1",
                 what="loss_clip")
    assert_close(out["kl_ref"], admitted(out["kl_ref"], lambda g: oracle(g)[1]), "CCAPO-PPO-2", what="kl_ref")


@pytest.mark.clause("CCAPO-PPO-1")
def test_objective_golden_per_trajectory_mean(ccapo):
    # ratio 1 everywhere, no KL: trajectory 1 has 1 step (A = 3), trajectory 2 has 3 steps (A = 0, 0, 3)
    # per-trajectory means 3 and 1 -> objective 2 (a token mean over the batch would give 6/4 = 1.5)
    z = torch.zeros(2, 3, dtype=F64)
    adv = torch.tensor([[3.0, 9.0, 9.0], [0.0, 0.0, 3.0]], dtype=F64)
    mask = torch.tensor([[True, False, False], [True, True, True]])
    out = ccapo.policy_loss(z, z, z, adv, mask)
    assert_close(out["loss"], -2.0, "CCAPO-PPO-1")


@pytest.mark.clause("CCAPO-PPO-1")
def test_clip_golden(ccapo):
    # rho = e^0.5 ~ 1.65: A > 0 is clipped to 1.2 A; A < 0 keeps rho A (the pessimistic branch)
    new = torch.tensor([[0.5, 0.5]], dtype=F64)
    z = torch.zeros(1, 2, dtype=F64)
    adv = torch.tensor([[1.0, -1.0]], dtype=F64)
    out = ccapo.policy_loss(new, z, new, adv, torch.ones(1, 2, dtype=torch.bool))
    assert_close(out["loss_clip"], -(1.2 - math.exp(0.5)) / 2, "CCAPO-PPO-1")
    # both steps lie outside the clip range; only the A > 0 one is clipped by min() (clip_fraction convention)
    want = np_clip_fraction(np.exp(to_numpy(new)), 0.2, convention("clip_fraction"), to_numpy(adv))
    assert_close(reported(out, "clip_fraction", "ccapo.policy_loss"), want, "CCAPO-PPO-1", dtype=F64, what="share of steps counted as clipped")


# ----------------------------------------------------------------------------- one fixed batch
# Two trajectories (3 and 2 real steps): ratios inside and outside the clip range, both advantage
# signs, and a reference policy away from the current one, so clip_eps and beta_kl both matter.
NEW = np.array([[-0.2, -1.4, -0.9], [-0.5, -2.0, 0.0]])
OLD = np.array([[-0.6, -1.0, -0.95], [-0.1, -2.1, 0.0]])
REF = np.array([[-0.4, -1.1, -1.3], [-0.8, -1.7, 0.0]])
ADV = np.array([[1.5, -0.7, 2.0], [-1.2, 0.8, 0.0]])
MASK = np.array([[True, True, True], [True, True, False]])


def _call(ccapo, **kw):
    t = [torch.tensor(a, dtype=F64) for a in (NEW, OLD, REF, ADV)]
    return ccapo.policy_loss(*t, torch.tensor(MASK), **kw)


# A multi-token action's log-probability is a sum over its tokens: around −800 e^logp underflows to 0 in float64,
# so ρ must come from the difference of the log-probs (exp(new − old)), never exp(new)/exp(old) = 0/0.
@pytest.mark.clause("CCAPO-PPO-1", "CCAPO-PPO-2")
@pytest.mark.parametrize("shift", [-800.0, -5000.0])
def test_objective_of_long_action_log_probs(ccapo, shift):
    surr, _ = np_objective(NEW + shift, OLD + shift, REF + shift, ADV, MASK, clip=0.2, beta=0.04)
    t = [torch.tensor(a, dtype=F64) for a in (NEW + shift, OLD + shift, REF + shift, ADV)]
    out = ccapo.policy_loss(*t, torch.tensor(MASK), clip_eps=0.2, beta_kl=0.04)
    assert_close(out["loss_clip"], admitted(out["loss_clip"], lambda g: -surr), "CCAPO-PPO-1",
                 what=f"loss_clip with every log-prob shifted by {shift}")
    # the KL's aggregation is checked elsewhere; here the total only has to stay a number
    assert_that(bool(torch.isfinite(host(out["loss"]))), "CCAPO-PPO-1", out["loss"], "a finite loss")


# Called without clip_eps and beta_kl: the keyword defaults must be the spec's (every other test passes them).
@pytest.mark.clause("CCAPO-DEFAULT-4", "CCAPO-PPO-1", "CCAPO-PPO-2")
def test_policy_loss_defaults_are_the_spec_clip_and_kl_weight(ccapo):
    spec = default_spec().clause("CCAPO-DEFAULT-4").value
    clip, beta = float(spec["clip_eps"]), float(spec["beta_kl"])
    surr, kl = np_objective(NEW, OLD, REF, ADV, MASK, clip=clip, beta=beta)
    out = _call(ccapo)
    assert_close(out["loss"], -(surr - beta * kl), "CCAPO-PPO-1", what="loss with clip_eps and beta_kl at their defaults")
    assert_close(out["loss_clip"], -surr, "CCAPO-PPO-1", what="loss_clip with clip_eps at its default")


# Each reported term on its own: a loss_kl with the wrong weight could hide behind a right total.
@pytest.mark.clause("CCAPO-PPO-2")
@pytest.mark.parametrize("beta", [0.0, 0.04, 0.7])
def test_loss_kl_is_the_weighted_kl_and_completes_the_loss(ccapo, beta):
    surr, kl = np_objective(NEW, OLD, REF, ADV, MASK, clip=0.2, beta=beta)
    out = _call(ccapo, clip_eps=0.2, beta_kl=beta)
    assert_close(out["loss_kl"], beta * kl, "CCAPO-PPO-2", what="loss_kl = beta_KL * KL")
    assert_close(out["loss"], -surr + beta * kl, "CCAPO-PPO-2", what="loss = loss_clip + loss_kl")


# A trajectory with no real step (a padding row) is not one of the trajectories averaged over: its (1/T)
# sum is undefined, so it must leave the average untouched.
@pytest.mark.clause("CCAPO-PPO-1", "CCAPO-PPO-2")
@pytest.mark.parametrize("where", [0, 1, 2])
def test_padding_rows_leave_the_trajectory_mean_unchanged(ccapo, where):
    surr, kl = np_objective(NEW, OLD, REF, ADV, MASK, clip=0.2, beta=0.04)
    pad = lambda a, fill: np.insert(a, where, fill, axis=0)  # noqa: E731 - one padding row at `where`
    t = [torch.tensor(pad(a, -0.3), dtype=F64) for a in (NEW, OLD, REF, ADV)]
    out = ccapo.policy_loss(*t, torch.tensor(pad(MASK, False)), clip_eps=0.2, beta_kl=0.04)
    assert_close(out["loss"], -(surr - 0.04 * kl), "CCAPO-PPO-1", what="loss with an all-padding trajectory added")
    assert_close(out["kl_ref"], kl, "CCAPO-PPO-2", what="kl_ref with an all-padding trajectory added")


# A batch with no real step at all has no defined value (0/0, or the sum of the padding). It must be
# rejected or give exactly 0, never NaN or a number the padding made.
@pytest.mark.clause("CCAPO-PPO-1", "CCAPO-PPO-2")
def test_all_padding_batch_gives_zero_or_is_rejected(ccapo):
    t = [torch.tensor(a, dtype=F64) for a in (NEW, OLD, REF, ADV)]
    try:
        out = ccapo.policy_loss(*t, torch.zeros(MASK.shape, dtype=torch.bool))
    except Exception:  # noqa: BLE001 - rejecting an empty batch is allowed
        return
    for key in ("loss", "loss_clip", "kl_ref"):
        assert_close(out[key], 0.0, "CCAPO-PPO-1", dtype=F64, what=f"{key} of a batch with no real step")


# The estimator-free core of the approx_kl and clip_fraction conventions (spec/conventions.yaml): both are
# exactly 0 when every ratio is 1, which a diagnostic of a shifted ratio (r + 1, r - 2) is not.
# One test per diagnostic: a library that does not report one (TRL has no approx_kl) is not applicable for
# that check only.
@pytest.mark.clause("CCAPO-PPO-1")
@pytest.mark.parametrize("key", ["approx_kl", "clip_fraction"])
def test_diagnostics_are_zero_when_every_ratio_is_one(ccapo, key):
    t = [torch.tensor(a, dtype=F64) for a in (NEW, NEW, REF, ADV)]  # logp_old = logp_new
    out = ccapo.policy_loss(*t, torch.tensor(MASK), clip_eps=0.2, beta_kl=0.04)
    assert_close(reported(out, key, "ccapo.policy_loss"), 0.0, "CCAPO-PPO-1", dtype=F64,
                 what=f"{key} with every ratio 1")


# Past the zero core, without choosing between the two estimators the convention allows: on a batch whose
# actions occur in exactly the old policy's proportions, k1 (mean of -log r) is KL(old||new) by definition,
# and so is k3 (mean of (r - 1) - log r), whose extra term sums pi_new - pi_old over the actions, i.e. 0.
# A sign-flipped or shifted estimator is not (k3 with + log r gives -KL), nor k2 (mean of (log r)^2 / 2).
# Every trajectory has the same length and the same proportions, so the per-trajectory and the flat
# mean agree too.
@pytest.mark.clause("CCAPO-PPO-1")
@given(st.lists(st.tuples(st.integers(1, 9), st.floats(0.05, 0.95)), min_size=1, max_size=4))
def test_approx_kl_is_the_exact_kl_on_a_batch_in_the_old_policys_proportions(ccapo, policies):
    T = 10
    old, new, kls = [], [], []
    for k, q in policies:  # two actions: pi_old = (k/T, 1 - k/T), pi_new = (q, 1 - q); k of the T steps take the first
        p = k / T
        old.append([math.log(p)] * k + [math.log1p(-p)] * (T - k))
        new.append([math.log(q)] * k + [math.log1p(-q)] * (T - k))
        kls.append(p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q)))
    old_t, new_t = torch.tensor(old, dtype=F64), torch.tensor(new, dtype=F64)
    out = ccapo.policy_loss(new_t, old_t, new_t, torch.ones_like(new_t), torch.ones(old_t.shape, dtype=torch.bool),
                            clip_eps=0.2, beta_kl=0.04)
    assert_close(reported(out, "approx_kl", "ccapo.policy_loss"), float(np.mean(kls)), "CCAPO-PPO-1", dtype=F64,
                 what="approx_kl where the batch holds the old policy's proportions exactly (KL(old||new))")


# The diagnostics are over real steps: padded steps hold ratios that would move both (far outside the clip
# range). Each trajectory has the same real steps, one ratio inside the range and one outside, so a flat
# mean over real steps and a per-trajectory mean agree, under either estimator and either clip convention.
@pytest.mark.clause("CCAPO-PPO-1")
@pytest.mark.parametrize("key", ["approx_kl", "clip_fraction"])
def test_diagnostics_leave_the_padded_steps_out(ccapo, key):
    real = [math.log(1.05), math.log(1.6)]  # log-ratios: inside and outside [0.8, 1.2]
    new = torch.tensor([real + [math.log(3.0), math.log(0.2)], real + [math.log(4.0), math.log(2.5)]], dtype=F64)
    old = torch.zeros_like(new)
    adv = torch.ones_like(new)  # A > 0: the outside ratio is clipped by min() too (both clip conventions)
    mask = torch.tensor([[True, True, False, False]] * 2)
    out = ccapo.policy_loss(new, old, new, adv, mask, clip_eps=0.2, beta_kl=0.04)
    nr, orr, got = np.array(real), np.zeros(2), reported(out, key, "ccapo.policy_loss")
    if key == "approx_kl":  # the output allows k1 or k3: the one nearer the reported value is compared
        want = min((np_approx_kl(orr, nr, est) for est in ("k1", "k3")), key=lambda w: abs(w - float(host(got))))
    else:
        want = np_clip_fraction(np.exp(nr), 0.2, convention("clip_fraction"), np.ones(2))
    assert_close(got, want, "CCAPO-PPO-1", dtype=F64,
                 what=f"{key} over the real steps only (padding holds ratios 3, 0.2, 4, 2.5)")


# A ratio exactly on the edge of [1 - eps, 1 + eps] is inside it: clipped means |r - 1| > eps, strictly.
@pytest.mark.clause("CCAPO-PPO-1")
@pytest.mark.parametrize("log_ratio", [np.log(1.3), np.log(0.75)])
def test_ratio_exactly_on_the_clip_edge_is_not_clipped(ccapo, log_ratio):
    new = torch.full((1, 2), float(log_ratio), dtype=F64)
    old = torch.zeros(1, 2, dtype=F64)
    # eps is chosen so that |exp(new - old) - 1| equals it exactly in float64 (r - 1 is exact for r in [0.5, 2])
    eps = abs(float(torch.exp(new - old)[0, 0]) - 1.0)
    out = ccapo.policy_loss(new, old, new, torch.tensor([[1.0, -1.0]], dtype=F64), torch.ones(1, 2, dtype=torch.bool),
                            clip_eps=eps)
    assert_close(reported(out, "clip_fraction", "ccapo.policy_loss"), 0.0, "CCAPO-PPO-1", dtype=F64,
                 what="clip_fraction with |r - 1| = eps exactly")


# ----------------------------------------------------------------------------- gradient, off and at the kinks
# The clipped surrogate has kinks at rho = 1 - eps and rho = 1 + eps. Off them the loss is smooth and
# autograd must match finite differences; at them the two one-sided derivatives differ and are checked
# as such. Points are placed by construction, never filtered.
KINK_GAP, KINK_SPAN = 0.02, 0.5  # log-ratio distance kept from a kink (>> the 1e-6 step), and range beyond it


def _kinks(eps: float) -> tuple[float, float]:
    return math.log1p(-eps), math.log1p(eps)


@st.composite
def kink_free_log_ratios(draw, shape, eps: float) -> np.ndarray:
    """log rho per element, each in one of the three smooth pieces (below, inside, above the clip range)
    and at least ``gap`` from both kinks; the gap shrinks for a narrow clip range so 'inside' is never empty."""
    lo, hi = _kinks(eps)
    gap = min(KINK_GAP, (hi - lo) / 4)
    pieces = [(lo - KINK_SPAN, lo - gap), (lo + gap, hi - gap), (hi + gap, hi + KINK_SPAN)]
    n = int(np.prod(shape))
    which = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    at = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
    return np.array([pieces[k][0] + u * (pieces[k][1] - pieces[k][0]) for k, u in zip(which, at)]).reshape(shape)


def np_loss_slope(new, old, ref, adv, mask, b, t, *, clip, beta, side=0, surrogate=None) -> float:
    """Closed-form d loss / d logp_new[b, t] (one-sided at a kink): -(1/B)(1/T_b)[surrogate' - beta k3'],
    surrogate' = rho d/drho min(rho A, clip(rho) A), or rho ``surrogate`` where given."""
    n_traj, steps = int((mask.sum(1) > 0).sum()), int(mask[b].sum())
    rho = math.exp(new[b, t] - old[b, t])
    dk3 = np_k3(ref[b, t] - new[b, t])[1]  # d/dnew of e^(ref-new) - (ref-new) - 1 (0 where clamped)
    slope = (clipped_surrogate_slope(rho, adv[b, t], clip, side, atol=kink_atol(np.finfo(new.dtype).eps))
             if surrogate is None else surrogate)
    return -(rho * slope - beta * dk3) / (n_traj * steps)


@pytest.mark.clause("CCAPO-PPO-1", "CCAPO-PPO-2")
@given(st_.ccapo_logp_batches(max_b=2, max_t=3), st_.keyword_arguments("ccapo.policy_loss"), st.data())
def test_gradient_matches_finite_differences(ccapo, batch, kw, data):
    """Away from the kinks by construction: autograd = central finite differences = the closed form."""
    _, old, ref, adv, mask = batch
    new = old + torch.tensor(data.draw(kink_free_log_ratios(tuple(old.shape), kw["clip_eps"])), dtype=old.dtype)
    x = new.clone().requires_grad_(True)
    ccapo.policy_loss(x, old, ref, adv, mask, **kw)["loss"].backward()
    fd = finite_difference(lambda v: ccapo.policy_loss(v, old, ref, adv, mask, **kw)["loss"], new)
    assert_close(x.grad, to_numpy(fd), "CCAPO-PPO-2", what="d loss / d logp_new against finite differences")
    arrays = [to_numpy(v) for v in (new, old, ref, adv, mask)]
    closed = np.array([[np_loss_slope(*arrays, b, t, clip=kw["clip_eps"], beta=kw["beta_kl"]) if mask[b, t] else 0.0
                        for t in range(new.shape[1])] for b in range(new.shape[0])])
    assert_close(x.grad, closed, "CCAPO-PPO-2", what="d loss / d logp_new against the closed form")


@pytest.mark.clause("CCAPO-PPO-1", "CCAPO-PPO-2")
@given(st_.ccapo_logp_batches(max_b=2, max_t=3), st_.keyword_arguments("ccapo.policy_loss"), st.data())
def test_one_sided_derivatives_at_the_clip_kinks(ccapo, batch, kw, data):
    """One step sits on a kink (log rho = log(1 -/+ eps)) with A != 0: the left and right derivatives of the
    loss are the closed-form ones of the two pieces that meet there (at the kink where the minimum switches
    pieces, one of them drops the surrogate), and autograd returns a value between the slopes with and
    without the surrogate: a one-sided derivative or a mix. Where the minimum does not switch, left = right,
    yet rho rounds to within an ulp of 1 -/+ eps and rho A can tie (1 -/+ eps) A in floating point; an
    elementwise minimum may then split the gradient of the tie, which this allows."""
    _, old, ref, adv, mask = batch
    eps, beta = kw["clip_eps"], kw["beta_kl"]
    new = old + torch.tensor(data.draw(kink_free_log_ratios(tuple(old.shape), eps)), dtype=old.dtype)
    b = data.draw(st.integers(0, old.shape[0] - 1), label="row")
    t = data.draw(st.integers(0, int(mask[b].sum()) - 1), label="real step")
    kink = data.draw(st.sampled_from(_kinks(eps)), label="kink")
    adv = adv.clone()
    adv[b, t] = data.draw(st.sampled_from([-1.0, 1.0])) * data.draw(st.floats(0.1, 3.0), label="|A|")
    new[b, t] = old[b, t] + kink
    loss = lambda v: ccapo.policy_loss(v, old, ref, adv, mask, **kw)["loss"]  # noqa: E731
    arrays = [to_numpy(v) for v in (new, old, ref, adv, mask)]

    def slope_at(v: torch.Tensor) -> float:
        x = v.clone().requires_grad_(True)
        loss(x).backward()
        return float(x.grad[b, t])

    # each one-sided derivative is the slope of its piece: autograd a step inside it (no finite difference, so a
    # library computing in float32 is not failed for its rounding); log-ratios are rounded at the log-probs' size
    step = kink_step(eps, abs(float(new[b, t])), torch.finfo(new.dtype).eps)
    for side in (-1, 1) if step else ():
        y = new.clone()
        y[b, t] += side * step
        want = np_loss_slope(to_numpy(y), *arrays[1:], b, t, clip=eps, beta=beta)
        assert_close(slope_at(y), want, "CCAPO-PPO-1", approx="gradient",
                     what=f"{'left' if side < 0 else 'right'} derivative")
    x = new.clone().requires_grad_(True)
    loss(x).backward()
    with_, without = (np_loss_slope(*arrays, b, t, clip=eps, beta=beta, surrogate=s) for s in (float(adv[b, t]), 0.0))
    rtol, atol = tolerance("CCAPO-PPO-2", old.dtype, approx="gradient")
    g, slack = float(x.grad[b, t]), atol + rtol * max(abs(with_), abs(without))
    assert_that(min(with_, without) - slack <= g <= max(with_, without) + slack, "CCAPO-PPO-2", g,
                f"an autograd value between {with_} and {without}, the slopes with and without the surrogate")


@pytest.mark.clause("CCAPO-PPO-2")
@given(st_.ccapo_logp_batches())
def test_kl_is_non_negative_and_zero_at_reference(ccapo, batch):
    new, old, ref, adv, mask = batch
    out = ccapo.policy_loss(new, old, ref, adv, mask)
    assert_that(out["kl_ref"] >= 0, "CCAPO-PPO-2", out["kl_ref"], "KL >= 0")
    same = ccapo.policy_loss(new, old, new.clone(), adv, mask)
    assert_close(same["kl_ref"], 0.0, "CCAPO-PPO-2", what="KL at pi_theta = pi_ref")


@pytest.mark.clause("CCAPO-PPO-2")
def test_no_gradient_into_constants(ccapo):
    new = torch.tensor([[-0.7, -1.1]], dtype=F64, requires_grad=True)
    old = torch.tensor([[-0.9, -1.0]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[-0.5, -1.3]], dtype=F64, requires_grad=True)
    adv = torch.tensor([[1.0, -2.0]], dtype=F64, requires_grad=True)
    ccapo.policy_loss(new, old, ref, adv, torch.ones(1, 2, dtype=torch.bool))["loss"].backward()
    for name, t in (("logp_old", old), ("logp_ref", ref), ("advantages", adv)):
        assert_that(t.grad is None or bool((t.grad == 0).all()), "CCAPO-PPO-2", t.grad, f"no gradient into {name}")
    assert_that(new.grad is not None and bool((new.grad != 0).any()), "CCAPO-PPO-2", new.grad, "gradient into logp_new")


@pytest.mark.clause("CCAPO-INPUT-1")
def test_nan_log_probs_rejected(ccapo):
    z = torch.zeros(1, 2, dtype=F64)
    bad = torch.tensor([[0.0, float("nan")]], dtype=F64)
    assert_rejects("CCAPO-INPUT-1", ccapo.raw("policy_loss"), bad, z, z, z, torch.ones(1, 2, dtype=torch.bool))


@pytest.mark.clause("CCAPO-INPUT-3")
def test_objective_shape_mismatch_rejected(ccapo):
    z = torch.zeros(1, 2, dtype=F64)
    assert_rejects("CCAPO-INPUT-3", ccapo.raw("policy_loss"), z, z, z, torch.zeros(1, 3, dtype=F64),
                   torch.ones(1, 2, dtype=torch.bool))


@pytest.mark.clause("CCAPO-INPUT-5")
def test_bad_clip_rejected(ccapo):
    z = torch.zeros(1, 2, dtype=F64)
    assert_rejects("CCAPO-INPUT-5", ccapo.raw("policy_loss"), z, z, z, z, torch.ones(1, 2, dtype=torch.bool),
                   clip_eps=0.0)


# The clip range is open at the top: clip_eps >= 1 is rejected.
@pytest.mark.clause("CCAPO-INPUT-5")
@pytest.mark.parametrize("clip_eps", [1.0, 1.5])
def test_clip_eps_of_one_or_more_rejected(ccapo, clip_eps):

    t = [torch.tensor(a, dtype=F64) for a in (NEW, OLD, REF, ADV)]
    assert_rejects("CCAPO-INPUT-5", ccapo.raw("policy_loss"), *t, torch.tensor(MASK), clip_eps=clip_eps)


# ----------------------------------------------------------------------------- gradient isolation
@pytest.mark.clause("CCAPO-PPO-1", "CCAPO-PPO-2")
@given(st_.ccapo_logp_batches(), st_.keyword_arguments("ccapo.policy_loss"))
def test_gradient_reaches_logp_new_only(ccapo, batch, kw):
    """logp_old, logp_ref and the advantages (built from STDB scores and group statistics) are
    requires-grad leaves: the loss must treat every one of them as a constant."""
    new, old, ref, adv, mask = batch
    new, old, ref, adv = grad_leaves(new, old, ref, adv)
    out = ccapo.policy_loss(new, old, ref, adv, mask, **kw)
    out["loss"].backward()
    assert_no_grad("CCAPO-PPO-1", "logp_old", old)
    assert_no_grad("CCAPO-PPO-2", "logp_ref (the KL's reference)", ref)
    assert_no_grad("CCAPO-PPO-1", "advantages", adv)


# ----------------------------------------------------------------------------- CCAPO-DTYPE-1
def _ccapo_dtype_calls(dtype):
    """One call of every operation that computes floats from floating inputs of ``dtype``."""
    t = lambda *v: torch.tensor(v, dtype=dtype)  # noqa: E731
    q, seen = t(0.2, 0.7, 0.5), torch.tensor([True, False, True])
    new, old, ref, adv = (x.to(dtype) for x in (torch.tensor([[-0.5, -1.0]]), torch.tensor([[-0.6, -0.9]]),
                                                torch.tensor([[-0.4, -1.2]]), torch.tensor([[1.0, -0.5]])))
    return [
        ("importance", (t(1.0, 3.0), t(2.0, 5.0)), {}), ("criticality", (t(1.0, 3.0), t(2.0, 5.0), 4.0, 10.0), {}),
        ("distance_decay", (t(0.0, 3.0),), {}), ("q_stdb", (t(0.5, 0.6), t(1.2, 0.8), t(1.0, 0.5)), {}),
        ("micro_reward", (q, seen, torch.tensor([False, False, True])), {}),
        ("macro_advantage", (t(9.5, 9.0, -0.5, -0.3),), {}), ("micro_raw_advantage", (q, t(0.1, 0.2, 0.3), seen), {}),
        ("micro_advantage", (t(0.3, -0.2, 0.5, 0.0),), {}), ("fuse_advantages", (t(1.0), t(0.5, -0.5).view(1, 2)), {}),
        ("policy_loss", (new, old, ref, adv, torch.ones(1, 2, dtype=torch.bool)), {}),
    ]


@pytest.mark.clause("CCAPO-DTYPE-1")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("index", range(10))
def test_outputs_keep_the_input_dtype(ccapo, dtype, index):
    op, args, kwargs = _ccapo_dtype_calls(dtype)[index]
    assert_dtype(getattr(ccapo, op)(*args, **kwargs), dtype, "CCAPO-DTYPE-1", op)


def _ccapo_integer_calls():
    """One call of every operation whose inputs the contract allows as integers (counts, step counts, distances),
    with its value worked by hand; scores, returns and advantages are floating."""
    i, eps = (lambda *v: torch.tensor(v)), 1e-8  # noqa: E731 - int64
    crit = [(k / (n + eps)) / (4 / (10 + eps) + eps) for k, n in ((1, 2), (3, 5))]  # rate over the global rate
    return [("importance", (i(1, 3), i(2, 5)), {}, [2 / 4, 4 / 7]),  # Beta(1, 1): (N_succ + 1) / (N_total + 2)
            ("criticality", (i(1, 3), i(2, 5), 4, 10), {}, crit),
            ("distance_decay", (i(0, 3),), {}, [1.0, 0.5]),  # (1 + d)^-0.5
            ("macro_return", (torch.tensor([True, False]), i(3, 5)), {}, [10.0 - 0.3, -0.5])]  # 10·1[success] − 0.1·T


@pytest.mark.clause("CCAPO-DTYPE-1")
@pytest.mark.parametrize("index", range(4))
def test_integer_inputs_give_floating_results(ccapo, index):
    # integer counts must not keep an integer result (9.7 truncated to 9): the result is floating, float64 (the
    # clause's answer) or, from a library that declares no float64, a dtype it declares (torch's default float32
    # for one that trains in it), with the hand-worked values at that dtype's tolerance
    op, args, kwargs, want = _ccapo_integer_calls()[index]
    got = getattr(ccapo, op)(*args, **kwargs)
    allowed = isinstance(got, torch.Tensor) and (got.dtype == torch.float64 or (
        got.is_floating_point() and not supports_dtype(torch.float64) and supports_dtype(got.dtype)))
    assert_that(allowed, "CCAPO-DTYPE-1", getattr(got, "dtype", type(got)),
                f"a float64 {op}, or one in a declared dtype when float64 is not declared")
    assert_close(got, want, "CCAPO-DTYPE-1", dtype=got.dtype, what=f"{op} of integer inputs")
