"""The reference's CCAPO approx_kl: the contract leaves the estimator open (k1 or k3, exactly 0 at ratio 1,
test_ccapo_objective.py checks that much of any implementation); the reference documents k3, averaged per
trajectory then over trajectories like the surrogate, and is held to it here."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conformance_tests.harness import assert_close
from reference_impl.ccapo.losses import policy_loss

pytestmark = pytest.mark.meta


@pytest.mark.clause("CCAPO-PPO-1")
def test_approx_kl_is_the_k3_estimate_averaged_per_trajectory():
    g = torch.Generator().manual_seed(3)
    new = torch.randn(4, 5, generator=g, dtype=torch.float64) * 0.5
    old = torch.randn(4, 5, generator=g, dtype=torch.float64) * 0.5
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    out = policy_loss(new.clone().requires_grad_(), old, new, torch.zeros_like(new), mask)
    log_r = (new - old).numpy()
    k3 = np.expm1(log_r) - log_r
    per_traj = [k3[b][mask[b].numpy()].mean() for b in range(4) if mask[b].any()]
    assert_close(out["approx_kl"], float(np.mean(per_traj)), "CCAPO-PPO-1", what="approx_kl = mean_τ mean_t k3")
    assert float(out["approx_kl"]) > 0 and not out["approx_kl"].requires_grad
