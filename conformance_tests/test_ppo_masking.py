"""PPO §2-§4: masking on logits, legal sampling with a cached detached old log-prob, replay of the
stored action under the stored mask, log-prob and entropy from one distribution, low precision."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import logsumexp

from conformance_tests import oracles
from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_close,
    assert_equal,
    assert_low_precision,
    assert_rejects,
    assert_that,
    convention,
    declares,
    fits,
    generator,
    host,
    not_applicable,
    on_device,
    slack,
    to_numpy,
    working_dtype,
)


def np_masked_log_softmax(z, mask) -> np.ndarray:
    """Log-softmax over the True entries of each row (−inf elsewhere), float64."""
    z, mask = oracles.np_(z), oracles.np_(mask).astype(bool)
    zz = np.where(mask, z, -np.inf)
    return zz - logsumexp(zz, axis=-1, keepdims=True)


def np_masked_entropy(z, mask) -> np.ndarray:
    lp = np_masked_log_softmax(z, mask)
    safe = np.where(np.isfinite(lp), lp, 0.0)  # illegal entries contribute exactly 0
    return -(np.exp(safe) * safe * np.isfinite(lp)).sum(-1)


def assert_illegal_fill(got: torch.Tensor, dtype: torch.dtype, clause: str) -> None:
    """Illegal logits under the mask_fill convention. The seed (undeclared): exactly -1e9, or the dtype's most
    negative finite value where -1e9 does not fit. Declared "finite" (or "eps_clip", which leaves the logits
    finite): any finite fill at or below that, so the illegal probability is 0. "neg_inf": -inf."""
    seed_fill = torch.tensor(fits(-1e9, dtype), dtype=dtype).double()
    fill, got = convention("mask_fill"), got.double()
    if fill == "neg_inf":
        assert_equal(got, torch.full_like(got, float("-inf")), clause, "illegal logits hold -inf")
    elif declares("mask_fill"):
        assert_that(torch.isfinite(got) & (got <= seed_fill), clause, got, f"finite illegal logits <= {seed_fill.item():g}")
    else:
        assert_equal(got, torch.full_like(got, seed_fill.item()), clause, "illegal logits hold the -1e9 fill")


def legal_actions(mask: torch.Tensor, data) -> torch.Tensor:
    """One legal action per row, drawn by hypothesis."""
    return torch.tensor([data.draw(st.sampled_from(torch.nonzero(row).flatten().tolist())) for row in mask])


# ----------------------------------------------------------------------------- PPO-MASK-1
@pytest.mark.clause("PPO-MASK-1")
@given(st_.logits_and_masks())
def test_masked_logits_fill_illegal_and_keep_legal(ppo, zm):
    z, mask = zm
    got = ppo.masked_logits(z, mask)
    assert_equal(got[mask], z[mask], "PPO-MASK-1", "legal logits unchanged")
    assert_illegal_fill(got[~mask], z.dtype, "PPO-MASK-1")


@pytest.mark.clause("PPO-MASK-1")
@given(st_.logits_and_masks())
def test_masked_distribution_is_softmax_over_the_legal_set(ppo, zm):
    z, mask = zm
    dist = ppo.masked_distribution(z, mask)
    assert_close(dist.probs, oracles.masked_softmax(to_numpy(z), to_numpy(mask)), "PPO-MASK-1")


@pytest.mark.clause("PPO-MASK-1")
def test_masked_distribution_golden(ppo):
    # logits [1, 2, 3] with the middle action illegal: softmax over {1, 3}
    z = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    mask = torch.tensor([[True, False, True]])
    e2 = math.exp(2.0)
    assert_close(ppo.masked_distribution(z, mask).probs, [[1 / (1 + e2), 0.0, e2 / (1 + e2)]], "PPO-MASK-1")


# Legal logits far below an illegal one: a fill that is only "very negative" (-1e4, a common hand-written
# choice) sits above them and takes the mass; the spec's -1e9 (or -inf) never does at any logit a network
# emits in float32 or float64.
@pytest.mark.clause("PPO-MASK-1")
@pytest.mark.parametrize("scale", [3e4, 1e6])
def test_masked_distribution_ignores_an_illegal_logit_far_above_the_legal_ones(ppo, scale):
    dt = working_dtype()
    if torch.finfo(dt).max < 1e9:
        not_applicable(f"{dt} cannot hold the -1e9 fill below logits of -{scale:g}")
    z = torch.tensor([[-scale, -scale + 1.0, 0.0]], dtype=dt)  # bfloat16 rounds both legal logits to -scale
    mask = torch.tensor([[True, True, False]])
    want = oracles.masked_softmax(to_numpy(z).astype(np.float64), to_numpy(mask))  # of the logits as rounded
    assert_close(ppo.masked_distribution(z, mask).probs, want, "PPO-MASK-1",
                 what=f"legal logits at -{scale:g}, the illegal one at 0")


# ----------------------------------------------------------------------------- PPO-MASK-2
@pytest.mark.clause("PPO-MASK-2")
@given(st_.logits_and_masks(scale=5.0, max_batch=3, max_actions=6), st.integers(0, 2**31 - 1))
def test_sampled_actions_are_legal_and_follow_the_masked_softmax(ppo, zm, seed):
    z, mask = zm
    reps = 2000
    action, _ = ppo.sample_actions(z.repeat(reps, 1), mask.repeat(reps, 1), generator=generator(seed))
    action = host(action).view(reps, -1)
    legal = mask.repeat(reps, 1).gather(1, action.reshape(-1, 1)).view(reps, -1)
    assert_that(legal, "PPO-MASK-2", action, "only actions legal under their mask")
    freq = np.stack([np.bincount(to_numpy(action[:, b]), minlength=z.shape[1]) / reps for b in range(z.shape[0])])
    assert_close(freq, oracles.masked_softmax(to_numpy(z), to_numpy(mask)), "PPO-MASK-2", what="sample frequencies")


@pytest.mark.clause("PPO-MASK-2")
def test_single_legal_action_is_always_sampled(ppo):
    # the §0 log: a 5-action row with one legal action; the illegal ones hold the largest logits
    z = torch.tensor([[9.0, 9.0, -3.0, 9.0, 9.0]] * 64, dtype=torch.float64)
    mask = torch.tensor([[False, False, True, False, False]] * 64)
    action, old = ppo.sample_actions(z, mask, generator=generator(0))
    assert_equal(action, torch.full((64,), 2), "PPO-MASK-2")
    assert_close(old, np.zeros(64), "PPO-MASK-2", what="log-prob of the only legal action")


# ----------------------------------------------------------------------------- PPO-OLD-1 (sampling side)
@pytest.mark.clause("PPO-OLD-1")
@given(st_.logits_and_masks(), st.integers(0, 2**31 - 1))
def test_old_log_prob_is_the_sampling_log_prob_and_detached(ppo, zm, seed):
    z, mask = zm
    z = z.clone().requires_grad_(True)
    action, old = ppo.sample_actions(z, mask, generator=generator(seed))
    assert_that(not old.requires_grad and old.grad_fn is None, "PPO-OLD-1", old, "a tensor without gradient (detached)")
    expected = np_masked_log_softmax(z.detach(), mask)[np.arange(len(action)), to_numpy(action)]
    assert_close(old, expected, "PPO-OLD-1")


# ----------------------------------------------------------------------------- PPO-MASK-3
@pytest.mark.clause("PPO-MASK-3", "PPO-LOGP-1")
@given(st_.logits_and_masks(), st.data())
def test_replay_scores_the_stored_action_under_the_stored_mask(ppo, zm, data):
    z, mask = zm
    action = legal_actions(mask, data)
    new, _ = ppo.evaluate_actions(z, mask, action)
    assert_close(new, np_masked_log_softmax(z, mask)[np.arange(len(action)), to_numpy(action)], "PPO-MASK-3")


@pytest.mark.clause("PPO-MASK-3")
def test_replay_golden_from_the_symptom_log(ppo):
    # §0: five actions, uniform logits, two legal. The stored mask gives -log 2 and entropy log 2;
    # a uniform distribution (another mask) would give -log 5 = -1.609 and entropy log 5.
    z = torch.zeros(2, 5, dtype=torch.float64)
    mask = torch.tensor([[True, False, False, False, True], [False, True, True, False, False]])
    new, ent = ppo.evaluate_actions(z, mask, torch.tensor([4, 1]))
    assert_close(new, [-math.log(2)] * 2, "PPO-MASK-3")
    assert_close(ent, [math.log(2)] * 2, "PPO-MASK-3", what="entropy")


@pytest.mark.clause("PPO-MASK-3")
def test_illegal_replayed_action_is_rejected(ppo):
    z = torch.zeros(3, 5, dtype=torch.float64)
    mask = torch.tensor([[True, False, False, False, True]] * 3)
    assert_rejects("PPO-MASK-3", ppo.raw("evaluate_actions"), z, mask, torch.tensor([0, 1, 4]))


# ----------------------------------------------------------------------------- PPO-LOGP-1
@pytest.mark.clause("PPO-LOGP-1")
@given(st_.logits_and_masks(scale=1e3), st.data())
def test_new_log_prob_is_a_log_softmax_even_at_extreme_logits(ppo, zm, data):
    z, mask = zm
    action = legal_actions(mask, data)
    new, _ = ppo.evaluate_actions(z, mask, action)
    assert_that(torch.isfinite(new), "PPO-LOGP-1", new, "a finite log-prob for every legal action")
    assert_close(new, np_masked_log_softmax(z, mask)[np.arange(len(action)), to_numpy(action)], "PPO-LOGP-1")


@pytest.mark.clause("PPO-LOGP-1")
def test_new_log_prob_golden_far_below_the_max(ppo):
    # π(1) = e^-800 / (1 + e^-800) underflows to 0 in float64: log(probs[1]) is -inf, the log-softmax is -800
    z = torch.tensor([[0.0, -800.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    new, _ = ppo.evaluate_actions(z, mask, torch.tensor([1]))
    assert_close(new, [-800.0], "PPO-LOGP-1")


@pytest.mark.clause("PPO-LOGP-1")
def test_new_log_prob_golden_with_the_largest_logit_illegal(ppo):
    # The largest logit is on the illegal action. Masking first and normalising once gives log ½ and the
    # gradient (½, 0, −½) to the dtype's precision; normalising over every action first (torch's Categorical on
    # the raw logits) and masking after shifts the legal logits by about 513 and back, which in float32 rounds
    # them to the spacing at 513 (6.1e-5): an error of 3e-5, and gradient on the illegal logit.
    dt = working_dtype(torch.float32)
    z = torch.tensor([[0.0, 513.0, 0.0]], dtype=dt, requires_grad=True)
    mask = torch.tensor([[True, False, True]])
    new, _ = ppo.evaluate_actions(z, mask, torch.tensor([0]))
    assert_close(new, [-math.log(2)], "PPO-LOGP-1", dtype=dt, what="log-prob with the largest logit illegal")
    (grad,) = torch.autograd.grad(new.sum(), z)
    assert_close(grad, [[0.5, 0.0, -0.5]], "PPO-LOGP-1", dtype=dt, what="gradient with the largest logit illegal")


@pytest.mark.clause("PPO-LOGP-1")
@given(st_.logits_and_masks(), st.data())
def test_new_log_prob_is_differentiable_in_the_logits(ppo, zm, data):
    z, mask = zm
    action = legal_actions(mask, data)
    z = z.clone().requires_grad_(True)
    new, _ = ppo.evaluate_actions(z, mask, action)
    (grad,) = torch.autograd.grad(new.sum(), z)
    p = oracles.masked_softmax(to_numpy(z), to_numpy(mask))
    expected = -p
    expected[np.arange(len(action)), to_numpy(action)] += 1.0  # d log π(a) / dz = e_a − π
    assert_close(grad, expected, "PPO-LOGP-1", what="gradient")


# ----------------------------------------------------------------------------- PPO-ENT-1
@pytest.mark.clause("PPO-ENT-1")
@given(st_.logits_and_masks(), st.data())
def test_entropy_is_the_masked_distribution_entropy(ppo, zm, data):
    z, mask = zm
    _, ent = ppo.evaluate_actions(z, mask, legal_actions(mask, data))
    assert_close(ent, np_masked_entropy(z, mask), "PPO-ENT-1")
    legal_log = np.log(to_numpy(mask).sum(-1))
    bound = legal_log + slack("PPO-ENT-1", legal_log)  # rounding of the inputs' dtype, as assert_close allows
    assert_that(torch.as_tensor(to_numpy(ent) <= bound), "PPO-ENT-1", ent, "at most log|A(s)|")


@pytest.mark.clause("PPO-ENT-1")
def test_entropy_golden(ppo):
    # π = (1/4, 3/4) on the legal set: H = -(1/4 log 1/4 + 3/4 log 3/4)
    z = torch.tensor([[0.0, 7.0, math.log(3.0)]], dtype=torch.float64)
    mask = torch.tensor([[True, False, True]])
    _, ent = ppo.evaluate_actions(z, mask, torch.tensor([0]))
    assert_close(ent, [-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))], "PPO-ENT-1")


@pytest.mark.clause("PPO-ENT-1", "PPO-MASK-3")
@given(st_.logits_and_masks(), st.data())
def test_distribution_object_agrees_with_evaluate_actions(ppo, zm, data):
    # differential: the distribution operation and the replay operation are one distribution
    z, mask = zm
    action = legal_actions(mask, data)
    dist = ppo.masked_distribution(z, mask)
    new, ent = ppo.evaluate_actions(z, mask, action)
    assert_close(new, dist.log_prob(on_device(action)), "PPO-MASK-3")
    assert_close(ent, dist.entropy(), "PPO-ENT-1")


# ----------------------------------------------------------------------------- PPO-MASK-4
@pytest.mark.clause("PPO-MASK-4")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@given(zm=st_.logits_and_masks(scale=1e3), data=st.data())
def test_masking_holds_in_low_precision(ppo, dtype, zm, data):
    z, mask = zm
    zl = z.to(dtype)
    action = legal_actions(mask, data)
    new, ent = ppo.evaluate_actions(zl, mask, action)
    assert_that(torch.isfinite(new), "PPO-MASK-4", new, f"finite log-probs of legal actions in {dtype}")
    assert_that(torch.isfinite(ent), "PPO-MASK-4", ent, f"finite entropy in {dtype}")
    expected = np_masked_log_softmax(zl.double(), mask)[np.arange(len(action)), to_numpy(action)]
    assert_close(new, expected, "PPO-MASK-4", dtype=dtype, what="log-prob")
    assert_close(ent, np_masked_entropy(zl.double(), mask), "PPO-MASK-4", dtype=dtype, what="entropy")
    probs = ppo.masked_distribution(zl, mask).probs
    assert_that(torch.isfinite(probs) & (probs[~mask] == 0).all(), "PPO-MASK-4", probs, "finite, no mass on illegal actions")
    # the gradient too: d sum log pi(a) / d z = onehot(a) - pi on the legal set, 0 on illegal logits
    x = zl.clone().requires_grad_(True)
    lp, _ = ppo.evaluate_actions(x, mask, action)
    (g,) = torch.autograd.grad(lp.sum(), x)
    pi = np.exp(np_masked_log_softmax(zl.double(), mask))
    onehot = np.eye(z.shape[1])[to_numpy(action)]
    assert_low_precision(g, np.where(to_numpy(mask), onehot - pi, 0.0), "PPO-MASK-4", dtype, "d log pi / d logits")


@pytest.mark.clause("PPO-MASK-4")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_masked_logits_fill_is_finite_in_low_precision(ppo, dtype):
    z = torch.tensor([[1.0, 2.0, 3.0]], dtype=dtype)
    mask = torch.tensor([[True, False, True]])
    got = ppo.masked_logits(z, mask)
    assert_illegal_fill(got[0, 1:2], dtype, "PPO-MASK-4")


@pytest.mark.clause("PPO-MASK-4", "PPO-MASK-2")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_sampling_stays_legal(ppo, dtype):
    z = (torch.arange(40, dtype=torch.float64).view(8, 5) * 300.0).to(dtype)  # illegal logits dominate
    mask = torch.tensor([[True, True, False, False, False]] * 8)
    action, old = ppo.sample_actions(z, mask, generator=generator(1))
    assert_that(mask.gather(1, host(action).view(-1, 1)), "PPO-MASK-2", action, "legal actions in low precision")
    assert_that(torch.isfinite(old), "PPO-MASK-4", old, "finite old log-probs")


# ----------------------------------------------------------------------------- bad input
@pytest.mark.clause("PPO-INPUT-1")
@pytest.mark.parametrize("op", ["masked_logits", "masked_distribution", "sample_actions"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_logits_are_rejected(ppo, op, bad):
    z = torch.tensor([[0.5, bad, 1.0]], dtype=torch.float64)
    if bad == float("-inf") and convention("neg_inf_logits") == "accept":
        return _neg_inf_logit_is_a_zero_probability_action(ppo, op, z)
    assert_rejects("PPO-INPUT-1", ppo.raw(op), z, torch.ones(1, 3, dtype=torch.bool))


def _neg_inf_logit_is_a_zero_probability_action(ppo, op, z):
    """neg_inf_logits "accept" (torch Categorical semantics): -inf is an action of probability exactly 0 and
    the other actions keep their softmax; never NaN (PPO-INPUT-1's normative part)."""
    out = getattr(ppo, op)(z, torch.ones(1, 3, dtype=torch.bool), **({"generator": generator(0)}
                                                                     if op == "sample_actions" else {}))
    if op == "sample_actions":
        action, logp = out
        assert_that(action != 1, "PPO-INPUT-1", action, "never the action whose logit is -inf")
        assert_that(torch.isfinite(logp), "PPO-INPUT-1", logp, "a finite log-prob")
        return
    probs = torch.softmax(out.detach(), -1) if isinstance(out, torch.Tensor) else out.probs.detach()
    want = np.array([[1.0, 0.0, math.e**0.5]]) / (1.0 + math.e**0.5)
    assert_that(probs[0, 1] == 0, "PPO-INPUT-1", probs, "probability exactly 0 for the -inf logit")
    assert_close(probs, want, "PPO-INPUT-1", approx="reduction", what="softmax of the finite logits")


@pytest.mark.clause("PPO-INPUT-1")
def test_non_finite_logits_are_rejected_at_replay(ppo):
    z = torch.tensor([[0.5, float("nan"), 1.0]], dtype=torch.float64)
    assert_rejects("PPO-INPUT-1", ppo.raw("evaluate_actions"), z, torch.ones(1, 3, dtype=torch.bool), torch.tensor([0]))


@pytest.mark.clause("PPO-INPUT-2")
@pytest.mark.parametrize("op", ["masked_logits", "masked_distribution", "sample_actions"])
@pytest.mark.parametrize("case", ["empty_row", "shape", "not_bool"])
def test_bad_masks_are_rejected(ppo, op, case):
    z = torch.zeros(2, 3, dtype=torch.float64)
    mask = {
        "empty_row": torch.tensor([[True, False, False], [False, False, False]]),
        "shape": torch.ones(2, 4, dtype=torch.bool),
        "not_bool": torch.ones(2, 3, dtype=torch.float64),
    }[case]
    assert_rejects("PPO-INPUT-2", ppo.raw(op), z, mask)


@pytest.mark.clause("PPO-INPUT-3")
@pytest.mark.parametrize("action", [[0, 5], [-1, 0], [0]])
def test_action_outside_the_action_space_is_rejected(ppo, action):
    z = torch.zeros(2, 5, dtype=torch.float64)
    mask = torch.ones(2, 5, dtype=torch.bool)
    assert_rejects("PPO-INPUT-3", ppo.raw("evaluate_actions"), z, mask, torch.tensor(action))
