"""IS Reshape v4 §5, §9, appendix C: the policy loss and its gradient, the SFT variant, the
diagnostics and bad token input. Oracles are numpy closed forms and hand-computed values."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from rlconform.spec import default_spec
from scipy.special import expit

from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_close,
    assert_no_grad,
    assert_rejects,
    assert_that,
    convention,
    finite_difference,
    to_numpy,
)
from conformance_tests.test_isreshape_weights import isr_defaults, np_gamma, np_weight

EPS = 1e-8
F64 = torch.float64
SEED_AGG = "token-mean"


def agg_coef(m: np.ndarray, mask_eps: float) -> np.ndarray:
    """Each token's weight in the loss under the loss_agg convention (a [T] batch is one sequence): the seed's
    m / (Σm + ε), or per sequence m / Σ_t m averaged over the sequences with a token, or sums."""
    agg = convention("loss_agg")
    if agg == SEED_AGG:
        return m / (m.sum() + mask_eps)
    if agg == "token-sum":
        return m
    rows = m.reshape(-1, m.shape[-1])
    live = rows.sum(-1) > 0
    per_row = rows / np.where(live, rows.sum(-1), 1.0)[:, None] if agg == "seq-mean-token-mean" else rows
    return (per_row / live.sum()).reshape(m.shape)


def agg_tolerance() -> str | None:
    """An aggregation other than the seed's may leave out the ε of the denominator: reduction tolerance."""
    return None if convention("loss_agg") == SEED_AGG else "reduction"


def np_token_weights(lp, ref, adv, *, tau=1.0, beta=1.0, gmin=0.0, gmax=1.0, clamp=20.0):
    log_r = np.clip(lp - ref, -clamp, clamp)
    r = np.exp(log_r)
    g = np_gamma(adv, beta, gmin, gmax)
    return log_r, r, g, np_weight(r, g, tau)


def grad_of(loss, x):
    """d loss / d x, zeros when the loss does not depend on x at all (the document's constant loss)."""
    if not loss.requires_grad:
        return torch.zeros_like(x)
    (g,) = torch.autograd.grad(loss, x, allow_unused=True)
    return torch.zeros_like(x) if g is None else g


@st.composite
def loss_cases(draw, op: str = "isreshape.policy_loss"):
    """A token batch ([T] or [B, T]) and every keyword of ``op`` drawn from its valid range."""
    return draw(st_.isr_token_batches()), draw(st_.keyword_arguments(op))


def np_weights_for(batch_np, hp):
    """The oracle's (log r, r, gamma, w) with the drawn keywords, never the defaults."""
    lp, ref, adv, _ = batch_np
    return np_token_weights(lp, ref, adv, tau=hp["tau"], beta=hp["beta"], gmin=hp["gamma_min"],
                            gmax=hp["gamma_max"], clamp=hp["log_ratio_clamp"])


def _np(batch):
    return [to_numpy(t) for t in batch]


# hand example: pi = (1/2, 1/4), mu = (1/2, 1/8) -> r = (1, 2); A = (1, -2); both tokens in the mask
GOLD_LP = [math.log(0.5), math.log(0.25)]
GOLD_REF = [math.log(0.5), math.log(0.125)]
GOLD_ADV = [1.0, -2.0]
G1, G2 = 1 / (1 + math.exp(-1.0)), 1 / (1 + math.exp(-2.0))  # sigma(|A|) at beta = 1
W1, W2 = 1.0, (1 - G2) + G2 * 1.572895465931855  # w(1) = 1, w_SAPO(2) = 1.5729 at tau = 1


def _gold():
    return (torch.tensor(GOLD_LP, dtype=torch.float64), torch.tensor(GOLD_REF, dtype=torch.float64),
            torch.tensor(GOLD_ADV, dtype=torch.float64), torch.ones(2, dtype=torch.float64))


def np_weights(lp, ref, adv, *, tau, beta, gamma_min, gamma_max, log_ratio_clamp, gamma=None):
    """(r, gamma, w_SAPO, w): r from the clamped log-ratio, gamma(|A|) = gmin + (gmax - gmin) sigmoid(beta |A|)
    unless a fixed ``gamma`` is given, w_SAPO = r sech^2(tau (r - 1) / 2), w = (1 - gamma) + gamma w_SAPO."""
    r = np.exp(np.clip(lp - ref, -log_ratio_clamp, log_ratio_clamp))
    g = gamma_min + (gamma_max - gamma_min) * expit(beta * np.abs(adv)) if gamma is None else np.full_like(r, gamma)
    w_sapo = r / np.cosh(tau * (r - 1.0) / 2.0) ** 2
    return r, g, w_sapo, (1.0 - g) + g * w_sapo


