"""SAC §6-§9, on points the seed document leaves open: CQL over the legal set, the total critic and policy
losses, the order of one update, target initialisation, gradient clipping, the PopArt rate range and the
negative queue.

The update-step oracle is a from-scratch loop written here: plain torch autograd on the test's own
copies of the networks, its own masked softmax, Top-p by sorting, Huber, CQL, clipping and SGD.
"""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp

from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_close,
    assert_equal,
    assert_rejects,
    assert_that,
    convention,
    critic_delta,
    device_leaf,
    np_critic_penalty,
    on_device,
    pin,
    pin_value,
    to_numpy,
)
from conformance_tests.oracles import np_, torch_masked_probs

EPS = 1e-8
F64 = torch.float64


# ----------------------------------------------------------------------------- shared oracles
def _np_cql(q: np.ndarray, mask: np.ndarray, a: np.ndarray, lam: float) -> float:
    """λ(mean over rows of the legal-set log-sum-exp − mean Q at the taken actions), in numpy."""
    lse = logsumexp(np.where(mask, q, -np.inf), axis=-1)
    return float(lam * (lse.mean() - q[np.arange(len(a)), a].mean()))


@st.composite
def legal_actions(draw, mask: torch.Tensor) -> torch.Tensor:
    """One legal action per row of ``mask``."""
    return torch.tensor([draw(st.sampled_from(np.flatnonzero(row).tolist())) for row in to_numpy(mask)])


@st.composite
def q_batches(draw, max_actions: int = 8, scale: float = 10.0):
    """(q [B,A], legal mask, legal actions), Q drawn up to ``scale`` in magnitude."""
    shape = draw(st_.batch_shapes(max_batch=6, max_actions=max_actions))
    mask = draw(st_.legal_masks(shape))
    return draw(st_.q_values(shape, scale=scale)), mask, draw(legal_actions(mask))


# ----------------------------------------------------------------------------- SAC-CQL-1 over the legal set
@pytest.mark.clause("SAC-CQL-1")
@given(q_batches(scale=1e3), st.floats(0.0, 1.0))
def test_cql_log_sum_exp_runs_over_the_legal_set(sac, case, lam):
    q, mask, a = case
    lam = pin_value("sac.cql_penalty", "lam", lam)
    assert_close(sac.cql_penalty(q, a, lam=lam, legal_mask=mask), _np_cql(np_(q), np_(mask), to_numpy(a), lam),
                 "SAC-CQL-1")


@pytest.mark.clause("SAC-CQL-1")
@given(q_batches(), st.floats(1e2, 1e3))
def test_cql_ignores_the_q_of_illegal_actions(sac, case, big):
    q, mask, a = case
    lam = pin_value("sac.cql_penalty", "lam", 0.5)
    base = sac.cql_penalty(q, a, lam=lam, legal_mask=mask)
    moved = sac.cql_penalty(torch.where(mask, q, torch.full_like(q, big)), a, lam=lam, legal_mask=mask)
    assert_close(moved, float(base), "SAC-CQL-1", what="illegal Q raised to a large value")


