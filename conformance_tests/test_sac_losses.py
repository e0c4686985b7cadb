"""SAC §6/§7: critic, policy (A and B), temperature, CQL and BC losses."""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from rlconform.spec import default_spec
from scipy.special import logsumexp

from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_close,
    assert_dtype,
    assert_equal,
    assert_no_grad,
    assert_no_grad_into,
    assert_rejects,
    assert_that,
    capability,
    clause_ids_in,
    convention,
    critic_delta,
    finite_difference,
    grad_leaves,
    grad_of,
    host,
    not_applicable,
    np_critic_penalty,
    on_device,
    pin,
    pin_value,
    prob_floor,
    require_differentiable,
    slack,
    temperature_loss_scale,
    to_numpy,
    working_dtype,
)
from conformance_tests.oracles import info_nce as np_info_nce
from conformance_tests.oracles import torch_masked_probs
from conformance_tests.oracles import masked_softmax, np_, top_p_bounds
from conformance_tests.test_sac_backup import ILLEGAL_MASS_LEGAL, ILLEGAL_MASS_PROBS, ILLEGAL_MASS_Q

EPS = 1e-8
F64 = torch.float64


def spec_default(clause: str, key: str) -> float:
    """A default's value as the spec states it (never the implementation's own table)."""
    return float(default_spec().clause(clause).value[key])


def _probs_from_logits(z, mask):
    return torch_masked_probs(z, mask, EPS)


def _np_policy_loss(p, qmin, support, alpha):
    return float(np.mean([sum(p[b, a] * (alpha * math.log(p[b, a]) - qmin[b, a])
                              for a in range(p.shape[1]) if support[b, a]) for b in range(p.shape[0])]))


# ----------------------------------------------------------------------------- critic
@pytest.mark.clause("SAC-CRITIC-1")
@given(st.integers(1, 32).flatmap(lambda n: st.tuples(*(st_.tensors((n,), lo=-5, hi=5) for _ in range(3)))),
       st_.keyword_arguments("sac.critic_loss"))
def test_critic_loss_is_mean_of_summed_huber(sac, case, kw):
    q1, q2, y = case
    delta, conv = kw["delta"], convention("huber_delta")  # the strategy pins δ = 1 unless any δ is supported
    got = sac.critic_loss(q1, q2, y, **kw)
    expected = np.mean(np_critic_penalty(np_(q1) - np_(y), delta, conv) + np_critic_penalty(np_(q2) - np_(y), delta, conv))
    assert_close(got, expected, "SAC-CRITIC-1")


@pytest.mark.clause("SAC-CRITIC-1")
def test_critic_loss_golden_and_no_gradient_into_target(sac):
    # errors 0.5 (quadratic: 0.125) and 3 (linear: 2.5) for critic 1; 0 and -2 (1.5) for critic 2
    q1 = torch.tensor([1.5, 4.0], dtype=torch.float64, requires_grad=True)
    q2 = torch.tensor([1.0, -1.0], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1.0, 1.0], dtype=torch.float64, requires_grad=True)
    loss = sac.critic_loss(q1, q2, y)
    mse = convention("huber_delta") == "mse"  # squared errors 0.25, 9, 0, 4; dL/dq1 = 2 err / B
    assert_close(loss, (0.25 + 9.0 + 0.0 + 4.0) / 2 if mse else (0.125 + 2.5 + 0.0 + 1.5) / 2, "SAC-CRITIC-1")
    loss.backward()
    assert_that(y.grad is None or bool((y.grad == 0).all()), "SAC-CRITIC-1", y.grad, "no gradient into the target y")
    assert_close(q1.grad, [0.5, 3.0] if mse else [0.25, 0.5], "SAC-CRITIC-1", what="dL/dq1 = clip(err, ±1)/B")


# A shape error names a clause of the spec exactly: the input clause or the loss's own, as a whole token
# (a mangled label "XXSAC-CRITIC-1XX" names none), and every id-like token it holds is a clause of the spec.
# A bad-input check: filed under the input clause (SHOULD), not under the loss's MUST formula.
@pytest.mark.clause("SAC-INPUT-2")
def test_critic_loss_shape_error_names_a_known_clause_exactly(sac):
    z = torch.zeros(3, dtype=F64)
    raised = assert_rejects(("SAC-INPUT-2", "SAC-CRITIC-1"), sac.raw("critic_loss"), z, z, torch.zeros(4, dtype=F64))
    if capability("errors_name_clauses", False):
        named, known = clause_ids_in(str(raised)), default_spec().clauses
        assert_that(all(c in known for c in named), "SAC-INPUT-2", str(raised), "every clause id it names in the spec")


# ----------------------------------------------------------------------------- policy loss A
@st.composite
def policy_cases(draw, max_actions=8):
    z, mask = draw(st_.logits_and_masks(scale=5.0, max_actions=max_actions))
    q1 = draw(st_.q_values(tuple(z.shape), scale=5.0))
    q2 = draw(st_.q_values(tuple(z.shape), scale=5.0))
    return z, mask, q1, q2, draw(st.floats(0.01, 2.0))


@pytest.mark.clause("SAC-POL-1")
@given(policy_cases())
def test_policy_loss_matches_loop(sac, case):
    z, mask, q1, q2, alpha = case
    p = _probs_from_logits(z, mask)
    got = sac.policy_loss(p, q1, q2, mask, alpha=alpha)
    assert_close(got, _np_policy_loss(np_(p), np.minimum(np_(q1), np_(q2)), np_(mask), alpha), "SAC-POL-1")


