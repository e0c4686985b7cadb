"""SAC §5/§14 and the target networks: EMA updates, PopArt, InfoNCE, coverage, bigram bonus,
step reward, potential shaping."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import logsumexp

from conformance_tests import strategies as st_
from conformance_tests.harness import assert_close, assert_equal, assert_that
from conformance_tests.oracles import info_nce as np_info_nce
from conformance_tests.oracles import np_
from conformance_tests.test_sac_losses import spec_default

F64 = torch.float64


def _pair(shape=(5,)):
    return st.tuples(st_.tensors(shape), st_.tensors(shape))


# ----------------------------------------------------------------------------- target networks
@pytest.mark.clause("SAC-TARGET-1")
@given(_pair(), st.floats(1e-4, 1.0))
def test_soft_update_is_a_convex_step_towards_online(sac, pair, tau):
    target, online = pair
    assert_close(sac.soft_update(target, online, tau=tau), tau * np_(online) + (1 - tau) * np_(target), "SAC-TARGET-1")


@pytest.mark.clause("SAC-TARGET-1")
def test_soft_update_golden(sac):
    got = sac.soft_update(torch.tensor([0.0, 10.0], dtype=torch.float64), torch.tensor([1.0, 0.0], dtype=torch.float64), tau=0.005)
    assert_close(got, [0.005, 9.95], "SAC-TARGET-1")


@pytest.mark.clause("SAC-NCE-3")
@given(_pair(), st.floats(0.0, 0.999))
def test_ema_target_encoder_update(sac, pair, m):
    target, online = pair
    assert_close(sac.ema_update(target, online, m=m), m * np_(target) + (1 - m) * np_(online), "SAC-NCE-3")


@pytest.mark.clause("SAC-NCE-3")
def test_ema_update_golden(sac):
    got = sac.ema_update(torch.tensor([2.0], dtype=torch.float64), torch.tensor([4.0], dtype=torch.float64), m=0.99)
    assert_close(got, [2.02], "SAC-NCE-3")


# ----------------------------------------------------------------------------- PopArt
@pytest.mark.clause("SAC-POPART-1", "SAC-POPART-2")
@given(st.lists(st.floats(-50, 50), min_size=1, max_size=30), st.floats(1e-4, 0.5),
       st.one_of(st.just(1e-8), st.floats(1e-3, 2.0)))
def test_popart_sequence_matches_scalar_loop(sac, xs, beta, eps):
    """ε is drawn too (up to 2, where it moves the normalised value): the guard is the caller's."""
    mu = torch.tensor(0.0, dtype=torch.float64)
    var = torch.tensor(1.0, dtype=torch.float64)
    m, v = 0.0, 1.0  # oracle: plain floats, step by step
    for x in xs:
        norm, mu, var = sac.popart_step(mu, var, torch.tensor(x, dtype=torch.float64), beta=beta, eps=eps)
        m = (1 - beta) * m + beta * x
        v = (1 - beta) * v + beta * (x - m) ** 2
        assert_close(mu, m, "SAC-POPART-1", what="running mean")
        assert_close(var, v, "SAC-POPART-1", what="running variance (uses the new mean)")
        assert_close(norm, (x - m) / (math.sqrt(v) + eps), "SAC-POPART-2", what=f"normalised value, eps {eps}")


@pytest.mark.clause("SAC-POPART-1")
def test_popart_golden_uses_new_mean(sac):
    # μ0 = 0, σ0² = 1, β = 0.5, x = 2: μ1 = 1, σ1² = 0.5 + 0.5·(2 − 1)² = 1 (the old mean would give 2.5)
    norm, mu, var = sac.popart_step(torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64),
                                    torch.tensor(2.0, dtype=torch.float64), beta=0.5)
    assert_close(mu, 1.0, "SAC-POPART-1")
    assert_close(var, 1.0, "SAC-POPART-1")


@pytest.mark.clause("SAC-POPART-2")
def test_popart_normalisation_golden(sac):
    norm, _, _ = sac.popart_step(torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64),
                                 torch.tensor(2.0, dtype=torch.float64), beta=0.5)
    assert_close(norm, (2.0 - 1.0) / (1.0 + 1e-8), "SAC-POPART-2")


