"""PPO-Clip at the level libraries are built: ``ppo.losses`` over the suite's table networks.

Oracles are numpy closed forms written here: the legal-set log-softmax, the clipped surrogate, the
value and entropy terms, and their analytic gradients with respect to the logits and values tables.
The ½ of the value loss, the KL estimator and the clip-fraction rule follow the declared conventions.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_between,
    assert_close,
    assert_no_grad_into,
    convention,
    grad_of,
    masks_supported,
    np_clip_fraction_bounds,
    on_device,
    pin,
    require_differentiable,
    require_masks,
    to_numpy,
    working_dtype,
)
from conformance_tests.contract import required_outputs
from conformance_tests.modules import TableModule
from conformance_tests.oracles import masked_softmax, np_, ratio_band

CLAUSE = "PPO-LOSSES-1"


def _table(t: torch.Tensor) -> TableModule:
    """A suite table network, built on the audited device."""
    return on_device(TableModule(t))


# ----------------------------------------------------------------------------- numpy oracle
def _np_policy(batch, logits):
    mask = np_(batch["mask"]).astype(bool)
    p = masked_softmax(logits, mask)
    log_p = np.log(np.where(mask, p, 1.0))
    return p, log_p, mask


def np_ppo_losses(actor, critic, batch, clip_eps, vf_coef, ent_coef) -> dict:
    """Every key of ``ppo.losses`` plus the pieces the gradient oracles need."""
    p, log_p, mask = _np_policy(batch, np_(actor.table))
    rows, act = np.arange(len(p)), np_(batch["action"]).astype(int)
    new, old, adv = log_p[rows, act], np_(batch["old_log_prob"]), np_(batch["advantage"])
    r = np.exp(new - old)
    r_clip = np.clip(r, 1.0 - clip_eps, 1.0 + clip_eps)
    h = -np.where(mask, p * log_p, 0.0).sum(-1)
    err = np_(critic.table) - np_(batch["return"])
    # (least, greatest) share: a ratio within the rounding of the batch's dtype of 1 ± ε may count either way
    band = ratio_band(r, new, old, torch.finfo(batch["old_log_prob"].dtype).eps)
    clipped = np_clip_fraction_bounds(r, clip_eps, convention("clip_fraction"), adv, band)
    kl = np.mean(old - new) if convention("approx_kl") == "k1" else np.mean(np.expm1(new - old) - (new - old))
    factor = convention("value_loss_factor")
    return {"loss_objective": -np.mean(np.minimum(r * adv, r_clip * adv)),
            "loss_critic": vf_coef * factor * np.mean(err**2), "loss_entropy": -ent_coef * np.mean(h),
            "entropy": np.mean(h), "clip_fraction": clipped, "kl_approx": kl,
            "p": p, "log_p": log_p, "mask": mask, "r": r, "band": band, "adv": adv, "h": h, "err": err,
            "factor": factor}


# ----------------------------------------------------------------------------- inputs
@st.composite
def minibatches(draw, dtype):
    """Table actor [N,A] logits and critic [N] values, obs = row i, a legal stored action per row, an old
    log-prob off the current one by up to ±0.6 nats (ratios inside and outside the clip range)."""
    n, a = draw(st_.batch_shapes(max_batch=8, min_actions=2, max_actions=6))
    logits = draw(st_.tensors((n, a), lo=-3.0, hi=3.0, dtype=dtype))
    mask = draw(st_.legal_masks((n, a))) if masks_supported() else torch.ones(n, a, dtype=torch.bool)
    action = torch.tensor([draw(st.sampled_from(np.flatnonzero(to_numpy(row)).tolist())) for row in mask])
    p = masked_softmax(np_(logits), np_(mask).astype(bool))
    log_now = np.log(p[np.arange(n), to_numpy(action)])
    shift = np.array(draw(st.lists(st.floats(-0.6, 0.6), min_size=n, max_size=n)))
    batch = {"obs": torch.arange(n), "action": action, "mask": mask,
             "old_log_prob": torch.tensor(log_now + shift, dtype=dtype),
             "advantage": draw(st_.tensors((n,), lo=-2.0, hi=2.0, dtype=dtype)),
             "return": draw(st_.tensors((n,), lo=-2.0, hi=2.0, dtype=dtype))}
    critic = _table(draw(st_.tensors((n,), lo=-2.0, hi=2.0, dtype=dtype)))
    kw = {"clip_eps": draw(st.sampled_from([0.1, 0.2, 0.3])), "vf_coef": draw(st.floats(0.1, 1.0)),
          "ent_coef": draw(st.floats(0.0, 0.1))}
    return _table(logits), critic, batch, pin("ppo.losses", kw)


def _away_from_clip_edges(want: dict, clip_eps: float) -> bool:
    """No ratio within 1e-6 (or the rounding of the batch's dtype) of 1 ± ε, where the min() and the clamp
    switch branch (their gradient there is a subgradient choice, not a clause)."""
    return bool(np.all(np.abs(np.abs(want["r"] - 1.0) - clip_eps) > np.maximum(want["band"], 1e-6)))


# ----------------------------------------------------------------------------- values
@pytest.mark.clause(CLAUSE)
@given(st.data())
def test_losses_values_match_the_composed_clauses(ppo, data):
    actor, critic, batch, kw = data.draw(minibatches(working_dtype()))
    out = ppo.losses(actor, critic, batch, **kw)
    want = np_ppo_losses(actor, critic, batch, **kw)
    for key in required_outputs("ppo.losses"):
        if key == "clip_fraction":
            assert_between(out[key], *want[key], CLAUSE, what=key)
        else:
            assert_close(out[key], want[key], CLAUSE, what=key)
    total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
    assert_close(total, want["loss_objective"] + want["loss_critic"] + want["loss_entropy"], CLAUSE,
                 what="loss_objective + loss_critic + loss_entropy (the PPO-LOSS-3 total)")


@pytest.mark.clause(CLAUSE)
def test_losses_golden_at_the_old_policy(ppo):
    # at the old policy every ratio is 1: objective −mean A, no clip, KL 0; uniform legal rows of 2 and 3 actions
    dt = working_dtype()
    logits = torch.zeros(2, 3, dtype=dt)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    mask = mask if masks_supported() else torch.ones_like(mask)
    n_legal = mask.sum(-1).to(dt)
    batch = {"obs": torch.arange(2), "action": torch.tensor([1, 0]), "mask": mask, "old_log_prob": -torch.log(n_legal),
             "advantage": torch.tensor([1.0, -3.0], dtype=dt), "return": torch.tensor([1.0, 0.0], dtype=dt)}
    out = ppo.losses(_table(logits), _table(torch.tensor([0.0, 2.0], dtype=dt)), batch,
                     clip_eps=0.2, vf_coef=0.5, ent_coef=0.01)
    h = float(torch.log(n_legal).mean())
    factor = convention("value_loss_factor")
    expected = {"loss_objective": 1.0, "loss_critic": 0.5 * factor * (1.0 + 4.0) / 2, "loss_entropy": -0.01 * h,
                "entropy": h, "clip_fraction": 0.0, "kl_approx": 0.0}
    for key, value in expected.items():
        assert_close(out[key], value, CLAUSE, what=key)


@pytest.mark.clause(CLAUSE)
def test_losses_entropy_is_over_the_legal_set(ppo):
    require_masks()
    dt = working_dtype()
    # legal π = (¼, ¾), the illegal logit is the largest
    logits = torch.tensor([[0.0, float(np.log(3.0)), 30.0]], dtype=dt)
    batch = {"obs": torch.arange(1), "action": torch.tensor([1]), "mask": torch.tensor([[True, True, False]]),
             "old_log_prob": torch.tensor([float(np.log(0.75))], dtype=dt), "advantage": torch.tensor([1.0], dtype=dt),
             "return": torch.tensor([0.0], dtype=dt)}
    out = ppo.losses(_table(logits), _table(torch.zeros(1, dtype=dt)), batch, clip_eps=0.2, vf_coef=0.5,
                     ent_coef=0.01)
    h = -(0.25 * np.log(0.25) + 0.75 * np.log(0.75))
    assert_close(out["entropy"], h, CLAUSE, what="legal-set entropy")
    assert_close(out["loss_objective"], -1.0, CLAUSE, what="ratio 1 at the stored action")


# ----------------------------------------------------------------------------- gradients
def _grad_case(ppo, data):
    require_differentiable("ppo.losses")
    actor, critic, batch, kw = data.draw(minibatches(working_dtype()))
    batch = {k: (v.clone().requires_grad_(True) if v.is_floating_point() else v) for k, v in batch.items()}
    return actor, critic, batch, kw, ppo.losses(actor, critic, batch, **kw), np_ppo_losses(actor, critic, batch, **kw)


@pytest.mark.clause(CLAUSE)
@given(st.data())
def test_loss_objective_gradient_reaches_only_the_actor(ppo, data):
    actor, critic, batch, kw, out, want = _grad_case(ppo, data)
    # isolation holds on every example, the clip edges included
    assert_no_grad_into(out["loss_objective"], CLAUSE, critic=critic.table, old_log_prob=batch["old_log_prob"],
                        advantage=batch["advantage"])
    if not _away_from_clip_edges(want, kw["clip_eps"]):
        return  # at 1 ± ε the gradient is a subgradient choice no clause fixes; the value test covers it
    eps, r, adv = kw["clip_eps"], want["r"], want["adv"]
    inside = np.abs(r - 1.0) <= eps
    active = inside | (r * adv < np.clip(r, 1 - eps, 1 + eps) * adv)  # the unclipped term is the min
    d_new = -np.where(active, r * adv, 0.0) / len(r)  # ∂L/∂ log π_new(a)
    onehot = np.eye(want["p"].shape[1])[np_(batch["action"]).astype(int)]
    expected = d_new[:, None] * np.where(want["mask"], onehot - want["p"], 0.0)
    assert_close(grad_of(out["loss_objective"], actor.table), expected, CLAUSE, approx="gradient",
                 what="d loss_objective / d logits table")


@pytest.mark.clause(CLAUSE)
@given(st.data())
def test_loss_critic_gradient_reaches_only_the_critic(ppo, data):
    actor, critic, batch, kw, out, want = _grad_case(ppo, data)
    expected = kw["vf_coef"] * want["factor"] * 2.0 * want["err"] / len(want["err"])
    assert_close(grad_of(out["loss_critic"], critic.table), expected, CLAUSE, approx="gradient",
                 what="d loss_critic / d values table")
    assert_no_grad_into(out["loss_critic"], CLAUSE, actor=actor.table, **{"return": batch["return"]})


@pytest.mark.clause(CLAUSE)
@given(st.data())
def test_loss_entropy_gradient_raises_the_legal_entropy(ppo, data):
    actor, critic, batch, kw, out, want = _grad_case(ppo, data)
    # ∂H/∂z_j = −π_j (log π_j + H) on legal j; loss_entropy = −c_e mean H
    p, log_p, h, mask = want["p"], want["log_p"], want["h"], want["mask"]
    expected = kw["ent_coef"] * np.where(mask, p * (log_p + h[:, None]), 0.0) / len(h)
    assert_close(grad_of(out["loss_entropy"], actor.table), expected, CLAUSE, approx="gradient",
                 what="d loss_entropy / d logits table")
    assert_no_grad_into(out["loss_entropy"], CLAUSE, critic=critic.table)