@pytest.mark.clause("SAC-POL-1")
@given(policy_cases(max_actions=5))
def test_policy_loss_gradient_matches_finite_differences(sac, case):
    z, mask, q1, q2, alpha = case
    z = z.clone().requires_grad_(True)
    q1 = q1.clone().requires_grad_(True)
    sac.policy_loss(_probs_from_logits(z, mask), q1, q2, mask, alpha=alpha).backward()
    mn, qmin = np_(mask), np.minimum(np_(q1), np_(q2))

    def np_loss(zz):
        p = np.maximum(masked_softmax(np_(zz), mn), EPS)
        return _np_policy_loss(p, qmin, mn, alpha)

    assert_close(z.grad, finite_difference(np_loss, z), "SAC-POL-1", what="dL/dz vs finite differences",
                 approx="gradient")
    assert_that(q1.grad is None or bool((q1.grad == 0).all()), "SAC-POL-1", q1.grad, "no gradient into Q")


@pytest.mark.clause("SAC-POL-1")
def test_policy_loss_golden(sac):
    # one state, π = (0.25, 0.75) legal + an illegal ε entry, min Q = (1, 0), α = 0.2
    p = torch.tensor([[0.25, 0.75, EPS]], dtype=torch.float64)
    q = torch.tensor([[1.0, 0.0, 50.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    expected = 0.25 * (0.2 * math.log(0.25) - 1) + 0.75 * (0.2 * math.log(0.75))
    assert_close(sac.policy_loss(p, q, q + 1, mask, alpha=0.2), expected, "SAC-POL-1")


# ----------------------------------------------------------------------------- policy loss B
@pytest.mark.clause("SAC-POL-2")
def test_top_p_policy_loss_golden_and_gradient(sac):
    z = torch.log(torch.tensor([[0.1, 0.6, 0.05, 0.25]], dtype=torch.float64)).requires_grad_(True)
    mask = torch.ones(1, 4, dtype=torch.bool)
    q = torch.tensor([[9.0, 1.0, 9.0, 2.0]], dtype=torch.float64)
    loss = sac.policy_loss_top_p(torch.softmax(z, -1), q, q + 1, mask, alpha=0.5, p=0.8)
    a, b = 12 / 17, 5 / 17  # π_p over the kept {0.6, 0.25}
    assert_close(loss, a * (0.5 * math.log(a) - 1) + b * (0.5 * math.log(b) - 2), "SAC-POL-2")
    loss.backward()
    # the loss depends on the logits of the kept actions only through π_p = softmax over {1, 3}
    def np_loss(zz):
        w = np.exp(np_(zz)[0, [1, 3]])
        pp = w / w.sum()
        return float(pp[0] * (0.5 * math.log(pp[0]) - 1) + pp[1] * (0.5 * math.log(pp[1]) - 2))

    assert_close(z.grad, finite_difference(np_loss, z), "SAC-POL-2", what="gradient through π_p (selection fixed)",
                 approx="gradient")


@pytest.mark.clause("SAC-POL-2")
@given(policy_cases(), st.floats(0.3, 0.95))
def test_top_p_policy_loss_at_p_one_equals_option_a_on_renormalised_policy(sac, case, _p):
    z, mask, q1, q2, alpha = case
    p = _probs_from_logits(z, mask)
    got = sac.policy_loss_top_p(p, q1, q2, mask, alpha=alpha, p=1.0)
    pn, mn = np_(p), np_(mask)
    renorm = np.where(mn, pn / np.where(mn, pn, 0).sum(-1, keepdims=True), 1.0)
    assert_close(got, _np_policy_loss(renorm, np.minimum(np_(q1), np_(q2)), mn, alpha), "SAC-POL-2")


@pytest.mark.clause("SAC-POL-2")
def test_top_p_policy_loss_ignores_illegal_mass(sac):
    # the rows of test_sac_backup's illegal-mass case: p = 0.2 keeps {2} and {1}, π_p = 1 there, L = −mean min Q
    probs, q = torch.tensor(ILLEGAL_MASS_PROBS, dtype=F64), torch.tensor(ILLEGAL_MASS_Q, dtype=F64)
    got = sac.policy_loss_top_p(probs, q, q + 0.5, torch.tensor(ILLEGAL_MASS_LEGAL), alpha=0.4, p=0.2)
    assert_close(got, -(2.0 - 1.5) / 2, "SAC-POL-2", what="Top-p sets chosen on the legal mass only")


# ----------------------------------------------------------------------------- temperature
def _after_update(log_alpha: float) -> float:
    """log alpha as temperature_update returns it under the alpha_clamp convention: clamped to
    [log 1e-4, log 2] after the step (the seed), or left as it is ("on_read" clamps where alpha is used)."""
    if convention("alpha_clamp") != "after_step":
        return log_alpha
    return min(max(log_alpha, math.log(1e-4)), math.log(2.0))


@st.composite
def entropy_batches(draw):
    n = draw(st.integers(1, 16))
    h = draw(st_.tensors((n,), lo=0.0, hi=8.0))
    ht = draw(st_.tensors((n,), lo=0.0, hi=8.0))
    return h, ht


@pytest.mark.clause("SAC-TEMP-1")
@given(entropy_batches(), st.floats(-3.0, 0.5), st.floats(1e-5, 1e-2))
def test_temperature_moves_with_the_entropy_deficit(sac, hb, log_alpha, lr):
    h, ht = hb
    la = torch.tensor(log_alpha, dtype=h.dtype)  # log α in the entropies' dtype: one working dtype per call
    got = sac.temperature_update(la, h, ht, lr=lr)
    deficit = float(np.mean(np_(ht) - np_(h)))
    assert_close(got, _after_update(float(la) + lr * deficit), "SAC-TEMP-1")


@pytest.mark.clause("SAC-TEMP-1")
def test_entropy_deficit_raises_alpha_golden(sac):
    la = torch.tensor(math.log(0.1), dtype=torch.float64)
    low_h = torch.tensor([0.5, 1.5], dtype=torch.float64)  # mean H = 1.0 < H_tgt = 2.0
    tgt = torch.tensor([2.0, 2.0], dtype=torch.float64)
    up = sac.temperature_update(la, low_h, tgt, lr=0.01)
    assert_close(up, math.log(0.1) + 0.01, "SAC-TEMP-1")
    down = sac.temperature_update(la, tgt + 1.0, tgt, lr=0.01)  # entropy surplus lowers α
    assert_close(down, math.log(0.1) - 0.01, "SAC-TEMP-1")


@pytest.mark.clause("SAC-TEMP-2")
@given(entropy_batches(), st.floats(-5.0, 0.5))
def test_temperature_loss_gradient_is_mean_entropy_excess(sac, hb, log_alpha):
    h, ht = hb
    la = torch.tensor(log_alpha, dtype=h.dtype, requires_grad=True)  # one working dtype per call
    sac.temperature_loss(la, h, ht).backward()
    assert_close(la.grad, temperature_loss_scale(float(la.detach())) * float(np.mean(np_(h) - np_(ht))), "SAC-TEMP-2")
    fd = finite_difference(lambda x: sac.temperature_loss(x, h, ht), la.detach())
    assert_close(la.grad, fd, "SAC-TEMP-2", what="autograd vs finite differences")


@pytest.mark.clause("SAC-TEMP-2")
def test_one_sgd_step_on_temperature_loss_raises_alpha_on_deficit(sac):
    la = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([la], lr=0.1)
    sac.temperature_loss(la, torch.tensor([1.0], dtype=torch.float64), torch.tensor([3.0], dtype=torch.float64)).backward()
    opt.step()
    assert_close(la.detach(), 0.2, "SAC-TEMP-2", what="log α after one step with deficit 2 and lr 0.1")


@pytest.mark.clause("SAC-TEMP-3")
@given(entropy_batches(), st.floats(-12.0, 3.0), st.floats(1e-3, 10.0))
def test_alpha_is_clamped_to_range(sac, hb, log_alpha, lr):
    h, ht = hb
    la = torch.tensor(log_alpha, dtype=h.dtype)  # log α in the entropies' dtype: one working dtype per call
    got = sac.temperature_update(la, h, ht, lr=lr)
    deficit = float(np.mean(np_(ht) - np_(h)))
    assert_close(got, _after_update(float(la) + lr * deficit), "SAC-TEMP-3")
    if convention("alpha_clamp") == "after_step":
        a, lo, hi = math.exp(float(got)), 1e-4, 2.0
        within = lo - slack("SAC-TEMP-3", lo) <= a <= hi + slack("SAC-TEMP-3", hi)  # rounding of the dtype
        assert_that(within, "SAC-TEMP-3", a, "alpha in [1e-4, 2]")


@pytest.mark.clause("SAC-TEMP-3")
def test_alpha_clamp_golden(sac):
    h = torch.tensor([0.0], dtype=torch.float64)
    big = torch.tensor([1e6], dtype=torch.float64)
    assert_close(sac.temperature_update(torch.tensor(0.0, dtype=torch.float64), h, big, lr=1.0), _after_update(1e6),
                 "SAC-TEMP-3")
    assert_close(sac.temperature_update(torch.tensor(0.0, dtype=torch.float64), big, h, lr=1.0), _after_update(-1e6),
                 "SAC-TEMP-3")


@pytest.mark.clause("SAC-TEMP-3")
@given(st.floats(-30.0, 30.0), st.floats(1e-6, 1.0), st.floats(1.0, 20.0))
def test_clamp_log_alpha_keeps_alpha_in_range(sac, log_alpha, alpha_min, alpha_max):
    """The range is the caller's: bounds are drawn, so a clamp to the default range whatever the arguments
    fails."""
    if convention("alpha_clamp") == "none":
        not_applicable("alpha_clamp none: the implementation never clamps alpha")
    kw = pin("sac.clamp_log_alpha", {"alpha_min": alpha_min, "alpha_max": alpha_max})
    got = sac.clamp_log_alpha(torch.tensor(log_alpha, dtype=torch.float64), **kw)
    assert_close(got, min(max(log_alpha, math.log(kw["alpha_min"])), math.log(kw["alpha_max"])), "SAC-TEMP-3")


@pytest.mark.clause("SAC-DEFAULT-3", "SAC-TEMP-3")
@pytest.mark.parametrize("alpha", [1e-7, 0.5, 50.0])
def test_clamp_log_alpha_default_range_is_the_spec_range(sac, alpha):
    lo, hi = spec_default("SAC-DEFAULT-3", "alpha_min"), spec_default("SAC-DEFAULT-3", "alpha_max")
    got = sac.clamp_log_alpha(torch.tensor(np.log(alpha), dtype=F64))
    assert_close(got, np.log(min(max(alpha, lo), hi)), "SAC-TEMP-3", what=f"clamp_log_alpha(log {alpha}) at the default range")


# ----------------------------------------------------------------------------- CQL
@pytest.mark.clause("SAC-CQL-1")
@given(st_.batch_shapes(max_batch=8), st.data(), st.floats(0.0, 1.0))
def test_cql_penalty_matches_scipy(sac, shape, data, lam):
    q = data.draw(st_.q_values(shape))
    a = torch.tensor(data.draw(st.lists(st.integers(0, shape[1] - 1), min_size=shape[0], max_size=shape[0])))
    lam = pin_value("sac.cql_penalty", "lam", lam)
    got = sac.cql_penalty(q, a, lam=lam)
    qn = np_(q)
    expected = lam * (logsumexp(qn, axis=-1).mean() - qn[np.arange(shape[0]), to_numpy(a)].mean())
    assert_close(got, expected, "SAC-CQL-1")


@pytest.mark.clause("SAC-CQL-1")
def test_cql_penalty_golden(sac):
    q = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    a = torch.tensor([0, 1])
    # logsumexp of two equal values x is x + log 2; minus the taken Q leaves log 2 per row
    lam = pin_value("sac.cql_penalty", "lam", 0.5)
    assert_close(sac.cql_penalty(q, a, lam=lam), lam * math.log(2), "SAC-CQL-1")


# ----------------------------------------------------------------------------- BC
@st.composite
def bc_batches(draw):
    B, A = draw(st_.batch_shapes(max_batch=10))
    logits = draw(st_.logits((B, A), scale=5.0))
    logp = torch.log_softmax(logits, -1)
    actions = torch.tensor(draw(st.lists(st.integers(0, A - 1), min_size=B, max_size=B)))
    kind = draw(st.sampled_from(["mixed", "none", "all"]))  # an empty demo set and an all-demo batch on purpose
    flags = {"none": [False] * B, "all": [True] * B}.get(kind) or draw(st.lists(st.booleans(), min_size=B, max_size=B))
    return logp, actions, torch.tensor(flags)


@pytest.mark.clause("SAC-BC-1")
@given(bc_batches(), st_.keyword_arguments("sac.bc_loss"))
def test_bc_loss_is_mean_nll_over_demo_rows_only(sac, batch, kw):
    lam = kw["lam"]
    logp, actions, is_demo = batch
    got = sac.bc_loss(logp, actions, is_demo, lam=lam)
    ln, an, dn = np_(logp), to_numpy(actions), to_numpy(is_demo)
    nll = -ln[np.arange(len(an)), an]
    expected = lam * nll[dn].mean() if dn.any() else 0.0
    assert_close(got, expected, "SAC-BC-1")
    # changing agent rows must not change the loss
    shuffled = logp.clone()
    shuffled[~is_demo] = torch.log_softmax(torch.randn_like(shuffled[~is_demo]), -1)
    assert_close(sac.bc_loss(shuffled, actions, is_demo, lam=lam), expected, "SAC-BC-1", what="agent rows changed")


@pytest.mark.clause("SAC-BC-1")
def test_bc_loss_golden(sac):
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]], dtype=torch.float64))
    actions = torch.tensor([0, 1, 1])
    is_demo = torch.tensor([True, True, False])
    assert_close(sac.bc_loss(logp, actions, is_demo, lam=0.1), 0.1 * (math.log(2) - math.log(0.75)) / 2, "SAC-BC-1")
    none = sac.bc_loss(logp, actions, torch.zeros(3, dtype=torch.bool), lam=0.1)
    assert_equal(float(none), 0.0, "SAC-BC-1", "a batch with no demo rows")