@pytest.mark.clause("SAC-POPART-1")
def test_popart_streams_are_independent(sac):
    mu = torch.tensor([0.0, 5.0], dtype=torch.float64)
    var = torch.tensor([1.0, 4.0], dtype=torch.float64)
    _, m2, v2 = sac.popart_step(mu, var, torch.tensor([1.0, 5.0], dtype=torch.float64), beta=0.1)
    assert_close(m2, [0.1, 5.0], "SAC-POPART-1")
    assert_close(v2, [0.9 + 0.1 * 0.81, 3.6], "SAC-POPART-1")


# ----------------------------------------------------------------------------- InfoNCE
@st.composite
def nce_batches(draw, shared_queue=False):
    B, K, d = draw(st.integers(1, 5)), draw(st.integers(1, 6)), draw(st.integers(1, 4))
    q = draw(st_.tensors((B, d), lo=-2, hi=2))
    pos = draw(st_.tensors((B, d), lo=-2, hi=2))
    neg = draw(st_.tensors((K, d) if shared_queue else (B, K, d), lo=-2, hi=2))
    return q, pos, neg, draw(st.floats(0.05, 2.0))


@pytest.mark.clause("SAC-NCE-1")
@given(st.booleans().flatmap(lambda shared: nce_batches(shared)))
def test_info_nce_matches_logsumexp(sac, case):
    q, pos, neg, tau = case
    got = sac.info_nce(q, pos, neg, tau=tau)
    assert_close(got, np_info_nce(np_(q), np_(pos), np_(neg), tau), "SAC-NCE-1")
    assert_that(got <= 1e-12, "SAC-NCE-1", got, "log of a probability: never positive")


@pytest.mark.clause("SAC-NCE-1")
@given(st.integers(1, 20))
def test_info_nce_with_equal_similarities_is_minus_log_k_plus_one(sac, k):
    q = torch.ones(1, 3, dtype=torch.float64)
    keys = torch.ones(1, 3, dtype=torch.float64)
    got = sac.info_nce(q, keys, keys.expand(k, 3).clone(), tau=0.07)
    assert_close(got, [-math.log(k + 1)], "SAC-NCE-1")


@pytest.mark.clause("SAC-NCE-2")
@given(nce_batches())
def test_info_nce_sends_no_gradient_to_targets_or_negatives(sac, case):
    q, pos, neg, tau = case
    q, pos, neg = (t.clone().requires_grad_(True) for t in (q, pos, neg))
    sac.info_nce(q, pos, neg, tau=tau).sum().backward()
    for name, t in (("positive", pos), ("negatives", neg)):
        assert_that(t.grad is None or bool((t.grad == 0).all()), "SAC-NCE-2", t.grad, f"no gradient into {name}")
    assert_that(q.grad is not None, "SAC-NCE-2", q.grad, "a gradient into the online query")


@pytest.mark.clause("SAC-NCE-2")
def test_info_nce_query_gradient_golden(sac):
    # one negative: nce = s+ − log(e^{s+} + e^{s−}); d/dq = (1 − σ(s+ − s−))(k+ − k−)/τ; at q=0 it is (k+ − k−)/(2τ)
    q = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    kp = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    kn = torch.tensor([[[0.0, 1.0]]], dtype=torch.float64)
    sac.info_nce(q, kp, kn, tau=0.5).sum().backward()
    assert_close(q.grad, [[1.0, -1.0]], "SAC-NCE-2")


# Called without tau: the spec's InfoNCE temperature.
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


# ----------------------------------------------------------------------------- coverage and bigram
_HAN = st.text(alphabet="天地人和中国文字春风", min_size=0, max_size=40)


@pytest.mark.clause("SAC-COV-1")
@given(_HAN, _HAN, st.integers(1, 4), st.integers(4, 64))
def test_ngram_coverage_matches_brute_force(sac, agent, ref, n, window):
    got = sac.ngram_coverage(agent, ref, n=n, window=window)
    a, r = agent[-window:], ref[-window:]
    grams = [a[i:i + n] for i in range(len(a) - n + 1)]
    refset = {r[i:i + n] for i in range(len(r) - n + 1)}
    expected = (sum(g in refset for g in grams) / len(grams)) if grams else 0.0
    assert_close(float(got), expected, "SAC-COV-1")