# The losses and their metrics called with every keyword at its default, on two batches. "mixed": ratios on
# both sides of 1, both advantage signs, a padded token, so that tau, beta, the gamma bounds and mask_eps all
# move the loss. "beyond-clamp": one token whose log-ratio (-25) lies beyond the clamp and whose |A| is large
# (gamma ~ 1, so w ~ w_SAPO ~ r): the loss is proportional to the clamped ratio.
CASES = {
    "mixed": (np.array([-0.4, -1.2, -2.0, -0.7]), np.array([-0.7, -0.9, -2.3, -0.2]),
              np.array([0.8, -1.5, 2.5, 1.0]), np.array([1.0, 1.0, 1.0, 0.0])),
    "beyond-clamp": (np.array([-1.0]), np.array([24.0]), np.array([50.0]), np.array([1.0])),
}


def _tensors(case):
    return [torch.tensor(a, dtype=F64) for a in case]


# ----------------------------------------------------------------------------- ISR-LOSS-1
@pytest.mark.clause("ISR-LOSS-1")
@given(loss_cases())
def test_loss_value(isreshape, case):
    batch, hp = case
    lp, ref, adv, m = _np(batch)
    *_, w = np_weights_for(_np(batch), hp)
    expected = -(w * adv * lp * agg_coef(m, hp["mask_eps"])).sum()
    assert_close(isreshape.policy_loss(*batch, **hp), expected, "ISR-LOSS-1", approx=agg_tolerance())


@pytest.mark.clause("ISR-LOSS-1")
def test_loss_golden(isreshape):
    expected = -(W1 * 1.0 * GOLD_LP[0] + W2 * -2.0 * GOLD_LP[1]) * _gold_coef()
    assert_close(isreshape.policy_loss(*_gold()), expected, "ISR-LOSS-1", approx=agg_tolerance())


def _gold_coef() -> float:
    """The weight of each of the two golden tokens (one sequence): 1 / (2 + ε), 1 / 2 or 1 for the sums."""
    return {SEED_AGG: 1 / (2 + EPS), "seq-mean-token-mean": 0.5}.get(convention("loss_agg"), 1.0)


@pytest.mark.clause("ISR-LOSS-1")
@given(st_.isr_token_batches())
def test_loss_is_the_token_mean_of_single_token_losses(isreshape, batch):
    # differential: the batched loss vs a loop of one-token losses averaged over the masked tokens
    lp, ref, adv, m = (t.reshape(-1) for t in batch)
    singles = [float(isreshape.policy_loss(lp[i:i + 1], ref[i:i + 1], adv[i:i + 1], torch.ones(1, dtype=lp.dtype)))
               for i in range(len(lp)) if m[i] > 0]
    # a single token's loss is its term / (1 + ε) under the seed, the term itself otherwise (one sequence)
    scale = {SEED_AGG: (1 + EPS) / (float(m.sum()) + EPS), "seq-mean-token-mean": 1 / float(m.sum())}
    expected = sum(singles) * scale.get(convention("loss_agg"), 1.0)
    assert_close(isreshape.policy_loss(lp, ref, adv, m), expected, "ISR-LOSS-1", approx=agg_tolerance())


@pytest.mark.clause("ISR-DEFAULT-1", "ISR-DEFAULT-2", "ISR-DEFAULT-4", "ISR-LOSS-1")
@pytest.mark.parametrize("name", list(CASES))
def test_policy_loss_at_default_keywords(isreshape, name):
    d = isr_defaults()
    lp, ref, adv, m = CASES[name]
    *_, w = np_weights(lp, ref, adv, tau=d["tau"], beta=d["beta"], gamma_min=d["gamma_min"],
                       gamma_max=d["gamma_max"], log_ratio_clamp=d["log_ratio_clamp"])
    want = -(w * adv * lp * m).sum() / (m.sum() + d["mask_eps"])
    assert_close(isreshape.policy_loss(*_tensors(CASES[name])), want, "ISR-LOSS-1", approx="reduction",
                 what="policy_loss with every keyword at its default")


