"""CCAPO §6: PPO-clip surrogate averaged per trajectory, KL penalty to the reference policy."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given

from conformance_tests import strategies as st_
from conformance_tests.harness import (assert_close, assert_dtype, assert_no_grad, assert_rejects, assert_that,
                                      finite_difference, grad_leaves)

F64 = torch.float64


def np_objective(new, old, ref, adv, mask, clip=0.2, beta=0.04):
    """Loop oracle: per trajectory (1/T) sum over real steps, then the mean over trajectories."""
    surr, kl = [], []
    for b in range(new.shape[0]):
        s = k = 0.0
        T = int(mask[b].sum())
        for t in range(new.shape[1]):
            if not mask[b, t]:
                continue
            rho = math.exp(new[b, t] - old[b, t])
            s += min(rho * adv[b, t], min(max(rho, 1 - clip), 1 + clip) * adv[b, t])
            d = ref[b, t] - new[b, t]
            k += math.exp(d) - d - 1
        surr.append(s / T)
        kl.append(k / T)
    return float(np.mean(surr)), float(np.mean(kl))


@pytest.mark.clause("CCAPO-PPO-1", "CCAPO-PPO-2")
@given(st_.ccapo_logp_batches(), st_.keyword_arguments("ccapo.policy_loss"))
def test_objective_matches_loop_oracle(ccapo, batch, kw):
    new, old, ref, adv, mask = batch
    out = ccapo.policy_loss(new, old, ref, adv, mask, **kw)
    surr, kl = np_objective(*(x.numpy() for x in batch), clip=kw["clip_eps"], beta=kw["beta_kl"])
    assert_close(out["loss"], -(surr - kw["beta_kl"] * kl), "CCAPO-PPO-1", what="loss")
    assert_close(out["loss_clip"], -surr, "CCAPO-PPO-1", what="loss_clip")
    assert_close(out["kl_ref"], kl, "CCAPO-PPO-2", dtype=F64, what="kl_ref")


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
    out = ccapo.policy_loss(new, z, new, torch.tensor([[1.0, -1.0]], dtype=F64), torch.ones(1, 2, dtype=torch.bool))
    assert_close(out["loss_clip"], -(1.2 - math.exp(0.5)) / 2, "CCAPO-PPO-1")
    assert_close(out["clip_fraction"], 1.0, "CCAPO-PPO-1", dtype=F64, what="both steps outside the clip range")


@pytest.mark.clause("CCAPO-PPO-1", "CCAPO-PPO-2")
@given(st_.ccapo_logp_batches(max_b=2, max_t=3))
def test_gradient_matches_finite_differences(ccapo, batch):
    new, old, ref, adv, mask = batch
    x = new.clone().requires_grad_(True)
    ccapo.policy_loss(x, old, ref, adv, mask)["loss"].backward()
    fd = finite_difference(lambda v: ccapo.policy_loss(v, old, ref, adv, mask)["loss"], new)
    # kinks of the clip are measure-zero; skip the rare draw that sits within h of one
    rho = (new - old).exp()
    assume(not bool((((rho - 0.8).abs() < 1e-5) | ((rho - 1.2).abs() < 1e-5)).any()))
    assert_close(x.grad, fd.numpy(), "CCAPO-PPO-2", what="d loss / d logp_new")


@pytest.mark.clause("CCAPO-PPO-2")
@given(st_.ccapo_logp_batches())
def test_kl_is_non_negative_and_zero_at_reference(ccapo, batch):
    new, old, ref, adv, mask = batch
    out = ccapo.policy_loss(new, old, ref, adv, mask)
    assert_that(out["kl_ref"] >= 0, "CCAPO-PPO-2", out["kl_ref"], "KL >= 0")
    same = ccapo.policy_loss(new, old, new.clone(), adv, mask)
    assert_close(same["kl_ref"], 0.0, "CCAPO-PPO-2", dtype=F64, what="KL at pi_theta = pi_ref")


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