@pytest.mark.clause("SAC-COV-1")
def test_ngram_coverage_golden(sac):
    # agent 3-grams: 天地人, 地人和, 人和中; reference holds the first two
    assert_close(float(sac.ngram_coverage("天地人和中", "天地人和国", n=3, window=64)), 2 / 3, "SAC-COV-1")
    assert_close(float(sac.ngram_coverage("天地", "天地人", n=3, window=64)), 0.0, "SAC-COV-1", what="no n-gram yet")
    # the window keeps only the last 4 characters of each text: 人和中文 vs 国人和中
    assert_close(float(sac.ngram_coverage("天地人和中文", "天地国人和中", n=3, window=4)), 0.5, "SAC-COV-1")


@pytest.mark.clause("SAC-BIGRAM-1")
@given(st.sampled_from("天地人和中国"), st.sampled_from("天地人和中国"), st.floats(0.0, 2.0))
def test_bigram_bonus_is_indicator_times_lambda(sac, prev, ch, lam):
    lexicon = {"天地", "人和", "中国"}
    got = sac.bigram_bonus(prev, ch, lexicon, lam=lam)
    assert_close(float(got), lam if prev + ch in lexicon else 0.0, "SAC-BIGRAM-1")


@pytest.mark.clause("SAC-BIGRAM-1")
def test_bigram_bonus_is_order_sensitive(sac):
    # "意味" is a word, "味意" is not: the bonus rewards the non-commutative neighbour pair
    assert_equal(float(sac.bigram_bonus("意", "味", {"意味"})), 1.0, "SAC-BIGRAM-1")
    assert_equal(float(sac.bigram_bonus("味", "意", {"意味"})), 0.0, "SAC-BIGRAM-1")


# Called without n and the window: the spec's n-gram order and window, on texts of 70 characters over three
# letters, where both defaults move the value.
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


# ----------------------------------------------------------------------------- step reward
@st.composite
def reward_terms(draw):
    n = draw(st.integers(1, 12))
    cov = draw(st_.tensors((n,), lo=-3, hi=3))
    nce = draw(st_.tensors((n,), lo=-3, hi=3))
    gar = torch.tensor(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n)), dtype=cov.dtype)
    ill = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    return cov, nce, gar, ill


@pytest.mark.clause("SAC-REWARD-1")
@given(reward_terms())
def test_step_reward_combines_terms_with_default_weights(sac, terms):
    cov, nce, gar, ill = terms
    r, done = sac.step_reward(cov, nce, gar, ill)
    expected = 1.0 * np_(cov) + 0.5 * np_(nce) - 0.1 * np_(gar) - 2.0 * np_(ill).astype(float)
    assert_close(r, expected, "SAC-REWARD-1")
    assert_equal(np_(done).astype(bool), np.zeros(len(expected), dtype=bool), "SAC-REWARD-1", "no hard boundary when off")


@pytest.mark.clause("SAC-REWARD-2")
@given(reward_terms())
def test_illegal_action_with_hard_boundary_ends_episode_at_minus_lambda_ill(sac, terms):
    cov, nce, gar, ill = terms
    r, done = sac.step_reward(cov, nce, gar, ill, illegal_done=True)
    legal_r = np_(cov) + 0.5 * np_(nce) - 0.1 * np_(gar)
    expected = np.where(np_(ill).astype(bool), -2.0, legal_r)
    assert_close(r, expected, "SAC-REWARD-2")
    assert_equal(np_(done).astype(bool), np_(ill).astype(bool), "SAC-REWARD-2", "done exactly on illegal steps")


# The weights are the caller's: drawn, so a reward that keeps its defaults whatever it is passed fails.
@pytest.mark.clause("SAC-REWARD-1", "SAC-REWARD-2")
@given(reward_terms(), st.tuples(*(st.floats(0.0, 3.0) for _ in range(4))), st.booleans())
def test_step_reward_uses_the_weights_it_is_given(sac, terms, lams, illegal_done):
    cov, nce, gar, ill = terms
    lam_cov, lam_nce, lam_gar, lam_ill = lams
    r, done = sac.step_reward(cov, nce, gar, ill, lam_cov=lam_cov, lam_nce=lam_nce, lam_gar=lam_gar, lam_ill=lam_ill,
                              illegal_done=illegal_done)
    bad = np_(ill).astype(bool)
    legal_r = lam_cov * np_(cov) + lam_nce * np_(nce) - lam_gar * np_(gar)
    expected = np.where(bad, -lam_ill, legal_r) if illegal_done else legal_r - lam_ill * bad
    clause = "SAC-REWARD-2" if illegal_done else "SAC-REWARD-1"
    # a sum of weighted terms may cancel: each reward is held to the rounding of its terms' size
    size = 1.0 + lam_cov * np.abs(np_(cov)) + lam_nce * np.abs(np_(nce)) + lam_gar * np.abs(np_(gar)) + lam_ill * bad
    assert_close(r, expected, clause, scale=size, what=f"weights {lams}, illegal_done={illegal_done}")
    assert_equal(np_(done).astype(bool), bad & illegal_done, clause, "done exactly on illegal steps, when asked")