# ----------------------------------------------------------------------------- keyword defaults
# Every other test passes the keywords, so only a call that omits them sees the defaults: lambda_CQL,
# lambda_BC and the total losses' switches must be the spec's. A batch of three rows over four actions with
# distinct Q values, the taken actions spread over the row.
Q = np.array([[0.3, -1.2, 2.0, 0.7], [1.5, 0.1, -0.4, 3.2], [-2.0, 0.9, 0.0, 1.1]])
ACTIONS = np.array([2, 0, 3])
LEGAL = np.array([[True, True, True, False], [True, False, True, True], [False, True, True, True]])


def np_cql(q: np.ndarray, actions: np.ndarray, lam: float, legal: np.ndarray | None = None) -> float:
    """lam (mean over rows of the log-sum-exp over the legal set - mean Q at the taken action)."""
    lse = logsumexp(np.where(legal, q, -np.inf) if legal is not None else q, axis=-1)
    return lam * (lse.mean() - q[np.arange(len(actions)), actions].mean())


@pytest.mark.clause("SAC-DEFAULT-8", "SAC-CQL-1")
@pytest.mark.parametrize("legal", [None, LEGAL], ids=["all-actions", "legal-set"])
def test_cql_penalty_default_weight_is_lambda_cql(sac, legal):
    mask = None if legal is None else torch.tensor(legal)
    got = sac.cql_penalty(torch.tensor(Q, dtype=F64), torch.tensor(ACTIONS), legal_mask=mask)
    lam = pin_value("sac.cql_penalty", "lam", spec_default("SAC-DEFAULT-8", "lambda_cql"))  # a hard-coded weight
    assert_close(got, np_cql(Q, ACTIONS, lam, legal), "SAC-CQL-1",
                 what="cql_penalty without lam (the default must be lambda_CQL = 0.5)")