# ----------------------------------------------------------------------------- ISR-LOSS-2
@pytest.mark.clause("ISR-LOSS-2")
@given(loss_cases())
def test_loss_gradient_is_minus_weight_times_advantage(isreshape, case):
    batch, hp = case
    lp, ref, adv = (t.clone().requires_grad_(True) for t in batch[:3])
    m = batch[3]  # a bool or a 0/1 float mask: never differentiated
    loss = isreshape.policy_loss(lp, ref, adv, m, **hp)
    nlp, nref, nadv, nm = _np(batch)
    *_, w = np_weights_for(_np(batch), hp)
    if loss.requires_grad:
        grads = torch.autograd.grad(loss, [lp, ref, adv], allow_unused=True)
    else:  # the document's constant loss: no gradient anywhere
        grads = (None, None, None)
    g_lp, g_ref, g_adv = (torch.zeros_like(lp) if g is None else g for g in grads)
    assert_close(g_lp, -w * nadv * agg_coef(nm, hp["mask_eps"]), "ISR-LOSS-2", what="dL/dlog pi", approx=agg_tolerance())
    assert_close(g_ref, np.zeros(nlp.shape), "ISR-LOSS-2", what="no gradient into log mu (w is detached)")
    assert_close(g_adv, np.zeros(nlp.shape), "ISR-LOSS-2", what="no gradient into the advantages")


@pytest.mark.clause("ISR-LOSS-2")
def test_loss_gradient_golden(isreshape):
    lp, ref, adv, m = _gold()
    x = lp.clone().requires_grad_(True)
    g = grad_of(isreshape.policy_loss(x, ref, adv, m), x)
    assert_close(g, [-W1 * 1.0 * _gold_coef(), -W2 * -2.0 * _gold_coef()], "ISR-LOSS-2",
                 what="a zero gradient means the loss lost its log pi factor", approx=agg_tolerance())


@pytest.mark.clause("ISR-LOSS-2")
def test_loss_gradient_by_finite_differences(isreshape):
    # dL/dlog pi with the weight held fixed: finite differences of the surrogate at frozen w

    lp, ref, adv, m = _gold()
    x = lp.clone().requires_grad_(True)
    g = grad_of(isreshape.policy_loss(x, ref, adv, m), x)
    w = np.array([W1, W2])
    fd = finite_difference(lambda z: -(torch.from_numpy(w) * adv * z * m).sum() * _gold_coef(), lp)
    assert_close(g, to_numpy(fd), "ISR-LOSS-2", approx=agg_tolerance())


# ----------------------------------------------------------------------------- ISR-SFT-1
@pytest.mark.clause("ISR-SFT-1")
@given(loss_cases("isreshape.sft_loss"))
def test_sft_loss_value_and_gradient(isreshape, case):
    (lp, ref, _, m), hp = case
    x, r = lp.clone().requires_grad_(True), ref.clone().requires_grad_(True)
    loss = isreshape.sft_loss(x, r, m, **hp)
    nlp, nref, nm = to_numpy(lp), to_numpy(ref), to_numpy(m)
    c, eps = hp["log_ratio_clamp"], hp["mask_eps"]
    w = np_weight(np.exp(np.clip(nlp - nref, -c, c)), hp["gamma_sft"], hp["tau"])
    coef = agg_coef(nm, eps)
    assert_close(loss, -(w * nlp * coef).sum(), "ISR-SFT-1", what="loss value", approx=agg_tolerance())
    if loss.requires_grad:
        loss.backward()
    got = x.grad if x.grad is not None else torch.zeros_like(x)
    assert_close(got, -w * coef, "ISR-SFT-1", what="dL/dlog pi (w detached)", approx=agg_tolerance())
    assert_no_grad("ISR-SFT-1", "ref_log_prob (w is detached)", r)


@pytest.mark.clause("ISR-SFT-1")
def test_sft_loss_golden(isreshape):
    lp, ref, _, m = _gold()
    w2 = 0.8 + 0.2 * 1.572895465931855  # default gamma_sft = 0.2 at r = 2
    expected = -(1.0 * GOLD_LP[0] + w2 * GOLD_LP[1]) * _gold_coef()
    assert_close(isreshape.sft_loss(lp, ref, m), expected, "ISR-SFT-1", approx=agg_tolerance())


