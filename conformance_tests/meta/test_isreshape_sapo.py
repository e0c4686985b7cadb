"""The SAPO policy loss of the reference's trainers (reference_impl.isreshape.sapo, their SAPO arm; not an
operation of the contract), checked against its closed form in numpy.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import expit

from conformance_tests.harness import assert_close
from reference_impl.isreshape.sapo import sapo_policy_loss


# Half-precision inputs are lifted to float32 before the ratio is formed: r = e^15 overflows float16, and
# the loss would be lost.
@pytest.mark.meta
@pytest.mark.clause("ISR-STAB-1", "ISR-SAPO-3")
def test_sapo_policy_loss_half_precision_ratio_beyond_float16_range():

    lp, ref = np.array([-1.0, -2.0, -0.5]), np.array([-16.0, -2.5, -0.25])  # log-ratios 15, 0.5, -0.25
    adv, m = np.array([1.0, -0.5, 2.0]), np.array([1.0, 1.0, 1.0])
    tau = np.where(adv > 0, 1.0, 2.0)
    r = np.exp(lp - ref)  # e^15 = 3.3e6 > float16's 65504
    want = -(4.0 / tau * expit(tau * (r - 1.0)) * adv * m).sum() / (m.sum() + 1e-8)
    half = [torch.tensor(a, dtype=torch.float16) for a in (lp, ref, adv, m)]
    got = sapo_policy_loss(*half, tau_pos=1.0, tau_neg=2.0)
    assert_close(got, want, "ISR-STAB-1", dtype=torch.float16, approx="reduction",
                 what="SAPO policy loss of float16 tokens, one with log-ratio 15")

