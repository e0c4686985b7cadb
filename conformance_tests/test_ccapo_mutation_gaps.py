"""CCAPO tests written to kill mutants that survived the mutation run (tools/mutation/, docs/mutation/).

Each test names the surviving mutant class it closes; the oracle is the loop oracle of
test_ccapo_objective.py (plain Python over the steps), never the implementation.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conformance_tests.harness import assert_close, reported
from conformance_tests.test_ccapo_objective import np_objective
from rlconform.spec import default_spec

F64 = torch.float64

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


# Mutant class: a keyword default that differs from the spec's (`beta_kl: float = 0.04` -> 1.04).
@pytest.mark.clause("CCAPO-DEFAULT-4", "CCAPO-PPO-1", "CCAPO-PPO-2")
def test_policy_loss_defaults_are_the_spec_clip_and_kl_weight(ccapo):
    spec = default_spec().clause("CCAPO-DEFAULT-4").value
    clip, beta = float(spec["clip_eps"]), float(spec["beta_kl"])
    surr, kl = np_objective(NEW, OLD, REF, ADV, MASK, clip=clip, beta=beta)
    out = _call(ccapo)
    assert_close(out["loss"], -(surr - beta * kl), "CCAPO-PPO-1", what="loss with clip_eps and beta_kl at their defaults")
    assert_close(out["loss_clip"], -surr, "CCAPO-PPO-1", what="loss_clip with clip_eps at its default")


# Mutant class: a reported term computed with the wrong weight while the total stays right.
@pytest.mark.clause("CCAPO-PPO-2")
@pytest.mark.parametrize("beta", [0.0, 0.04, 0.7])
def test_loss_kl_is_the_weighted_kl_and_completes_the_loss(ccapo, beta):
    surr, kl = np_objective(NEW, OLD, REF, ADV, MASK, clip=0.2, beta=beta)
    out = _call(ccapo, clip_eps=0.2, beta_kl=beta)
    assert_close(out["loss_kl"], beta * kl, "CCAPO-PPO-2", what="loss_kl = beta_KL * KL")
    assert_close(out["loss"], -surr + beta * kl, "CCAPO-PPO-2", what="loss = loss_clip + loss_kl")


# Mutant class: a trajectory with no real step (a padding row) counted in the mean over trajectories
# (`has = steps > 0` -> `>= 0`): its (1/T) sum is undefined, so it must leave the average untouched.
@pytest.mark.clause("CCAPO-PPO-1", "CCAPO-PPO-2")
@pytest.mark.parametrize("where", [0, 1, 2])
def test_padding_rows_leave_the_trajectory_mean_unchanged(ccapo, where):
    surr, kl = np_objective(NEW, OLD, REF, ADV, MASK, clip=0.2, beta=0.04)
    pad = lambda a, fill: np.insert(a, where, fill, axis=0)  # noqa: E731 - one padding row at `where`
    t = [torch.tensor(pad(a, -0.3), dtype=F64) for a in (NEW, OLD, REF, ADV)]
    out = ccapo.policy_loss(*t, torch.tensor(pad(MASK, False)), clip_eps=0.2, beta_kl=0.04)
    assert_close(out["loss"], -(surr - 0.04 * kl), "CCAPO-PPO-1", what="loss with an all-padding trajectory added")
    assert_close(out["kl_ref"], kl, "CCAPO-PPO-2", what="kl_ref with an all-padding trajectory added")


# Mutant class: a batch with no real step at all falls through to an ill-defined value (0/0, or the
# sum of the padding). It must be rejected or give exactly 0, never NaN or a number the padding made.
@pytest.mark.clause("CCAPO-PPO-1", "CCAPO-PPO-2")
def test_all_padding_batch_gives_zero_or_is_rejected(ccapo):
    t = [torch.tensor(a, dtype=F64) for a in (NEW, OLD, REF, ADV)]
    try:
        out = ccapo.policy_loss(*t, torch.zeros(MASK.shape, dtype=torch.bool))
    except Exception:  # noqa: BLE001 - rejecting an empty batch is allowed
        return
    for key in ("loss", "loss_clip", "kl_ref"):
        assert_close(out[key], 0.0, "CCAPO-PPO-1", dtype=F64, what=f"{key} of a batch with no real step")


# Mutant class: the clip range check admits clip_eps >= 1 (the upper end must be open).
@pytest.mark.clause("CCAPO-INPUT-5")
@pytest.mark.parametrize("clip_eps", [1.0, 1.5])
def test_clip_eps_of_one_or_more_rejected(ccapo, clip_eps):
    from conformance_tests.harness import assert_rejects

    t = [torch.tensor(a, dtype=F64) for a in (NEW, OLD, REF, ADV)]
    assert_rejects("CCAPO-INPUT-5", ccapo.raw("policy_loss"), *t, torch.tensor(MASK), clip_eps=clip_eps)


# Mutant class: a diagnostic computed from a shifted ratio (r + 1, r - 2). The estimator-free core of the
# approx_kl and clip_fraction conventions (spec/conventions.yaml): both are exactly 0 when every ratio is 1.
# One test per diagnostic: a library that does not report one (TRL has no approx_kl) is not applicable for
# that check only.
@pytest.mark.clause("CCAPO-PPO-1")
@pytest.mark.parametrize("key", ["approx_kl", "clip_fraction"])
def test_diagnostics_are_zero_when_every_ratio_is_one(ccapo, key):
    t = [torch.tensor(a, dtype=F64) for a in (NEW, NEW, REF, ADV)]  # logp_old = logp_new
    out = ccapo.policy_loss(*t, torch.tensor(MASK), clip_eps=0.2, beta_kl=0.04)
    assert_close(reported(out, key, "ccapo.policy_loss"), 0.0, "CCAPO-PPO-1", dtype=F64,
                 what=f"{key} with every ratio 1")


# Mutant class: `|r - 1| > eps` -> `>=`. A ratio exactly on the edge of [1 - eps, 1 + eps] is inside it.
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


# Mutant class: the macro advantage's eps default changed (1e-8 -> 2e-8). CCAPO-MACRO-1 states eps = 1e-8;
# returns spread by ~1e-8 make eps comparable to the std. Such a spread exists only in float64.
@pytest.mark.clause("CCAPO-MACRO-1")
def test_macro_advantage_default_eps_on_a_tiny_spread(ccapo):
    from conformance_tests.harness import convention, np_standardise, require_dtype

    require_dtype(F64)
    r = np.array([1.0, 1.0 + 2e-8, 1.0 - 1e-8, 1.0 + 4e-8])
    # the seed's eps 1e-8 and population std, or the declared advantage_std convention
    want = np_standardise(r, convention("advantage_std", "CCAPO-MACRO-1"))
    assert_close(ccapo.macro_advantage(torch.tensor(r, dtype=F64)), want, "CCAPO-MACRO-1", approx="reduction",
                 what="macro_advantage without eps on returns 1e-8 apart")


# Mutant class: the group-dimension guard's `or` -> `and`: a 0-d tensor or an empty group must be rejected
# as bad input naming CCAPO-INPUT-3, not fail later on indexing or on an empty reduction.
@pytest.mark.clause("CCAPO-INPUT-3")
@pytest.mark.parametrize("returns", [torch.tensor(1.5, dtype=F64), torch.zeros(2, 0, dtype=F64)], ids=["0-d", "empty group"])
def test_macro_advantage_rejects_a_missing_or_empty_group(ccapo, returns):
    from conformance_tests.harness import assert_rejects

    assert_rejects("CCAPO-INPUT-3", ccapo.raw("macro_advantage"), returns)


# Mutant class: the fingerprint guard's `or` -> `and`: a 0-d id tensor has no step axis and must be rejected
# as bad input naming CCAPO-INPUT-3.
@pytest.mark.clause("CCAPO-INPUT-3")
def test_loop_mask_rejects_ids_without_a_step_axis(ccapo):
    from conformance_tests.harness import assert_rejects

    assert_rejects("CCAPO-INPUT-3", ccapo.raw("loop_mask"), torch.tensor(7))
