"""IS-Reshape tests written to kill mutants that survived the mutation run (tools/mutation/, docs/mutation/).

Each test names the surviving mutant class it closes; the oracles are the closed forms of §2–§5 in numpy.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import expit

from conformance_tests.harness import assert_close
from rlconform.spec import default_spec

F64 = torch.float64


def isr_defaults() -> dict:
    """Every ISR-DEFAULT-* value as the spec states it."""
    out = {}
    for cid in ("ISR-DEFAULT-1", "ISR-DEFAULT-2", "ISR-DEFAULT-3", "ISR-DEFAULT-4"):
        out.update(default_spec().clause(cid).value)
    return out


def np_weights(lp, ref, adv, *, tau, beta, gamma_min, gamma_max, log_ratio_clamp, gamma=None):
    """(r, gamma, w_SAPO, w): r from the clamped log-ratio, gamma(|A|) = gmin + (gmax - gmin) sigmoid(beta |A|)
    unless a fixed ``gamma`` is given, w_SAPO = r sech^2(tau (r - 1) / 2), w = (1 - gamma) + gamma w_SAPO."""
    r = np.exp(np.clip(lp - ref, -log_ratio_clamp, log_ratio_clamp))
    g = gamma_min + (gamma_max - gamma_min) * expit(beta * np.abs(adv)) if gamma is None else np.full_like(r, gamma)
    w_sapo = r / np.cosh(tau * (r - 1.0) / 2.0) ** 2
    return r, g, w_sapo, (1.0 - g) + g * w_sapo


# Case 1: ratios on both sides of 1, both advantage signs, a padded token, so that tau, beta, the gamma
# bounds and mask_eps all move the loss. Case 2: one token whose log-ratio (-25) lies beyond the clamp and
# whose |A| is large (gamma ~ 1, so w ~ w_SAPO ~ r): the loss is proportional to the clamped ratio.
CASES = {
    "mixed": (np.array([-0.4, -1.2, -2.0, -0.7]), np.array([-0.7, -0.9, -2.3, -0.2]),
              np.array([0.8, -1.5, 2.5, 1.0]), np.array([1.0, 1.0, 1.0, 0.0])),
    "beyond-clamp": (np.array([-1.0]), np.array([24.0]), np.array([50.0]), np.array([1.0])),
}


def _tensors(case):
    return [torch.tensor(a, dtype=F64) for a in case]


# Mutant class: keyword defaults that differ from the spec's (tau, beta, gamma bounds, the clamp, mask_eps).
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


R = np.array([0.05, 0.5, 1.0, 1.7, 6.0])


@pytest.mark.clause("ISR-DEFAULT-1", "ISR-F-1")
@pytest.mark.parametrize("gamma", [0.0, 0.3, 1.0])
def test_reshape_f_default_tau(isreshape, gamma):
    tau = isr_defaults()["tau"]
    want = (1 - gamma) * np.log(R) + gamma * (2 / tau) * np.tanh(tau * (R - 1) / 2)
    assert_close(isreshape.reshape_f(torch.tensor(R, dtype=F64), gamma), want, "ISR-F-1", what="reshape_f without tau")


@pytest.mark.clause("ISR-DEFAULT-1", "ISR-SAPO-2")
def test_sapo_gate_default_tau(isreshape):
    tau = isr_defaults()["tau"]
    assert_close(isreshape.sapo_gate(torch.tensor(R, dtype=F64)), expit(tau * (R - 1)) * 4 / tau, "ISR-SAPO-2",
                 what="sapo_gate without tau")


# Mutant class: a guard stricter than the clause. The SAPO gate takes no log, so r = 0 is a valid ratio
# (ISR-INPUT-2 asks r > 0 only where a log is taken).
@pytest.mark.clause("ISR-SAPO-2", "ISR-INPUT-2")
def test_sapo_gate_accepts_a_zero_ratio(isreshape):
    r = np.array([0.0, 1.0])
    assert_close(isreshape.sapo_gate(torch.tensor(r, dtype=F64), tau=2.0), expit(2.0 * (r - 1)) * 4 / 2.0, "ISR-SAPO-2",
                 what="sapo_gate at r = 0")


# Mutant class: the SAPO policy loss (reference_impl/isreshape/sapo.py, our trainers' SAPO arm, so a meta
# test) stops lifting half-precision inputs to float32: r = e^15 overflows float16 and the loss is lost.
@pytest.mark.meta
@pytest.mark.clause("ISR-STAB-1", "ISR-SAPO-3")
def test_sapo_policy_loss_half_precision_ratio_beyond_float16_range():
    from reference_impl.isreshape.sapo import sapo_policy_loss

    lp, ref = np.array([-1.0, -2.0, -0.5]), np.array([-16.0, -2.5, -0.25])  # log-ratios 15, 0.5, -0.25
    adv, m = np.array([1.0, -0.5, 2.0]), np.array([1.0, 1.0, 1.0])
    tau = np.where(adv > 0, 1.0, 2.0)
    r = np.exp(lp - ref)  # e^15 = 3.3e6 > float16's 65504
    want = -(4.0 / tau * expit(tau * (r - 1.0)) * adv * m).sum() / (m.sum() + 1e-8)
    half = [torch.tensor(a, dtype=torch.float16) for a in (lp, ref, adv, m)]
    got = sapo_policy_loss(*half, tau_pos=1.0, tau_neg=2.0)
    assert_close(got, want, "ISR-STAB-1", dtype=torch.float16, approx="reduction",
                 what="SAPO policy loss of float16 tokens, one with log-ratio 15")


# Mutant class: the importance ratio of half-precision inputs formed in half (the float32 working dtype
# dropped). log pi - log mu = 4 + 2^-8 - (-4) is exact in float32 but rounds to 8 in float16 (spacing 2^-7
# above 8), a 0.4% error in r, twice float16's identity tolerance.
@pytest.mark.clause("ISR-RATIO-1", "ISR-STAB-1")
def test_importance_ratio_of_half_inputs_takes_the_exact_log_ratio(isreshape):
    from conformance_tests.harness import require_dtype

    require_dtype(torch.float16)
    lp, ref = np.array([4.0 + 2.0 ** -8, -0.5]), np.array([-4.0, -0.75])  # exactly representable in float16
    got = isreshape.importance_ratio(torch.tensor(lp, dtype=torch.float16), torch.tensor(ref, dtype=torch.float16))
    assert_close(got, np.exp(lp - ref), "ISR-RATIO-1", dtype=torch.float16,
                 what="importance_ratio of float16 inputs whose log-ratio float16 cannot hold")


def np_sapo_weight(r, tau):
    """w_SAPO(r) = r sech^2(tau (r - 1) / 2), numpy."""
    return r / np.cosh(tau * (r - 1.0) / 2.0) ** 2


# Mutant class: the weights' tau default changed (1 -> 2); R spans both sides of r = 1, where tau matters.
@pytest.mark.clause("ISR-DEFAULT-1", "ISR-SAPO-1")
def test_sapo_weight_default_tau(isreshape):
    tau = isr_defaults()["tau"]
    assert_close(isreshape.sapo_weight(torch.tensor(R, dtype=F64)), np_sapo_weight(R, tau), "ISR-SAPO-1",
                 what="sapo_weight without tau")


@pytest.mark.clause("ISR-DEFAULT-1", "ISR-W-1")
@pytest.mark.parametrize("gamma", [0.3, 1.0])
def test_reshape_weight_default_tau(isreshape, gamma):
    tau = isr_defaults()["tau"]
    assert_close(isreshape.reshape_weight(torch.tensor(R, dtype=F64), gamma), (1 - gamma) + gamma * np_sapo_weight(R, tau),
                 "ISR-W-1", what="reshape_weight without tau")


# Mutant class: the SAPO weights' guard made stricter (r > 0 asked). No log is taken, so r = 0 is a valid
# ratio (ISR-INPUT-2) and its weight is 0.
@pytest.mark.clause("ISR-SAPO-1", "ISR-SAPO-3", "ISR-INPUT-2")
def test_sapo_weights_accept_a_zero_ratio(isreshape):
    r = np.array([0.0, 1.5])
    adv = np.array([1.0, -1.0])
    assert_close(isreshape.sapo_weight(torch.tensor(r, dtype=F64), tau=2.0), np_sapo_weight(r, 2.0), "ISR-SAPO-1",
                 what="sapo_weight at r = 0")
    got = isreshape.sapo_weight_signed(torch.tensor(r, dtype=F64), torch.tensor(adv, dtype=F64), tau_pos=1.0, tau_neg=3.0)
    assert_close(got, np_sapo_weight(r, np.array([1.0, 3.0])), "ISR-SAPO-3", what="sapo_weight_signed at r = 0")
