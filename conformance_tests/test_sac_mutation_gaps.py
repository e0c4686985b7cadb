"""SAC tests written to kill mutants that survived the mutation run (tools/mutation/, docs/mutation/).

Each test names the surviving mutant class it closes; the oracles are closed forms in numpy/scipy.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import logsumexp

from conformance_tests.harness import assert_close, convention
from rlconform.spec import default_spec

F64 = torch.float64


def spec_default(clause: str, key: str) -> float:
    """A default's value as the spec states it (never the implementation's own table)."""
    return float(default_spec().clause(clause).value[key])


# A batch of three rows over four actions with distinct Q values, the taken actions spread over the row.
Q = np.array([[0.3, -1.2, 2.0, 0.7], [1.5, 0.1, -0.4, 3.2], [-2.0, 0.9, 0.0, 1.1]])
ACTIONS = np.array([2, 0, 3])
LEGAL = np.array([[True, True, True, False], [True, False, True, True], [False, True, True, True]])


def np_cql(q: np.ndarray, actions: np.ndarray, lam: float, legal: np.ndarray | None = None) -> float:
    """lam (mean over rows of the log-sum-exp over the legal set - mean Q at the taken action)."""
    lse = logsumexp(np.where(legal, q, -np.inf) if legal is not None else q, axis=-1)
    return lam * (lse.mean() - q[np.arange(len(actions)), actions].mean())


# ----------------------------------------------------------------------------- keyword defaults
# Mutant class: a keyword default that differs from the spec's default (`lam: float = 0.5` -> 1.5). Every
# other test passes the keyword, so only a call that omits it sees the default.
@pytest.mark.clause("SAC-DEFAULT-8", "SAC-CQL-1")
@pytest.mark.parametrize("legal", [None, LEGAL], ids=["all-actions", "legal-set"])
def test_cql_penalty_default_weight_is_lambda_cql(sac, legal):
    mask = None if legal is None else torch.tensor(legal)
    got = sac.cql_penalty(torch.tensor(Q, dtype=F64), torch.tensor(ACTIONS), legal_mask=mask)
    assert_close(got, np_cql(Q, ACTIONS, spec_default("SAC-DEFAULT-8", "lambda_cql"), legal), "SAC-CQL-1",
                 what="cql_penalty without lam (the default must be lambda_CQL = 0.5)")


PROBS = np.array([[0.5, 0.3, 0.2, 0.0], [0.1, 0.0, 0.6, 0.3], [0.0, 0.25, 0.25, 0.5]])
Q2 = Q + np.array([[0.4, -0.3, 0.1, 0.0], [-0.2, 0.5, 0.3, -0.6], [0.2, -0.1, 0.4, 0.3]])
DEMO = np.array([True, False, True])
Y = np.array([1.0, -0.5, 2.5])


def np_huber(x: np.ndarray, delta: float = 1.0) -> np.ndarray:
    return np.where(np.abs(x) <= delta, 0.5 * x ** 2, delta * (np.abs(x) - 0.5 * delta))


def np_bc(probs: np.ndarray, actions: np.ndarray, demo: np.ndarray, lam: float) -> float:
    nll = -np.log(probs[np.arange(len(actions)), actions])
    return lam * nll[demo].mean() if demo.any() else 0.0


def np_policy_option_a(probs: np.ndarray, q1: np.ndarray, q2: np.ndarray, legal: np.ndarray, alpha: float) -> float:
    p = np.where(legal, probs, 1.0)  # log 1 = 0 keeps illegal entries out of the sum below
    return float(np.mean(np.sum(np.where(legal, probs * (alpha * np.log(p) - np.minimum(q1, q2)), 0.0), -1)))


def _t(a, dtype=F64):
    return torch.tensor(a, dtype=dtype) if np.asarray(a).dtype.kind == "f" else torch.tensor(a)


@pytest.mark.clause("SAC-DEFAULT-7", "SAC-BC-1")
def test_bc_loss_default_weight_is_lambda_bc(sac):
    probs = np.clip(PROBS, 1e-8, None)
    got = sac.bc_loss(_t(np.log(probs)), _t(ACTIONS), _t(DEMO))
    assert_close(got, np_bc(probs, ACTIONS, DEMO, spec_default("SAC-DEFAULT-7", "lambda_bc")), "SAC-BC-1",
                 what="bc_loss without lam (the default must be lambda_BC = 0.1)")


@pytest.mark.clause("SAC-DEFAULT-8", "SAC-CRITIC-2")
def test_critic_loss_total_defaults_add_cql_with_lambda_cql(sac):
    """use_cql defaults to on, lam_cql to lambda_CQL, and the log-sum-exp runs over every action."""
    rows = np.arange(len(ACTIONS))
    lam = spec_default("SAC-DEFAULT-8", "lambda_cql")
    want = (np.mean(np_huber(Q[rows, ACTIONS] - Y) + np_huber(Q2[rows, ACTIONS] - Y))
            + np_cql(Q, ACTIONS, lam) + np_cql(Q2, ACTIONS, lam))
    got = sac.critic_loss_total(_t(Q), _t(Q2), _t(ACTIONS), _t(Y))
    assert_close(got, want, "SAC-CRITIC-2", what="critic_loss_total with every keyword at its default")


@pytest.mark.clause("SAC-DEFAULT-7", "SAC-POL-3")
def test_policy_loss_total_default_bc_weight_is_lambda_bc(sac):
    probs, alpha = np.clip(PROBS, 1e-8, None), 0.3
    legal = PROBS > 0
    want = np_policy_option_a(probs, Q, Q2, legal, alpha) + np_bc(probs, ACTIONS, DEMO, spec_default("SAC-DEFAULT-7", "lambda_bc"))
    got = sac.policy_loss_total(_t(probs), _t(Q), _t(Q2), _t(legal), _t(ACTIONS), _t(DEMO), alpha=alpha)
    assert_close(got, want, "SAC-POL-3", what="policy_loss_total without lam_bc or p (option A plus BC at lambda_BC)")


@pytest.mark.clause("SAC-DEFAULT-3", "SAC-TEMP-3")
@pytest.mark.parametrize("alpha", [1e-7, 0.5, 50.0])
def test_clamp_log_alpha_default_range_is_the_spec_range(sac, alpha):
    lo, hi = spec_default("SAC-DEFAULT-3", "alpha_min"), spec_default("SAC-DEFAULT-3", "alpha_max")
    got = sac.clamp_log_alpha(torch.tensor(np.log(alpha), dtype=F64))
    assert_close(got, np.log(min(max(alpha, lo), hi)), "SAC-TEMP-3", what=f"clamp_log_alpha(log {alpha}) at the default range")


# ----------------------------------------------------------------------------- errors name known clauses
# Mutant class: a guard labels its error with a clause id that does not exist ("XXSAC-CRITIC-1XX"). The
# harness only looks for the expected id as a substring, which such a label still contains.
@pytest.mark.clause("SAC-INPUT-2", "SAC-CRITIC-1")
def test_critic_loss_shape_error_names_a_known_clause_exactly(sac):
    import re

    from conformance_tests.harness import assert_rejects, assert_that, capability

    z = torch.zeros(3, dtype=F64)
    raised = assert_rejects("SAC-CRITIC-1", sac.raw("critic_loss"), z, z, torch.zeros(4, dtype=F64))
    if capability("errors_name_clauses", False):
        named = re.findall(r"\[([A-Za-z0-9-]+)\]", str(raised))
        known = default_spec().clauses
        assert_that(bool(named) and all(c in known for c in named) and "SAC-CRITIC-1" in named, "SAC-INPUT-2",
                    str(raised), "an error labelled [SAC-CRITIC-1], every bracketed id a clause of the spec")


# Mutant class: a shape guard weakened (`or` -> `and`) so that a wrong-rank input slips past it and fails
# later with an error that names no clause.
@pytest.mark.clause("SAC-INPUT-2", "SAC-NCE-4")
def test_nce_queue_push_rejects_keys_of_the_wrong_rank(sac):
    from conformance_tests.harness import assert_rejects

    assert_rejects("SAC-NCE-4", sac.raw("nce_queue_push"), torch.zeros(2, 1, dtype=F64),
                   torch.tensor([1.0, 2.0, 3.0], dtype=F64), capacity=4)


# Mutant class: the coverage's n-gram order or window default changed (n = 3 -> 4, W = 64 -> 65). Texts of
# 70 characters over three letters, where both defaults move the value.
def brute_coverage(agent: str, ref: str, n: int, window: int) -> float:
    """Share of the agent's n-grams (with multiplicity) in its last `window` characters found in the reference's."""
    a, r = agent[len(agent) - window:], ref[len(ref) - window:]
    grams = [a[i:i + n] for i in range(len(a) - n + 1)]
    ref_grams = {r[i:i + n] for i in range(len(r) - n + 1)}
    return float(np.mean([g in ref_grams for g in grams])) if grams else 0.0


@pytest.mark.clause("SAC-DEFAULT-9", "SAC-COV-1")
def test_ngram_coverage_default_order_and_window(sac):
    rng = np.random.default_rng(0)
    agent, ref = ("".join(rng.choice(list("abc"), 70)) for _ in range(2))
    n, window = int(spec_default("SAC-DEFAULT-9", "ngram_n")), int(spec_default("SAC-DEFAULT-9", "window"))
    assert_close(sac.ngram_coverage(agent, ref), brute_coverage(agent, ref, n, window), "SAC-COV-1",
                 dtype=F64, what="ngram_coverage with n and the window at their defaults")


# Mutant class: the InfoNCE temperature default changed (0.07 -> 1.07).
@pytest.mark.clause("SAC-DEFAULT-9", "SAC-NCE-1")
def test_info_nce_default_temperature(sac):
    rng = np.random.default_rng(1)
    q, pos, neg = rng.normal(size=(3, 4)) * 0.3, rng.normal(size=(3, 4)) * 0.3, rng.normal(size=(3, 5, 4)) * 0.3
    tau = spec_default("SAC-DEFAULT-9", "nce_tau")
    s_pos = (q * pos).sum(-1) / tau
    s_all = np.concatenate([s_pos[:, None], np.einsum("bd,bkd->bk", q, neg) / tau], axis=1)
    want = s_pos - logsumexp(s_all, axis=1)
    got = sac.info_nce(*(torch.tensor(x, dtype=F64) for x in (q, pos, neg)))
    assert_close(got, want, "SAC-NCE-1", approx="reduction", what="info_nce with tau at its default")


# Mutant class: the max shift's sign flipped (z - max z -> z + max z). Softmax is shift-invariant, so only
# rounding tells them apart: float32 holds 1e7 and 1e7 + 1 exactly but not 2e7 + 1 (spacing 2 above 2^24).
@pytest.mark.clause("SAC-MASK-1")
def test_masked_softmax_shift_keeps_large_logits_apart(sac):
    from conformance_tests.harness import require_dtype

    require_dtype(torch.float32)
    logits = torch.tensor([[1e7, 1e7 + 1.0, 5.0]], dtype=torch.float32)
    legal = torch.tensor([[True, True, False]])
    p1 = 1.0 / (1.0 + np.exp(-1.0))  # softmax of the legal pair, whose logits differ by exactly 1
    want = np.array([[1.0 - p1, p1, spec_default("SAC-DEFAULT-9", "prob_eps")]])
    assert_close(sac.masked_softmax(logits, legal), want, "SAC-MASK-1", dtype=torch.float32,
                 what="masked_softmax of legal logits 1e7 and 1e7 + 1 in float32")


# Mutant class: the <eos> index range check widened to [0, V] (`<` -> `<=`); index V then fails on indexing
# with an error that names no clause instead of being rejected as bad input.
@pytest.mark.clause("SAC-LEGAL-1")
@pytest.mark.parametrize("eos_index", [-1, 5, 6])
def test_legal_set_rejects_an_eos_index_outside_the_vocabulary(sac, eos_index):
    from conformance_tests.harness import assert_rejects

    comp = torch.tensor([[True, False, True, True, False], [False, False, False, False, True]])
    assert_rejects("SAC-LEGAL-1", sac.raw("legal_set"), comp, eos_index=eos_index, fallback=torch.ones(5, dtype=torch.bool))


# Mutant class: the entropy target's kappa default changed (0.9 -> 1.9).
@pytest.mark.clause("SAC-DEFAULT-3", "SAC-ENT-1")
def test_target_entropy_default_kappa(sac):
    legal = torch.tensor([[True, True, False, True], [True, False, False, False], [True, True, True, True]])
    counts = [3.0, 1.0, 4.0] if convention("target_entropy") == "per_state_legal" else [4.0] * 3  # "scalar": κ log|A|
    want = spec_default("SAC-DEFAULT-3", "kappa") * np.log(counts)
    # a bool mask carries no float dtype: the result may come in float32, so float32's tolerance applies
    assert_close(sac.target_entropy(legal), want, "SAC-ENT-1", dtype=torch.float32, what="target_entropy without kappa")


# Mutant class: the shaping discount's range widened at the top (gamma = 1 admitted, or [1, 2) admitted).
# SAC-INPUT-4: a gamma outside (0, 1) raises.
@pytest.mark.clause("SAC-INPUT-4")
@pytest.mark.parametrize("gamma", [1.0, 1.5])
def test_shaped_reward_rejects_gamma_of_one_or_more(sac, gamma):
    from conformance_tests.harness import assert_rejects

    t = torch.tensor([0.5, -1.0], dtype=F64)
    assert_rejects("SAC-INPUT-4", sac.raw("shaped_reward"), t, t, t, torch.tensor([0.0, 1.0], dtype=F64), gamma=gamma)