PROBS = np.array([[0.5, 0.3, 0.2, 0.0], [0.1, 0.0, 0.6, 0.3], [0.0, 0.25, 0.25, 0.5]])
Q2 = Q + np.array([[0.4, -0.3, 0.1, 0.0], [-0.2, 0.5, 0.3, -0.6], [0.2, -0.1, 0.4, 0.3]])
DEMO = np.array([True, False, True])
Y = np.array([1.0, -0.5, 2.5])


def np_huber(x: np.ndarray, delta: float = 1.0) -> np.ndarray:
    return np.where(np.abs(x) <= delta, 0.5 * x ** 2, delta * (np.abs(x) - 0.5 * delta))


def np_bc(probs: np.ndarray, actions: np.ndarray, demo: np.ndarray, lam: float) -> float:
    nll = -np.log(probs[np.arange(len(actions)), actions])
    return lam * nll[demo].mean() if demo.any() else 0.0


def np_policy_option_a(probs: np.ndarray, q1: np.ndarray, q2: np.ndarray, legal: np.ndarray, alpha: float) -> float:
    p = np.where(legal, probs, 1.0)  # log 1 = 0 keeps illegal entries out of the sum below
    return float(np.mean(np.sum(np.where(legal, probs * (alpha * np.log(p) - np.minimum(q1, q2)), 0.0), -1)))