@pytest.mark.clause("ISR-DEFAULT-1", "ISR-DEFAULT-3", "ISR-DEFAULT-4", "ISR-SFT-1")
@pytest.mark.parametrize("name", list(CASES))
def test_sft_loss_at_default_keywords(isreshape, name):
    d = isr_defaults()
    lp, ref, _, m = CASES[name]
    *_, w = np_weights(lp, ref, 0.0 * lp, tau=d["tau"], beta=0.0, gamma_min=0.0, gamma_max=1.0,
                       log_ratio_clamp=d["log_ratio_clamp"], gamma=d["gamma_sft"])
    want = -(w * lp * m).sum() / (m.sum() + d["mask_eps"])
    lp_t, ref_t, _, m_t = _tensors(CASES[name])
    assert_close(isreshape.sft_loss(lp_t, ref_t, m_t), want, "ISR-SFT-1", approx="reduction",
                 what="sft_loss with every keyword at its default")


# ----------------------------------------------------------------------------- ISR-METRIC-*
@pytest.mark.clause("ISR-METRIC-1")
@given(loss_cases("isreshape.loss_metrics"))
def test_masked_mean_metrics(isreshape, case):
    batch, hp = case
    lp, ref, adv, m = _np(batch)
    _, r, g, w = np_weights_for(_np(batch), hp)
    sapo = np_weight(r, 1.0, hp["tau"])
    got = isreshape.loss_metrics(*batch, **hp)
    for name, x in (("gamma_mean", g), ("weight_mean", w), ("sapo_weight_mean", sapo), ("ratio_mean", r),
                    ("abs_adv_mean", np.abs(adv))):
        assert_close(got[name], (x * m).sum() / m.sum(), "ISR-METRIC-1", what=name)


@pytest.mark.clause("ISR-METRIC-2")
@given(loss_cases("isreshape.loss_metrics"))
def test_spread_and_peak_metrics(isreshape, case):
    batch, hp = case
    lp, ref, adv, m = _np(batch)
    *_, g, w = np_weights_for(_np(batch), hp)
    sel = m > 0
    got = isreshape.loss_metrics(*batch, **hp)
    std = float(np.std(g[sel], ddof=1)) if sel.sum() > 1 else 0.0
    assert_close(got["gamma_std"], std, "ISR-METRIC-2", what="gamma_std (ddof = 1)")
    assert_close(got["weight_max"], w[sel].max(), "ISR-METRIC-2", what="weight_max over masked tokens")


@pytest.mark.clause("ISR-METRIC-3")
@given(loss_cases("isreshape.loss_metrics"))
def test_kl_metric(isreshape, case):
    batch, hp = case
    lp, ref, _, m = _np(batch)
    got = isreshape.loss_metrics(*batch, **hp)
    c = hp["log_ratio_clamp"]
    assert_close(got["kl"], (-np.clip(lp - ref, -c, c) * m).sum() / m.sum(), "ISR-METRIC-3")


@pytest.mark.clause("ISR-METRIC-1", "ISR-METRIC-2", "ISR-METRIC-3")
def test_metrics_golden(isreshape):
    lp, ref, adv, _ = _gold()
    m = torch.tensor([1.0, 1.0], dtype=torch.float64)
    got = isreshape.loss_metrics(lp, ref, adv, m)
    assert_close(got["gamma_mean"], (G1 + G2) / 2, "ISR-METRIC-1", what="gamma_mean")
    assert_close(got["ratio_mean"], 1.5, "ISR-METRIC-1", what="ratio_mean")
    assert_close(got["abs_adv_mean"], 1.5, "ISR-METRIC-1", what="abs_adv_mean")
    assert_close(got["sapo_weight_mean"], (1 + 1.572895465931855) / 2, "ISR-METRIC-1", what="sapo_weight_mean")
    assert_close(got["weight_mean"], (W1 + W2) / 2, "ISR-METRIC-1", what="weight_mean")
    assert_close(got["gamma_std"], abs(G2 - G1) / math.sqrt(2), "ISR-METRIC-2", what="gamma_std of two tokens")
    assert_close(got["weight_max"], W2, "ISR-METRIC-2", what="weight_max")
    assert_close(got["kl"], -math.log(2) / 2, "ISR-METRIC-3", what="kl = mean(-log r)")
    one = isreshape.loss_metrics(lp, ref, adv, torch.tensor([0.0, 1.0], dtype=torch.float64))
    assert_close(one["gamma_std"], 0.0, "ISR-METRIC-2", what="gamma_std of a single token")
    assert_close(one["weight_max"], W2, "ISR-METRIC-2", what="weight_max ignores masked-out tokens")


