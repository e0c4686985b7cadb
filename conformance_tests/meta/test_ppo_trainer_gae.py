"""The time-major GAE of the reference's trainers (reference_impl.ppo.gae), a helper of our own trainers and
not the contract's op (reference_impl.ppo.advantage): held to the same PPO-GAE-1 estimator, by brute force
in numpy, at both ends of gamma and lambda, and rejecting a discount above 1 or dones that only broadcast.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conformance_tests.harness import assert_close
from reference_impl.ppo.gae import gae

F64 = torch.float64


def np_gae(r, v, d, last, gamma, lam):
    """A_t = sum_k (gamma lam)^k delta_{t+k}, stopping after the first done, by brute force (numpy)."""
    delta = r + gamma * (1 - d) * np.concatenate([v[1:], last[None]]) - v
    want = np.zeros_like(r)
    for t in range(r.shape[0]):
        for n in range(r.shape[1]):
            w = 1.0
            for k in range(t, r.shape[0]):
                want[t, n] += w * delta[k, n]
                if d[k, n]:
                    break
                w *= gamma * lam
    return want


# Both ends of [0, 1] are valid for gamma and lambda (PPO-GAE-1); 1.5 is not, for either of them alone.
@pytest.mark.meta
@pytest.mark.clause("PPO-GAE-1")
@pytest.mark.parametrize("gamma, lam", [(0.0, 0.5), (1.0, 0.5), (0.5, 0.0), (0.5, 1.0), (1.0, 1.0)])
def test_trainer_gae_accepts_both_ends_of_gamma_and_lambda(gamma, lam):

    r = np.array([[1.0, -2.0], [0.5, 3.0], [-1.0, 0.25]])
    v = np.array([[0.5, 0.5], [-1.0, 2.0], [0.75, -0.5]])
    d = np.array([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    last = np.array([9.0, -9.0])
    adv, ret = gae(*(torch.tensor(x, dtype=F64) for x in (r, v, d, last)), gamma=gamma, lam=lam)
    want = np_gae(r, v, d, last, gamma, lam)
    assert_close(adv, want, "PPO-GAE-1", what=f"GAE advantages with gamma={gamma}, lam={lam}")
    assert_close(ret, want + v, "PPO-GAE-1", what=f"GAE returns with gamma={gamma}, lam={lam}")


@pytest.mark.meta
@pytest.mark.clause("PPO-GAE-1")
@pytest.mark.parametrize("gamma, lam", [(1.5, 0.5), (0.5, 1.5)])
def test_trainer_gae_rejects_gamma_or_lambda_above_one(gamma, lam):

    z = torch.zeros(3, 2, dtype=F64)
    with pytest.raises(ValueError):
        gae(z, z, z, torch.zeros(2, dtype=F64), gamma=gamma, lam=lam)


# A done column [T, 1] beside rewards and values [T, N] (last_value right) would broadcast silently: each
# shape is checked on its own.
@pytest.mark.meta
@pytest.mark.clause("PPO-GAE-1")
def test_trainer_gae_rejects_dones_that_only_broadcast():

    z, last = torch.zeros(3, 2, dtype=F64), torch.zeros(2, dtype=F64)
    with pytest.raises(ValueError):
        gae(z, z, torch.zeros(3, 1, dtype=F64), last, gamma=0.9, lam=0.9)