def _t(a, dtype=F64):
    return torch.tensor(a, dtype=dtype) if np.asarray(a).dtype.kind == "f" else torch.tensor(a)


@pytest.mark.clause("SAC-DEFAULT-7", "SAC-BC-1")
def test_bc_loss_default_weight_is_lambda_bc(sac):
    probs = np.clip(PROBS, 1e-8, None)
    got = sac.bc_loss(_t(np.log(probs)), _t(ACTIONS), _t(DEMO))
    assert_close(got, np_bc(probs, ACTIONS, DEMO, spec_default("SAC-DEFAULT-7", "lambda_bc")), "SAC-BC-1",
                 what="bc_loss without lam (the default must be lambda_BC = 0.1)")


@pytest.mark.clause("SAC-DEFAULT-8", "SAC-CRITIC-2")
def test_critic_loss_total_defaults_add_cql_with_lambda_cql(sac):
    """use_cql defaults to on, lam_cql to lambda_CQL, and the log-sum-exp runs over every action."""
    rows = np.arange(len(ACTIONS))
    lam = spec_default("SAC-DEFAULT-8", "lambda_cql")
    want = (np.mean(np_huber(Q[rows, ACTIONS] - Y) + np_huber(Q2[rows, ACTIONS] - Y))
            + np_cql(Q, ACTIONS, lam) + np_cql(Q2, ACTIONS, lam))
    got = sac.critic_loss_total(_t(Q), _t(Q2), _t(ACTIONS), _t(Y))
    assert_close(got, want, "SAC-CRITIC-2", what="critic_loss_total with every keyword at its default")


@pytest.mark.clause("SAC-DEFAULT-7", "SAC-POL-3")
def test_policy_loss_total_default_bc_weight_is_lambda_bc(sac):
    probs, alpha = np.clip(PROBS, 1e-8, None), 0.3
    legal = PROBS > 0
    want = np_policy_option_a(probs, Q, Q2, legal, alpha) + np_bc(probs, ACTIONS, DEMO, spec_default("SAC-DEFAULT-7", "lambda_bc"))
    got = sac.policy_loss_total(_t(probs), _t(Q), _t(Q2), _t(legal), _t(ACTIONS), _t(DEMO), alpha=alpha)
    assert_close(got, want, "SAC-POL-3", what="policy_loss_total without lam_bc or p (option A plus BC at lambda_BC)")


# ----------------------------------------------------------------------------- gradient isolation
@st.composite
def loss_inputs(draw):
    """A policy case with Q magnitudes up to 1e3, actions, demo flags and a TD target."""
    z, mask = draw(st_.logits_and_masks(scale=draw(st.sampled_from([5.0, 1e3])), max_actions=8))
    scale = draw(st.sampled_from([5.0, 1e3]))
    q1, q2 = (draw(st_.q_values(tuple(z.shape), scale=scale)) for _ in range(2))
    B = z.shape[0]
    actions = torch.tensor([draw(st.sampled_from(np.flatnonzero(to_numpy(mask[b])).tolist())) for b in range(B)])
    is_demo = torch.tensor(draw(st.lists(st.booleans(), min_size=B, max_size=B)))
    y = draw(st_.tensors((B,), lo=-scale, hi=scale))
    return _probs_from_logits(z, mask), mask, q1, q2, actions, is_demo, y, draw(st.floats(0.01, 2.0))


