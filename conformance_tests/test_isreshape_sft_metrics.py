"""IS-Reshape §9, on a point the seed document leaves open: the SFT variant's diagnostics (v4_sft/gamma,
weight_mean, ratio_mean)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance_tests import strategies as st_
from conformance_tests.harness import assert_close, assert_equal, assert_rejects
from conformance_tests.oracles import np_


def _np_weight(r: np.ndarray, gamma: float, tau: float) -> np.ndarray:
    with np.errstate(over="ignore"):  # cosh overflows to inf far from r = 1, where the SAPO part is 0
        return (1 - gamma) + gamma * r / np.cosh(tau * (r - 1) / 2) ** 2


@pytest.mark.clause("ISR-METRIC-4")
@given(st_.isr_token_batches(), st.floats(0.0, 1.0), st.floats(0.1, 4.0), st.floats(1.0, 30.0))
def test_sft_metrics_match_numpy(isreshape, batch, gamma_sft, tau, clamp):
    lp, ref, _, mask = batch
    got = isreshape.sft_metrics(lp, ref, mask, tau=tau, gamma_sft=gamma_sft, log_ratio_clamp=clamp)
    r = np.exp(np.clip(np_(lp) - np_(ref), -clamp, clamp))
    m = np_(mask)
    assert_equal(got["gamma"], gamma_sft, "ISR-METRIC-4", what="gamma is the fixed gamma_sft")
    assert_close(got["weight_mean"], float((_np_weight(r, gamma_sft, tau) * m).sum() / m.sum()), "ISR-METRIC-4",
                 what="weight_mean")
    assert_close(got["ratio_mean"], float((r * m).sum() / m.sum()), "ISR-METRIC-4", what="ratio_mean")


@pytest.mark.clause("ISR-METRIC-4")
def test_sft_metrics_golden(isreshape):
    # tokens with r = 1 (masked in), r = e (masked in), r = 5 (masked out); γ_sft = 0.2, τ = 1
    lp = torch.tensor([-1.0, -1.0, -1.0], dtype=torch.float64)
    ref = torch.tensor([-1.0, -2.0, -1.0 - math.log(5)], dtype=torch.float64)
    mask = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    got = isreshape.sft_metrics(lp, ref, mask, tau=1.0, gamma_sft=0.2)
    w_e = 0.8 + 0.2 * math.e / math.cosh((math.e - 1) / 2) ** 2
    assert_close(got["weight_mean"], (1.0 + w_e) / 2, "ISR-METRIC-4")  # w(1) = 1 for every γ
    assert_close(got["ratio_mean"], (1.0 + math.e) / 2, "ISR-METRIC-4")
    assert_equal(got["gamma"], 0.2, "ISR-METRIC-4")


@pytest.mark.clause("ISR-METRIC-4")
@given(st_.isr_token_batches())
def test_sft_metrics_agree_with_the_policy_metrics_at_a_fixed_gamma(isreshape, batch):
    """Differential: with γ_min = γ_max = γ_sft the policy diagnostics see the same weights and ratios."""
    lp, ref, adv, mask = batch
    sft = isreshape.sft_metrics(lp, ref, mask, gamma_sft=0.3)
    pol = isreshape.loss_metrics(lp, ref, adv, mask, gamma_min=0.3, gamma_max=0.3)
    assert_close(sft["weight_mean"], pol["weight_mean"], "ISR-METRIC-4", what="weight_mean vs loss_metrics")
    assert_close(sft["ratio_mean"], pol["ratio_mean"], "ISR-METRIC-4", what="ratio_mean vs loss_metrics")


@pytest.mark.clause("ISR-METRIC-4", "ISR-INPUT-1")
def test_sft_metrics_reject_an_empty_mask(isreshape):
    z = torch.zeros(3, dtype=torch.float64)
    assert_rejects("ISR-INPUT-1", isreshape.raw("sft_metrics"), z, z, torch.zeros(3, dtype=torch.float64))