@pytest.mark.clause("ISR-DEFAULT-1", "ISR-DEFAULT-2", "ISR-DEFAULT-4", "ISR-METRIC-1")
@pytest.mark.parametrize("name", list(CASES))
def test_loss_metrics_at_default_keywords(isreshape, name):
    d = isr_defaults()
    lp, ref, adv, m = CASES[name]
    r, g, w_sapo, w = np_weights(lp, ref, adv, tau=d["tau"], beta=d["beta"], gamma_min=d["gamma_min"],
                                 gamma_max=d["gamma_max"], log_ratio_clamp=d["log_ratio_clamp"])
    sel = m > 0
    got = isreshape.loss_metrics(*_tensors(CASES[name]))
    want = {"gamma_mean": g[sel].mean(), "weight_mean": w[sel].mean(), "sapo_weight_mean": w_sapo[sel].mean(),
            "ratio_mean": r[sel].mean(), "weight_max": w[sel].max(),
            "kl": -np.clip(lp - ref, -d["log_ratio_clamp"], d["log_ratio_clamp"])[sel].mean()}
    for key, value in want.items():
        assert_close(got[key], value, "ISR-METRIC-1", dtype=F64, approx="reduction", what=f"loss_metrics()[{key!r}] at the defaults")


# ----------------------------------------------------------------------------- ISR-INPUT-1/2/3/4 (losses)
@pytest.mark.clause("ISR-INPUT-1")
@pytest.mark.parametrize("op", ["policy_loss", "loss_metrics", "sft_loss"])
def test_mismatched_token_shapes_are_rejected(isreshape, op):
    a, b = torch.zeros(3, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
    args = (a, a, b) if op == "sft_loss" else (a, a, a, b)
    assert_rejects("ISR-INPUT-1", isreshape.raw(op), *args)


@pytest.mark.clause("ISR-INPUT-1")
def test_empty_mask_is_rejected_by_metrics(isreshape):
    z = torch.zeros(3, dtype=torch.float64)
    assert_rejects("ISR-INPUT-1", isreshape.raw("loss_metrics"), z - 1.0, z - 1.0, z + 1.0, z)


@pytest.mark.clause("ISR-INPUT-2")
@pytest.mark.parametrize("where", [0, 1, 2])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_token_input_is_rejected(isreshape, where, bad):
    args = [torch.full((3,), -1.0, dtype=torch.float64) for _ in range(3)] + [torch.ones(3, dtype=torch.float64)]
    args[where][1] = bad
    assert_rejects("ISR-INPUT-2", isreshape.raw("policy_loss"), *args)
    if where < 2:  # a log-probability
        assert_rejects("ISR-INPUT-2", isreshape.raw("importance_ratio"), args[0], args[1])


@pytest.mark.clause("ISR-INPUT-3")
def test_loss_rejects_non_positive_tau(isreshape):
    z = torch.full((2,), -1.0, dtype=torch.float64)
    assert_rejects("ISR-INPUT-3", isreshape.raw("policy_loss"), z, z, z, torch.ones(2, dtype=torch.float64), tau=0.0)
    assert_rejects("ISR-INPUT-3", isreshape.raw("sft_loss"), z, z, torch.ones(2, dtype=torch.float64), tau=-1.0)


@pytest.mark.clause("ISR-INPUT-4")
@pytest.mark.parametrize("gamma_sft", [-0.2, 1.2])
def test_sft_rejects_gamma_outside_unit_interval(isreshape, gamma_sft):
    z = torch.full((2,), -1.0, dtype=torch.float64)
    assert_rejects("ISR-INPUT-4", isreshape.raw("sft_loss"), z, z, torch.ones(2, dtype=torch.float64), gamma_sft=gamma_sft)


# ----------------------------------------------------------------------------- ISR-DEFAULT-5
@pytest.mark.clause("ISR-DEFAULT-5")
def test_defaults_lie_in_appendix_a_ranges(isreshape):

    ranges = default_spec().clause("ISR-DEFAULT-5").value
    table = isreshape.defaults()
    for key in ("tau", "beta", "gamma_min", "gamma_max", "gamma_sft"):
        lo, hi = ranges[f"{key}_range"]
        assert_that(lo <= table[key] <= hi, "ISR-DEFAULT-5", table[key], f"{key} in [{lo}, {hi}]")