@pytest.mark.clause("SAC-CRITIC-1", "SAC-CRITIC-2", "SAC-POL-1", "SAC-POL-2", "SAC-POL-3", "SAC-TEMP-2")
@given(loss_inputs(), st_.keyword_arguments("sac.critic_loss"), st.floats(0.3, 1.0))
def test_no_gradient_into_the_inputs_a_loss_treats_as_constants(sac, case, kw, p):
    """TD targets, the critics' Q inside the policy losses and the entropies inside the temperature
    loss are requires-grad leaves; each loss must leave them without gradient."""
    probs, mask, q1, q2, actions, is_demo, y, alpha = case
    q1g, q2g, yg = grad_leaves(q1, q2, y)
    sac.critic_loss(q1g.gather(1, actions.view(-1, 1)).squeeze(1), q2g.gather(1, actions.view(-1, 1)).squeeze(1),
                    yg, **kw).backward()
    assert_no_grad("SAC-CRITIC-1", "the TD target y", yg)
    q1g, q2g, yg = grad_leaves(q1, q2, y)
    sac.critic_loss_total(q1g, q2g, actions, yg, legal_mask=mask, delta=kw["delta"]).backward()
    assert_no_grad("SAC-CRITIC-2", "the TD target y", yg)
    for clause, op, extra in (("SAC-POL-1", "policy_loss", {}), ("SAC-POL-2", "policy_loss_top_p", {"p": p})):
        pg, q1g, q2g = grad_leaves(probs, q1, q2)
        getattr(sac, op)(pg, q1g, q2g, mask, alpha=alpha, **extra).backward()
        assert_no_grad(clause, "the critics' Q (the policy step must not train the critic)", q1g, q2g)
    pg, q1g, q2g = grad_leaves(probs, q1, q2)
    sac.policy_loss_total(pg, q1g, q2g, mask, actions, is_demo, alpha=alpha).backward()
    assert_no_grad("SAC-POL-3", "the critics' Q", q1g, q2g)
    h, ht = grad_leaves(y.abs(), y.abs().flip(0))
    log_alpha = torch.tensor(math.log(alpha), dtype=torch.float64, requires_grad=True)
    sac.temperature_loss(log_alpha, h, ht).backward()
    assert_no_grad("SAC-TEMP-2", "the entropy and its target (the alpha step must not move the policy)", h, ht)


# ----------------------------------------------------------------------------- SAC-DTYPE-1
def _sac_dtype_calls(dtype):
    """One call of every float-returning operation on floating inputs of ``dtype``."""
    z = torch.tensor([[0.5, -1.0, 2.0], [0.1, 0.2, -0.3]], dtype=dtype)
    mask = torch.tensor([[True, False, True], [True, True, True]])
    probs = torch_masked_probs(z, mask)
    q1, q2 = z * 2.0, z - 1.0
    act, demo = torch.tensor([2, 1]), torch.tensor([True, False])
    v = torch.tensor([0.5, -0.25], dtype=dtype)
    la = torch.tensor(-1.0, dtype=dtype)
    return [
        ("masked_softmax", (z, mask), {}),
        ("entropy", (probs, mask), {}), ("soft_value", (probs, q1, q2, mask), dict(alpha=0.2)),
        ("top_p_probs", (probs, mask), {}), ("top_p_soft_value", (probs, q1, q2, mask), dict(alpha=0.2, p=0.9)),
        ("td_target", (v, torch.tensor([False, True]), v), dict(gamma=0.99)), ("critic_loss", (v, v * 2, v + 1), {}),
        ("policy_loss", (probs, q1, q2, mask), dict(alpha=0.2)),
        ("policy_loss_top_p", (probs, q1, q2, mask), dict(alpha=0.2, p=0.9)),
        ("temperature_update", (la, v.abs(), v.abs() + 1), dict(lr=1e-3)), ("temperature_loss", (la, v.abs(), v), {}),
        ("cql_penalty", (q1, act), {}), ("bc_loss", (torch.log(probs), act, demo), {}),
        ("soft_update", (v, v + 1), dict(tau=0.005)), ("ema_update", (v, v + 1), dict(m=0.99)),
        ("popart_step", (v, v.abs() + 1, v * 3), {}), ("shaped_reward", (v, v, v, torch.tensor([False, True])),
                                                         dict(gamma=0.99)),
        ("critic_loss_total", (q1, q2, act, v), dict(legal_mask=mask)),
        ("policy_loss_total", (probs, q1, q2, mask, act, demo), dict(alpha=0.2)),
    ]


@pytest.mark.clause("SAC-DTYPE-1")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("index", range(19))
def test_outputs_keep_the_input_dtype(sac, dtype, index):
    op, args, kwargs = _sac_dtype_calls(dtype)[index]
    assert_dtype(getattr(sac, op)(*args, **kwargs), dtype, "SAC-DTYPE-1", op)