@pytest.mark.clause("SAC-REWARD-1", "SAC-REWARD-2")
def test_step_reward_golden(sac):
    one = lambda v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
    r, _ = sac.step_reward(one(0.8), one(-0.4), one(1.0), torch.tensor([False]))
    assert_close(r, [0.8 - 0.2 - 0.1], "SAC-REWARD-1")
    r, done = sac.step_reward(one(0.8), one(-0.4), one(1.0), torch.tensor([True]), illegal_done=True)
    assert_close(r, [-2.0], "SAC-REWARD-2")
    assert_equal(done, [True], "SAC-REWARD-2")


# ----------------------------------------------------------------------------- potential shaping
@st.composite
def small_mdps(draw):
    S, A = draw(st.integers(2, 4)), draw(st.integers(2, 3))
    P = np.array(draw(st.lists(st.lists(st.lists(st.floats(0.01, 1.0), min_size=S, max_size=S),
                                        min_size=A, max_size=A), min_size=S, max_size=S)))
    P = P / P.sum(-1, keepdims=True)  # P[s, a, s']
    R = np.array(draw(st.lists(st.lists(st.floats(-1, 1), min_size=A, max_size=A), min_size=S, max_size=S)))
    phi = np.array(draw(st.lists(st.floats(-5, 5), min_size=S, max_size=S)))
    gamma = draw(st.floats(0.5, 0.95))
    return P, R, phi, gamma


def _optimal_q(P, R_sas, gamma, iters=2000):
    """Value iteration on Q(s,a) = Σ_s' P(s'|s,a)[R(s,a,s') + γ max_a' Q(s',a')] (independent oracle)."""
    Q = np.zeros(P.shape[:2])
    for _ in range(iters):
        Q_new = (P * (R_sas + gamma * Q.max(-1)[None, None, :])).sum(-1)
        if np.max(np.abs(Q_new - Q)) < 1e-12:
            break
        Q = Q_new
    return Q


@pytest.mark.clause("SAC-SHAPE-1")
@given(small_mdps())
def test_shaping_leaves_the_optimal_policy_unchanged(sac, mdp):
    P, R, phi, gamma = mdp
    S, A = R.shape
    s_idx, a_idx, n_idx = np.meshgrid(np.arange(S), np.arange(A), np.arange(S), indexing="ij")
    base = np.broadcast_to(R[:, :, None], (S, A, S))
    shaped = sac.shaped_reward(torch.tensor(base.copy()), torch.tensor(phi[s_idx]), torch.tensor(phi[n_idx]),
                               torch.zeros(S, A, S, dtype=torch.bool), gamma=gamma)
    q0 = _optimal_q(P, base, gamma)
    q1 = _optimal_q(P, np_(shaped), gamma)
    # shaping shifts Q* by exactly −Φ(s) (Ng et al. 1999), so the greedy policy is the same
    assert_close(q1, q0 - phi[:, None], "SAC-SHAPE-1", what="Q*_shaped = Q* − Φ(s)")
    gaps = np.sort(q0, -1)
    clear = gaps[:, -1] - gaps[:, -2] > 1e-6
    assert_equal(q1.argmax(-1)[clear], q0.argmax(-1)[clear], "SAC-SHAPE-1", "greedy actions")


@pytest.mark.clause("SAC-SHAPE-1")
def test_shaped_reward_golden(sac):
    t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    got = sac.shaped_reward(t(1.0, 1.0), t(2.0, 2.0), t(3.0, 3.0), torch.tensor([False, True]), gamma=0.9)
    assert_close(got, [1.0 + 0.9 * 3.0 - 2.0, 1.0 - 2.0], "SAC-SHAPE-1")