@pytest.mark.clause("SAC-CQL-1")
def test_cql_masked_rows_golden(sac):
    # row 1: two legal actions at 0 and an illegal one at 50 -> log 2 (all actions would give ~50);
    # row 2: one legal action -> logsumexp equals the taken Q, 0.
    q = torch.tensor([[0.0, 0.0, 50.0], [3.0, 100.0, -7.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    a = torch.tensor([0, 0])
    lam = pin_value("sac.cql_penalty", "lam", 0.5)
    assert_close(sac.cql_penalty(q, a, lam=lam, legal_mask=mask), lam * math.log(2) / 2, "SAC-CQL-1")


@pytest.mark.clause("SAC-CQL-1")
@given(q_batches(max_actions=6), st.floats(0.05, 1.0))
def test_cql_gradient_is_legal_softmax_minus_taken_one_hot(sac, case, lam):
    q, mask, a = case
    q, lam = q.clone().requires_grad_(True), pin_value("sac.cql_penalty", "lam", lam)
    sac.cql_penalty(q, a, lam=lam, legal_mask=mask).backward()
    qn, mn, B = np_(q), np_(mask), q.shape[0]
    z = np.where(mn, qn, -np.inf)
    soft = np.exp(z - logsumexp(z, axis=-1, keepdims=True))
    onehot = np.eye(q.shape[1])[to_numpy(a)]
    assert_close(q.grad, lam * (soft - onehot) / B, "SAC-CQL-1", what="dL/dQ = λ(softmax_legal − e_a)/B",
                 approx="gradient")


@pytest.mark.clause("SAC-CQL-1", "SAC-INPUT-2")
def test_cql_rejects_a_row_with_no_legal_action(sac):
    q = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[True, False, False], [False, False, False]])
    assert_rejects("SAC-INPUT-2", sac.raw("cql_penalty"), q, torch.tensor([0, 0]), lam=0.5, legal_mask=mask)


# ----------------------------------------------------------------------------- SAC-CRITIC-2
def _np_critic_total(q1, q2, mask, a, y, delta, lam, use_cql):
    rows = np.arange(len(a))
    conv = convention("huber_delta")
    loss = float(np.mean(np_critic_penalty(q1[rows, a] - y, delta, conv) + np_critic_penalty(q2[rows, a] - y, delta, conv)))
    return loss + (_np_cql(q1, mask, a, lam) + _np_cql(q2, mask, a, lam) if use_cql else 0.0)


@st.composite
def critic_cases(draw):
    q1, mask, a = draw(q_batches())
    q2 = draw(st_.q_values(tuple(q1.shape)))
    y = draw(st_.tensors((q1.shape[0],), lo=-10, hi=10))
    return q1, q2, mask, a, y


@pytest.mark.clause("SAC-CRITIC-2")
@given(critic_cases(), st.floats(0.1, 3.0), st.floats(0.0, 1.0), st.booleans())
def test_total_critic_loss_matches_numpy(sac, case, delta, lam, use_cql):
    q1, q2, mask, a, y = case
    delta = critic_delta(delta)  # δ = 1 unless the implementation supports any δ
    got = sac.critic_loss_total(q1, q2, a, y, legal_mask=mask, delta=delta, lam_cql=lam, use_cql=use_cql)
    want = _np_critic_total(np_(q1), np_(q2), np_(mask), to_numpy(a), np_(y), delta, lam, use_cql)
    assert_close(got, want, "SAC-CRITIC-2")


@pytest.mark.clause("SAC-CRITIC-2")
def test_total_critic_loss_golden(sac):
    # one row, actions {0, 1} legal, 2 illegal; y = 1, taken action 0
    q1 = torch.tensor([[1.5, 1.5, 9.0]], dtype=torch.float64)  # error 0.5 -> 0.125; lse_legal = 1.5 + log 2
    q2 = torch.tensor([[3.0, 3.0, 9.0]], dtype=torch.float64)  # error 2 -> 1.5;    lse_legal = 3 + log 2
    mask = torch.tensor([[True, True, False]])
    a, y = torch.tensor([0]), torch.tensor([1.0], dtype=torch.float64)
    huber_part = 0.25 + 4.0 if convention("huber_delta") == "mse" else 0.125 + 1.5  # errors 0.5 and 2
    assert_close(sac.critic_loss_total(q1, q2, a, y, legal_mask=mask, lam_cql=0.5), huber_part + 2 * 0.5 * math.log(2),
                 "SAC-CRITIC-2", what="CQL on both critics")
    assert_close(sac.critic_loss_total(q1, q2, a, y, legal_mask=mask, lam_cql=0.5, use_cql=False), huber_part,
                 "SAC-CRITIC-2", what="use_cql off")


@pytest.mark.clause("SAC-CRITIC-2")
@given(critic_cases(), st.floats(0.1, 1.0))
@settings(max_examples=20)
def test_total_critic_loss_gradient_and_no_gradient_into_target(sac, case, lam):
    q1, q2, mask, a, y = case
    q1 = q1.clone().requires_grad_(True)
    y = y.clone().requires_grad_(True)
    sac.critic_loss_total(q1, q2, a, y, legal_mask=mask, lam_cql=lam).backward()
    assert_that(y.grad is None or bool((y.grad == 0).all()), "SAC-CRITIC-2", y.grad, "no gradient into the target y")
    qn, mn, an, B = np_(q1), np_(mask), to_numpy(a), q1.shape[0]
    err = qn[np.arange(B), an] - np_(y)
    z = np.where(mn, qn, -np.inf)
    want = lam * (np.exp(z - logsumexp(z, axis=-1, keepdims=True)) - np.eye(q1.shape[1])[an]) / B
    # Huber (δ = 1) derivative, or 2·err for a declared plain squared error
    want[np.arange(B), an] += (2 * err if convention("huber_delta") == "mse" else np.clip(err, -1.0, 1.0)) / B
    assert_close(q1.grad, want, "SAC-CRITIC-2", what="dL/dQ1", approx="gradient")


# ----------------------------------------------------------------------------- SAC-POL-3
def _np_top_p_support(p: np.ndarray, mask: np.ndarray, mass: float) -> np.ndarray:
    """Smallest legal prefix (by descending probability) whose mass reaches ``mass``, by sorting."""
    keep = np.zeros_like(mask)
    for b in range(p.shape[0]):
        legal = np.flatnonzero(mask[b])
        order = legal[np.argsort(-p[b, legal], kind="stable")]
        csum = np.cumsum(p[b, order])
        k = int(np.searchsorted(csum, mass - 1e-12)) + 1  # first prefix with csum >= mass
        keep[b, order[:min(k, len(order))]] = True
    return keep


def _np_policy_total(p, q1, q2, mask, a, demo, alpha, lam_bc, mass):
    qmin = np.minimum(q1, q2)
    support, pe = mask, p
    if mass is not None:
        support = _np_top_p_support(p, mask, mass)
        pe = np.where(support, p, 0.0)
        pe = np.where(support, pe / pe.sum(-1, keepdims=True), 1.0)
    per_row = np.where(support, pe * (alpha * np.log(pe) - qmin), 0.0).sum(-1)
    nll = -np.log(p[np.arange(len(a)), a])
    bc = lam_bc * nll[demo].mean() if demo.any() else 0.0
    return float(per_row.mean() + bc)


@st.composite
def policy_total_cases(draw):
    probs, mask = draw(st_.policies(max_batch=5, max_actions=7))
    q1 = draw(st_.q_values(tuple(probs.shape), scale=5.0))
    q2 = draw(st_.q_values(tuple(probs.shape), scale=5.0))
    a = draw(legal_actions(mask))
    demo = torch.tensor(draw(st.lists(st.booleans(), min_size=len(a), max_size=len(a))))
    return probs, q1, q2, mask, a, demo


@pytest.mark.clause("SAC-POL-3")
@given(policy_total_cases(), st.floats(0.01, 2.0), st.floats(0.0, 1.0), st.sampled_from([None, 0.5, 0.9]))
def test_total_policy_loss_matches_numpy(sac, case, alpha, lam_bc, mass):
    probs, q1, q2, mask, a, demo = case
    got = sac.policy_loss_total(probs, q1, q2, mask, a, demo, alpha=alpha, lam_bc=lam_bc, p=mass)
    want = _np_policy_total(np_(probs), np_(q1), np_(q2), np_(mask), to_numpy(a), to_numpy(demo), alpha, lam_bc, mass)
    assert_close(got, want, "SAC-POL-3")


@pytest.mark.clause("SAC-POL-3")
def test_total_policy_loss_golden_bc_uses_the_full_policy(sac):
    # Top-p with p = 0.6 keeps only action 0 (π_p = 1): L_π = −min Q(0) = −2. The demo action 2 lies
    # outside P: BC scores it with the full π, −log 0.1, never with π_p (which would be −log 0).
    probs = torch.tensor([[0.7, 0.2, 0.1]], dtype=torch.float64)
    q = torch.tensor([[2.0, 5.0, 7.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    got = sac.policy_loss_total(probs, q, q + 1, mask, torch.tensor([2]), torch.tensor([True]), alpha=0.3,
                                lam_bc=0.1, p=0.6)
    assert_close(got, -2.0 + 0.1 * math.log(10.0), "SAC-POL-3")


@pytest.mark.clause("SAC-POL-3")
@given(policy_total_cases(), st.floats(0.05, 1.0))
@settings(max_examples=20)
def test_total_policy_loss_is_option_a_plus_bc(sac, case, lam_bc):
    """Differential: the total equals the two contract ops it is made of, summed."""
    probs, q1, q2, mask, a, demo = case
    total = sac.policy_loss_total(probs, q1, q2, mask, a, demo, alpha=0.2, lam_bc=lam_bc)
    parts = sac.policy_loss(probs, q1, q2, mask, alpha=0.2) + sac.bc_loss(torch.log(probs), a, demo, lam=lam_bc)
    nll = -np.log(np_(probs)[np.arange(len(a)), to_numpy(a)])
    bc = lam_bc * nll[to_numpy(demo)].mean() if bool(demo.any()) else 0.0
    assert_close(total, float(parts), "SAC-POL-3", what="total vs policy_loss + bc_loss")
    assert_close(float(total) - float(sac.policy_loss(probs, q1, q2, mask, alpha=0.2)), bc, "SAC-POL-3",
                 what="the BC share of the total")


# ----------------------------------------------------------------------------- networks for the update step
class TableTwinQ(torch.nn.Module):
    """Q tables that ignore the observation: hand-computable updates."""

    def __init__(self, q1, q2):
        super().__init__()
        self.t1 = torch.nn.Parameter(torch.tensor(q1, dtype=torch.float64))
        self.t2 = torch.nn.Parameter(torch.tensor(q2, dtype=torch.float64))

    def forward(self, obs):
        n = obs.shape[0]
        return self.t1.expand(n, -1), self.t2.expand(n, -1)


class TablePolicy(torch.nn.Module):
    def __init__(self, z):
        super().__init__()
        self.z = torch.nn.Parameter(torch.tensor(z, dtype=torch.float64))

    def forward(self, obs):
        return self.z.expand(obs.shape[0], -1)


class SharedTrunkTwinQ(torch.nn.Module):
    """Two Q heads on one shared trunk (a shared parameter receives both critics' gradients)."""

    def __init__(self, d, A, g):
        super().__init__()
        self.trunk = torch.nn.Linear(d, 4).double()
        self.h1, self.h2 = torch.nn.Linear(4, A).double(), torch.nn.Linear(4, A).double()
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))

    def forward(self, obs):
        h = torch.tanh(self.trunk(obs))
        return self.h1(h), self.h2(h)


def _sgd(*params_or_tensors, lr):
    return torch.optim.SGD(list(params_or_tensors), lr=lr)


# ----------------------------------------------------------------------------- the from-scratch oracle
def _o_softmax(z, mask):
    return torch_masked_probs(z, mask, EPS)


def _o_lse_legal(q, mask):
    return torch.logsumexp(torch.where(mask, q, torch.full_like(q, -math.inf)), -1)


def _o_huber(e, d):
    return torch.where(e.abs() <= d, 0.5 * e * e, d * (e.abs() - 0.5 * d))


def _o_clip_sgd(params, grads, lr, c):
    """p ← p − lr·g·min(1, c/(‖g‖₂ + 1e-6)) with the global norm over ``params``; returns ‖g‖₂."""
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
    coef = min(1.0, c / (norm + 1e-6))
    with torch.no_grad():
        for p, g in zip(params, grads):
            p -= lr * coef * g
    return norm


def _o_update(nets, b, hp, lrs):
    """One update written from the seed's §8 loop, on the test's own copies of the networks."""
    policy, critic, target, la = nets["policy"], nets["critic"], nets["target"], nets["log_alpha"]
    alpha = float(torch.exp(la))
    with torch.no_grad():
        pn = _o_softmax(policy(b["next_obs"]), b["next_legal_mask"])
        sup = torch.tensor(_np_top_p_support(to_numpy(pn), to_numpy(b["next_legal_mask"]), hp["top_p"]))
        pp = torch.where(sup, pn, torch.zeros_like(pn))
        pp = pp / pp.sum(-1, keepdim=True)
        q1t, q2t = target(b["next_obs"])
        v = torch.where(sup, pp * (torch.minimum(q1t, q2t) - alpha * torch.log(torch.where(sup, pp, 1.0))), 0.0).sum(-1)
        y = b["reward"] + hp["gamma"] * (1.0 - b["done"].double()) * v
    # critic
    q1a, q2a = critic(b["obs"])
    idx = b["action"][:, None]
    lq = (_o_huber(q1a.gather(1, idx).squeeze(1) - y, hp["huber_delta"])
          + _o_huber(q2a.gather(1, idx).squeeze(1) - y, hp["huber_delta"])).mean()
    if hp["use_cql"]:
        for q in (q1a, q2a):
            lq = lq + hp["lambda_cql"] * (_o_lse_legal(q, b["legal_mask"]).mean() - q.gather(1, idx).mean())
    cp = list(critic.parameters())
    norms = {"critic": _o_clip_sgd(cp, torch.autograd.grad(lq, cp), lrs["q"], hp["grad_clip"])}
    # policy, against the updated critics
    pi = _o_softmax(policy(b["obs"]), b["legal_mask"])
    with torch.no_grad():
        q1c, q2c = critic(b["obs"])
    qmin, m = torch.minimum(q1c, q2c), b["legal_mask"]
    if hp["policy_use_topp"]:  # option B: the detached Top-p set of π, π renormalised on it (SAC-POL-2)
        sel = torch.tensor(_np_top_p_support(to_numpy(pi), to_numpy(m), hp["top_p"]))
        kept = torch.where(sel, pi, torch.zeros_like(pi))
        pp = kept / kept.sum(-1, keepdim=True)
        lp = torch.where(sel, pp * (alpha * torch.log(torch.where(sel, pp, 1.0)) - qmin), 0.0).sum(-1).mean()
    else:
        lp = torch.where(m, pi * (alpha * torch.log(pi) - qmin), torch.zeros_like(pi)).sum(-1).mean()
    demo = b["is_demo"]
    if bool(demo.any()):
        lp = lp + hp["lambda_bc"] * (-torch.log(pi.gather(1, idx).squeeze(1))[demo]).mean()
    pp_ = list(policy.parameters())
    norms["policy"] = _o_clip_sgd(pp_, torch.autograd.grad(lp, pp_), lrs["pi"], hp["grad_clip"])
    # temperature: entropy of the pre-step policy; dJ/dlogα = mean(H − H_tgt)
    with torch.no_grad():
        H = -torch.where(m, pi * torch.log(pi), torch.zeros_like(pi)).sum(-1)
        H_tgt = hp["kappa"] * torch.log(m.sum(-1).double())
        la -= lrs["alpha"] * (H - H_tgt).mean()
        la.clamp_(math.log(hp["alpha_min"]), math.log(hp["alpha_max"]))
        for pt, p in zip(target.parameters(), critic.parameters()):
            pt.copy_(hp["tau"] * p + (1 - hp["tau"]) * pt)
    return norms


def _batch(g, B, A, d):
    mask = torch.rand(B, A, generator=g) < 0.6
    mask[:, :2] = True  # at least two legal actions per row
    nmask = torch.rand(B, A, generator=g) < 0.6
    nmask[:, -2:] = True
    action = torch.stack([torch.multinomial(r.double(), 1, generator=g)[0] for r in mask])
    return {"obs": torch.randn(B, d, generator=g, dtype=torch.float64),
            "next_obs": torch.randn(B, d, generator=g, dtype=torch.float64),
            "action": action, "reward": torch.randn(B, generator=g, dtype=torch.float64),
            "done": torch.rand(B, generator=g) < 0.3, "is_demo": torch.rand(B, generator=g) < 0.5,
            "legal_mask": mask, "next_legal_mask": nmask}


def _nets(seed, d, A):
    g = torch.Generator().manual_seed(seed)
    policy = torch.nn.Linear(d, A).double()
    with torch.no_grad():
        for p in policy.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    critic = SharedTrunkTwinQ(d, A, g)
    target = copy.deepcopy(critic).requires_grad_(False)
    with torch.no_grad():  # a target that differs from the online critics, so its role shows
        for p in target.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return {"policy": policy, "critic": critic, "target": target,
            "log_alpha": torch.tensor(math.log(0.3), dtype=torch.float64, requires_grad=True)}


def _params(nets):
    return [t.detach().clone() for k in ("policy", "critic", "target") for t in nets[k].parameters()] + \
        [nets["log_alpha"].detach().clone()]


def _run_both(sac, *, seed, steps, hp, lrs, d=3, A=6, B=8):
    ours, theirs = _nets(seed, d, A), _nets(seed, d, A)
    for k in ("policy", "critic", "target"):  # identical starting points, the implementation's on the device
        theirs[k].load_state_dict(ours[k].state_dict())
        on_device(theirs[k])
    theirs["log_alpha"] = device_leaf(theirs["log_alpha"])
    opts = {"q": _sgd(*theirs["critic"].parameters(), lr=lrs["q"]), "pi": _sgd(*theirs["policy"].parameters(), lr=lrs["pi"]),
            "alpha": _sgd(theirs["log_alpha"], lr=lrs["alpha"])}
    g = torch.Generator().manual_seed(seed + 1)
    clipped = []
    for _ in range(steps):
        b = _batch(g, B, A, d)
        with torch.no_grad():
            ours["log_alpha"] = ours["log_alpha"].detach().clone()
        norms = _o_update(ours, b, hp, lrs)
        clipped.append(max(norms.values()) > hp["grad_clip"])
        sac.update_step(theirs["policy"], theirs["critic"], theirs["target"], theirs["log_alpha"], opts, b, **hp)
    return _params(ours), _params(theirs), clipped


HP = dict(gamma=0.9, top_p=0.9, kappa=0.9, tau=0.3, lambda_bc=0.5, lambda_cql=0.5, use_cql=True,
          policy_use_topp=False, huber_delta=1.0, grad_clip=0.5, alpha_min=1e-4, alpha_max=2.0)
LRS = {"q": 0.2, "pi": 0.2, "alpha": 0.1}


# ----------------------------------------------------------------------------- SAC-STEP-1 / SAC-GRAD-1
@pytest.mark.clause("SAC-STEP-1", "SAC-GRAD-1")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_update_trajectory_matches_a_from_scratch_loop(sac, seed):
    want, got, clipped = _run_both(sac, seed=seed, steps=4, hp=HP, lrs=LRS)
    assert_that(any(clipped), "SAC-GRAD-1", clipped, "the oracle run to clip at least once (test is meaningful)")
    for i, (w, g_) in enumerate(zip(want, got)):
        assert_close(g_, w, "SAC-STEP-1", what=f"parameter tensor #{i} after 4 updates")


@st.composite
def step_hyper_parameters(draw):
    """Every keyword of update_step drawn: a keyword the implementation drops (keeps at its default) then
    changes the trajectory. α's range is drawn tight around its start at 1, so the clamp binds; p is drawn
    below the mass of the near-uniform policies' legal sets, so a Top-p set (option B, the backup) drops
    actions."""
    hp = {"gamma": draw(st.floats(0.5, 0.99)), "top_p": draw(st.floats(0.3, 0.7)), "kappa": draw(st.floats(0.1, 1.0)),
          "tau": draw(st.floats(0.01, 0.9)), "lambda_bc": draw(st.floats(0.0, 1.0)),
          "lambda_cql": draw(st.floats(0.0, 2.0)), "huber_delta": draw(st.floats(0.05, 3.0)),
          "grad_clip": draw(st.floats(0.05, 5.0)), "alpha_min": draw(st.floats(0.9, 0.999)),
          "alpha_max": draw(st.floats(1.001, 1.1))}
    return hp


# The switches are parametrised, not drawn: each run takes both sides of each (a drawn switch may stay at
# one side through every example the derandomised generator makes).
@pytest.mark.clause("SAC-STEP-1", "SAC-GRAD-1", "SAC-POL-2", "SAC-TEMP-3")
@pytest.mark.parametrize("use_cql", [True, False], ids=["cql", "no-cql"])
@pytest.mark.parametrize("policy_use_topp", [False, True], ids=["option-A", "option-B"])
@given(st.integers(0, 10_000), step_hyper_parameters())
@settings(max_examples=6, deadline=None)
def test_update_trajectory_under_drawn_hyper_parameters(sac, use_cql, policy_use_topp, seed, hp):
    hp = pin("sac.update_step", {**hp, "use_cql": use_cql, "policy_use_topp": policy_use_topp})
    want, got, _ = _run_both(sac, seed=seed, steps=2, hp=hp, lrs=LRS)
    for i, (w, g_) in enumerate(zip(want, got)):
        assert_close(g_, w, "SAC-STEP-1", what=f"parameter tensor #{i} after 2 updates")


def _table_update(sac, z, *, target_q=0.0, reward=0.0, lrs=(1.0, 1.0, 1.0), kappa=0.9, grad_clip=0.5):
    """One update on table networks (they ignore the observation): B = 1, every action legal, a terminal step
    (y = r), critics at 0, targets at ``target_q``, log α at 0. Returns critic, target, policy, log α, diagnostics."""
    A, (lr_q, lr_pi, lr_alpha) = len(z), lrs
    critic = on_device(TableTwinQ([0.0] * A, [0.0] * A))
    target = on_device(TableTwinQ([target_q] * A, [target_q] * A).requires_grad_(False))
    policy = on_device(TablePolicy(list(z)))
    la = device_leaf(torch.tensor(0.0, dtype=torch.float64))
    opts = {"q": _sgd(*critic.parameters(), lr=lr_q), "pi": _sgd(*policy.parameters(), lr=lr_pi),
            "alpha": _sgd(la, lr=lr_alpha)}
    legal = torch.ones(1, A, dtype=torch.bool)
    b = {"obs": torch.zeros(1, 1, dtype=torch.float64), "next_obs": torch.zeros(1, 1, dtype=torch.float64),
         "action": torch.tensor([0]), "reward": torch.tensor([reward], dtype=torch.float64), "done": torch.tensor([True]),
         "is_demo": torch.tensor([False]), "legal_mask": legal, "next_legal_mask": legal}
    out = sac.update_step(policy, critic, target, la, opts, b, gamma=0.9, top_p=0.98, kappa=kappa, tau=0.5,
                          lambda_bc=0.1, lambda_cql=0.5, use_cql=False, policy_use_topp=False, huber_delta=1.0,
                          grad_clip=grad_clip)
    return critic, target, policy, la, out


def _table_step(sac, *, grad_clip=0.5):
    """Two legal actions, uniform policy, targets at 1, r = 3: every step hand-computable."""
    return _table_update(sac, [0.0, 0.0], target_q=1.0, reward=3.0, grad_clip=grad_clip)[:4]


@pytest.mark.clause("SAC-STEP-1")
def test_update_order_golden(sac):
    critic, target, policy, la = _table_step(sac)
    c = 0.5 / (math.sqrt(2) + 1e-6)  # critic step: Huber gradient (−1, −1) clipped to norm 0.5, lr 1
    assert_close(critic.t1.detach(), [c, 0.0], "SAC-STEP-1", what="Q1 table after the critic step")
    # the policy sees the updated critics: π = (½, ½), q = (c, 0) -> dL/dz = (−c/4, c/4), norm < 0.5
    assert_close(policy.z.detach(), [c / 4, -c / 4], "SAC-STEP-1", what="logits after the policy step")
    # temperature on the pre-step entropy: log α ← 0 − 1·(log 2 − 0.9 log 2)
    assert_close(la.detach(), -0.1 * math.log(2), "SAC-STEP-1", what="log α uses H of the pre-step policy")
    # the target moves last, towards the updated critic: ½·(c, 0) + ½·(1, 1)
    assert_close(target.t1.detach(), [0.5 * c + 0.5, 0.5], "SAC-STEP-1", what="target after the soft update")


@pytest.mark.clause("SAC-TEMP-3", "SAC-STEP-1")
def test_the_alpha_clamp_reaches_the_callers_temperature(sac):
    # a peaked policy (H ≈ 0) against H_tgt = 0.9 log 2 and a temperature step of rate 100: log α would
    # land far above log 2, and the update's clamp must bring the caller's own log α back to log 2
    *_, la, out = _table_update(sac, [20.0, -20.0], lrs=(0.1, 0.1, 100.0))
    assert_close(la.detach(), math.log(2.0), "SAC-TEMP-3", what="the caller's log α after the update (clamped)")
    if "alpha" in out:
        assert_close(out["alpha"], 2.0, "SAC-TEMP-3", what="the reported α")


@pytest.mark.clause("SAC-TEMP-1", "SAC-STEP-1")
def test_a_large_temperature_gradient_is_not_clipped(sac):
    # 2000 legal actions (a vocabulary in the thousands), κ = 0.5: H − H_tgt ≈ 3.7, far past the 0.5 bound of
    # the networks' gradient clip, which is no part of the temperature rule: SGD moves log α by −lr (H − H_tgt)
    A, lr, kappa = 2000, 0.01, 0.5
    z = np.zeros(A)
    z[0] = 5.0
    pi = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    h = float(-(pi * np.log(pi)).sum())  # the pre-step policy's entropy (every π above the ε-clip)
    *_, la, _ = _table_update(sac, z.tolist(), lrs=(0.1, 0.1, lr), kappa=kappa)
    assert_close(la.detach(), -lr * (h - kappa * math.log(A)), "SAC-TEMP-1",
                 what="log α after one SGD step on the temperature loss, unclipped")


@pytest.mark.clause("SAC-GRAD-1")
def test_gradient_clipping_golden(sac):
    critic, *_ = _table_step(sac, grad_clip=0.5)
    assert_close(critic.t2.detach(), [0.5 / (math.sqrt(2) + 1e-6), 0.0], "SAC-GRAD-1", what="norm √2 clipped to 0.5")
    critic, *_ = _table_step(sac, grad_clip=10.0)  # inside the bound: the raw step (+1 each)
    assert_close(critic.t2.detach(), [1.0, 0.0], "SAC-GRAD-1", what="norm √2 under a bound of 10 is untouched")


# ----------------------------------------------------------------------------- SAC-TARGET-2
@pytest.mark.clause("SAC-TARGET-2")
@given(st.integers(0, 10_000), st.integers(1, 5), st.integers(2, 7))
@settings(max_examples=10, deadline=None)
def test_target_starts_equal_to_the_online_critics(sac, seed, d, A):
    critic = on_device(SharedTrunkTwinQ(d, A, torch.Generator().manual_seed(seed)))
    target = sac.init_target(critic)
    online = dict(critic.named_parameters())
    for name, p in target.named_parameters():
        assert_equal(p.detach(), online[name].detach(), "SAC-TARGET-2", what=f"{name} at initialisation")
        assert_that(not p.requires_grad, "SAC-TARGET-2", name, "a target parameter that needs no gradient")
        assert_that(p.data_ptr() != online[name].data_ptr(), "SAC-TARGET-2", name, "storage of its own")
    obs = on_device(torch.randn(3, d, dtype=torch.float64))
    for t_out, c_out in zip(target(obs), critic(obs)):  # differential: same outputs
        assert_equal(t_out.detach(), c_out.detach(), "SAC-TARGET-2", what="target(obs) vs critic(obs)")


@pytest.mark.clause("SAC-TARGET-2")
def test_target_init_golden_and_independent_afterwards(sac):
    critic = on_device(TableTwinQ([1.0, 2.0], [3.0, 4.0]))
    target = sac.init_target(critic)
    assert_equal(target.t1.detach(), [1.0, 2.0], "SAC-TARGET-2")
    assert_equal(target.t2.detach(), [3.0, 4.0], "SAC-TARGET-2")
    with torch.no_grad():
        critic.t1.add_(10.0)
    assert_equal(target.t1.detach(), [1.0, 2.0], "SAC-TARGET-2", what="after the online critic moved")


# ----------------------------------------------------------------------------- SAC-POPART-3
@pytest.mark.clause("SAC-POPART-3")
def test_default_popart_rate_lies_in_range(sac):
    beta = float(sac.defaults()["popart_beta"])
    assert_that(1e-4 <= beta <= 1e-2, "SAC-POPART-3", beta, "a default beta in [1e-4, 1e-2]")


@pytest.mark.clause("SAC-POPART-3")
@given(st.floats(1e-4, 1e-2), st.integers(1, 50), st.floats(-5, 5), st.floats(-5, 5))
def test_popart_mean_over_the_rate_range_follows_the_closed_form(sac, beta, n, mu0, x):
    mu, var = torch.tensor(mu0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    xt = torch.tensor(x, dtype=torch.float64)
    for _ in range(n):
        _, mu, var = sac.popart_step(mu, var, xt, beta=beta)
    assert_close(mu, x + (mu0 - x) * (1 - beta) ** n, "SAC-POPART-3", what="μ_n = x + (μ_0 − x)(1 − β)^n")


@pytest.mark.clause("SAC-POPART-3")
@pytest.mark.parametrize("beta", [1e-4, 1e-2])
def test_popart_range_ends_golden(sac, beta):
    _, mu, var = sac.popart_step(torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64),
                                 torch.tensor(1.0, dtype=torch.float64), beta=beta)
    assert_close(mu, beta, "SAC-POPART-3")
    assert_close(var, (1 - beta) + beta * (1 - beta) ** 2, "SAC-POPART-3")


# ----------------------------------------------------------------------------- SAC-NCE-4
@pytest.mark.clause("SAC-NCE-4")
@given(st.integers(0, 6), st.integers(1, 6), st.integers(1, 8), st.integers(1, 4))
def test_negative_queue_is_first_in_first_out(sac, k, n, cap, d):
    queue = torch.arange(k * d, dtype=torch.float64).reshape(k, d)
    keys = (100 + torch.arange(n * d, dtype=torch.float64)).reshape(n, d).requires_grad_(True)
    got = sac.nce_queue_push(queue, keys, capacity=cap)
    want = np.concatenate([to_numpy(queue), to_numpy(keys)], 0)[-cap:]
    assert_equal(got.detach(), want, "SAC-NCE-4", what="newest capacity rows, oldest first")
    assert_that(not got.requires_grad, "SAC-NCE-4", got.requires_grad, "queued keys carry no gradient")


@pytest.mark.clause("SAC-NCE-4")
def test_negative_queue_golden(sac):
    q = torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)
    got = sac.nce_queue_push(q, torch.tensor([[4.0], [5.0]], dtype=torch.float64), capacity=4)
    assert_equal(got, [[2.0], [3.0], [4.0], [5.0]], "SAC-NCE-4")


@pytest.mark.clause("SAC-NCE-4")
@given(st.integers(1, 7), st.integers(1, 5))
def test_pushing_one_key_at_a_time_equals_one_push(sac, n, cap):
    keys = torch.arange(n, dtype=torch.float64).reshape(n, 1)
    one_by_one = torch.zeros(0, 1, dtype=torch.float64)
    for i in range(n):
        one_by_one = sac.nce_queue_push(one_by_one, keys[i:i + 1], capacity=cap)
    at_once = sac.nce_queue_push(torch.zeros(0, 1, dtype=torch.float64), keys, capacity=cap)
    assert_equal(one_by_one, to_numpy(at_once), "SAC-NCE-4", what="loop vs one push")


# Keys of the wrong rank are rejected by the shape guard itself, not left to fail later with an error that
# names no clause.
@pytest.mark.clause("SAC-INPUT-2")
def test_nce_queue_push_rejects_keys_of_the_wrong_rank(sac):

    assert_rejects(("SAC-INPUT-2", "SAC-NCE-4"), sac.raw("nce_queue_push"), torch.zeros(2, 1, dtype=F64),
                   torch.tensor([1.0, 2.0, 3.0], dtype=F64), capacity=4)