# ----------------------------------------------------------------------------- gradients of the loss ops
# A value checked against its oracle says nothing about the gradient: a ``.detach()`` in the wrong place keeps
# every value and stops a network from training (a BC term on a detached log π, one critic's CQL term on detached
# Q, a Top-p denominator held constant, a query detached in the negatives' scores...). One differential test per
# op: autograd of a fixed random read-out Σ w·out of the op against central finite differences (float64) of the
# op's numpy oracle, for every input the contract says carries gradient; and no gradient at all into the inputs
# it holds constant (TD targets, the critics inside a policy loss, the positive and the queued negatives).
def _np_legal_probs(g: np.random.Generator, b: int, a: int, dtype: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
    """ε-clipped masked softmax rows of logits N(0, 1) (legal π well above the finite-difference step), the clip
    as ``dtype`` holds it."""
    mask = g.random((b, a)) < 0.7
    mask[np.arange(b), g.integers(0, a, b)] = True
    return np.maximum(masked_softmax(g.standard_normal((b, a)), mask), prob_floor(EPS, dtype)), mask


def _np_top_p_set(pn: np.ndarray, mn: np.ndarray, p: float) -> np.ndarray:
    """SAC-TOPP-1's set of every row, by brute force (exact sums: one size per row)."""
    sel = np.zeros_like(mn)
    for b in range(pn.shape[0]):
        ranked, k, _ = top_p_bounds(pn[b], mn[b], p)
        sel[b, ranked[:k]] = True
    return sel


def _np_option(probs, qmin, support, alpha):
    """mean over rows of Σ_support π̃ (α log π̃ − min Q), π̃ = π renormalised over the support (any p > 0 row)."""
    kept = np.where(support, probs, 0.0)
    pp = np.where(support, kept / kept.sum(-1, keepdims=True), 1.0)
    return float(np.mean(np.where(support, pp * (alpha * np.log(pp) - qmin), 0.0).sum(-1)))


class GradCase(NamedTuple):
    """One gradient-table case: the args by name, the keywords, the inputs with gradient and those held constant,
    the numpy oracle of the output on the args by name, and the natural size of a gradient where it is not 1
    (input name -> array broadcasting against it)."""
    args: dict
    kwargs: dict
    with_grad: tuple
    constant: tuple
    oracle: Callable
    scale: dict = {}


def _renormalised_scale(probs, qmin, sel, alpha) -> dict:
    """A gradient through π / Z (Top-p's renormalisation) has terms of size (|min Q| + α|log π_p| + 1) / Z per row,
    which cancel to a small result: half precision leaves a residue of that size."""
    z = np.where(sel, probs, 0.0).sum(-1, keepdims=True)
    log_pp = np.log(np.where(sel, probs / z, 1.0))
    return {"probs": (np.abs(qmin).max(-1, keepdims=True) + alpha * np.abs(log_pp).max(-1, keepdims=True) + 1.0) / z}


def _grad_case(op: str, g: np.random.Generator, dtype: torch.dtype) -> tuple:
    """The fields of ``op``'s :class:`GradCase`. Twin Q values are offset by N(0, 1) (no min ties) and Huber errors
    sit off their kink."""
    b, a = int(g.integers(1, 4)), int(g.integers(2, 6))
    t = lambda x: torch.tensor(x, dtype=dtype)  # noqa: E731
    probs, mask = _np_legal_probs(g, b, a, dtype)
    q1 = 3.0 * g.standard_normal((b, a))
    q2 = q1 + g.standard_normal((b, a))
    actions = np.array([g.choice(np.flatnonzero(row)) for row in mask])
    demo = g.random(b) < 0.6
    demo[0] = True  # the BC term is never empty
    alpha, lam = float(g.uniform(0.05, 1.5)), float(g.uniform(0.1, 1.0))
    drawn_delta = float(g.uniform(0.5, 2.0))
    rows = np.arange(b)

    def critic_terms():  # the Huber convention is read only by the critic cases (read, it marks a deviation)
        delta, conv = critic_delta(drawn_delta), convention("huber_delta")
        return delta, lambda x1, x2, y: float(np.mean(np_critic_penalty(x1 - y, delta, conv)
                                                      + np_critic_penalty(x2 - y, delta, conv)))

    if op == "critic_loss":
        delta, critic = critic_terms()
        y = q1[rows, actions] + g.choice([-1, 1], b) * g.uniform(0.1, 3.0, b)
        kw = pin("sac.critic_loss", {"delta": delta})
        return ({"q1_taken": t(q1[rows, actions]), "q2_taken": t(q2[rows, actions]), "target": t(y)}, kw,
                ("q1_taken", "q2_taken"), ("target",), lambda x: critic(x["q1_taken"], x["q2_taken"], x["target"]))
    if op == "critic_loss_total":
        delta, critic = critic_terms()
        y = q1[rows, actions] + g.uniform(-3.0, 3.0, b)
        lam_cql = pin_value("sac.critic_loss_total", "lam_cql", lam)
        oracle = lambda x: (critic(x["q1_all"][rows, actions], x["q2_all"][rows, actions], x["target"])  # noqa: E731
                            + np_cql(x["q1_all"], actions, lam_cql, mask) + np_cql(x["q2_all"], actions, lam_cql, mask))
        return ({"q1_all": t(q1), "q2_all": t(q2), "actions": torch.tensor(actions), "target": t(y)},
                {"legal_mask": torch.tensor(mask), "delta": delta, "lam_cql": lam_cql},
                ("q1_all", "q2_all"), ("target",), oracle)
    if op == "cql_penalty":
        lam_cql = pin_value("sac.cql_penalty", "lam", lam)
        # every action legal (legal_mask=None, which every implementation takes); critic_loss_total has the mask
        return ({"q_all": t(q1), "actions": torch.tensor(actions)}, {"lam": lam_cql},
                ("q_all",), (), lambda x: np_cql(x["q_all"], actions, lam_cql))
    if op == "bc_loss":
        lam_bc = pin_value("sac.bc_loss", "lam", lam)
        return ({"log_probs": t(np.log(probs)), "actions": torch.tensor(actions), "is_demo": torch.tensor(demo)},
                {"lam": lam_bc}, ("log_probs",), (),
                lambda x: lam_bc * float(np.mean(-x["log_probs"][rows, actions][demo])))
    policy_args = {"probs": t(probs), "q1": t(q1), "q2": t(q2), "legal_mask": torch.tensor(mask)}
    qmin = np.minimum(q1, q2)
    if op == "policy_loss":
        return (policy_args, {"alpha": alpha}, ("probs",), ("q1", "q2"),
                lambda x: np_policy_option_a(x["probs"], q1, q2, mask, alpha))
    if op in ("policy_loss_top_p", "top_p_soft_value"):
        p = float(g.uniform(0.3, 1.0))
        sel = _np_top_p_set(probs, mask, p)  # the selection is a constant of the gradient (SAC-TOPP-1: detached)
        size = _renormalised_scale(probs, qmin, sel, alpha)
        if op == "policy_loss_top_p":
            return (policy_args, {"alpha": alpha, "p": p}, ("probs",), ("q1", "q2"),
                    lambda x: _np_option(x["probs"], qmin, sel, alpha), size)

        def value(x):
            kept = np.where(sel, x["probs"], 0.0)
            pp = np.where(sel, kept / kept.sum(-1, keepdims=True), 1.0)
            return np.where(sel, pp * (np.minimum(x["q1"], x["q2"]) - alpha * np.log(pp)), 0.0).sum(-1)

        return policy_args, {"alpha": alpha, "p": p}, ("probs", "q1", "q2"), (), value, size
    if op == "policy_loss_total":
        lam_bc = pin_value("sac.policy_loss_total", "lam_bc", lam)
        oracle = lambda x: (np_policy_option_a(x["probs"], q1, q2, mask, alpha)  # noqa: E731
                            + lam_bc * float(np.mean(-np.log(x["probs"][rows, actions][demo]))))
        return ({**policy_args, "actions": torch.tensor(actions), "is_demo": torch.tensor(demo)},
                {"alpha": alpha, "lam_bc": lam_bc}, ("probs",), ("q1", "q2"), oracle)
    if op == "top_p_probs":
        sel = (g.random((b, a)) < 0.6) & mask  # legal entries only: an ε entry would sit within the step of 0
        sel[rows, actions] = True

        def renormalised(x):
            kept = np.where(sel, x["probs"], 0.0)
            return kept / kept.sum(-1, keepdims=True)

        return {"probs": t(probs), "selected": torch.tensor(sel)}, {}, ("probs",), (), renormalised
    if op in ("info_nce", "info_nce_queue"):
        d, k = int(g.integers(1, 5)), int(g.integers(1, 6))
        neg = g.standard_normal((k, d) if op == "info_nce_queue" else (b, k, d))
        tau = float(g.uniform(0.3, 2.0))
        tau = pin_value("sac.info_nce", "tau", tau)
        return ({"query": t(g.standard_normal((b, d))), "positive": t(g.standard_normal((b, d))), "negatives": t(neg)},
                {"tau": tau}, ("query",), ("positive", "negatives"),
                lambda x: np_info_nce(x["query"], x["positive"], x["negatives"], tau))
    raise AssertionError(op)


GRADIENT_OPS = [  # (op, clause): each loss op the contract makes differentiable
    ("critic_loss", "SAC-CRITIC-1"), ("critic_loss_total", "SAC-CRITIC-2"), ("cql_penalty", "SAC-CQL-1"),
    ("bc_loss", "SAC-BC-1"), ("policy_loss", "SAC-POL-1"), ("policy_loss_top_p", "SAC-POL-2"),
    ("policy_loss_total", "SAC-POL-3"), ("top_p_probs", "SAC-TOPP-2"), ("top_p_soft_value", "SAC-TOPP-3"),
    ("info_nce", "SAC-NCE-2"), ("info_nce_queue", "SAC-NCE-2"),  # negatives [B,K,d], and a shared queue [K,d]
]


@pytest.mark.parametrize("op, clause", [pytest.param(op, c, id=op, marks=pytest.mark.clause(c))
                                        for op, c in GRADIENT_OPS])
@given(seed=st.integers(0, 2**32 - 1))
def test_loss_op_gradients_match_finite_differences_of_the_oracle(sac, op, clause, seed):
    name = op.removesuffix("_queue")
    require_differentiable(f"sac.{name}")
    g = np.random.default_rng(seed)
    dtype = working_dtype()
    args, kwargs, with_grad, constant, oracle, scale = GradCase(*_grad_case(op, g, dtype))
    leaves = {k: v.clone().requires_grad_(True) if k in with_grad + constant else v for k, v in args.items()}
    out = getattr(sac, name)(*leaves.values(), **kwargs)
    w = g.uniform(0.5, 1.5, tuple(out.shape))  # a read-out that weights every output entry
    readout = (out * on_device(torch.tensor(w, dtype=out.dtype))).sum()
    base = {k: np_(v) for k, v in args.items()}
    for k in with_grad:
        def f(x, k=k):
            return float((np.asarray(oracle({**base, k: np_(x)})) * w).sum())

        assert_close(grad_of(readout, leaves[k]), finite_difference(f, host(args[k])), clause, dtype=dtype,
                     approx="gradient", scale=scale.get(k),
                     what=f"d(Σ w·{name})/d {k} vs finite differences of the oracle")
    assert_no_grad_into(readout, clause, **{k: leaves[k] for k in constant})
