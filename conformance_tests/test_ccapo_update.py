"""CCAPO §6 as a loop: PPO-clip + KL epochs on stored trajectories (CCAPO-UPDATE-1).

The oracle is a from-scratch loop written here: the test's own copy of a small policy whose weight
matrix feeds the logits through two paths, its own masked log-softmax, the objective written from
the §6 formula, autograd for the gradient, its own global-norm clip and SGD steps. The
implementation's minibatches are read from its recorded forwards (the oracle does not assume how it
draws permutations); the oracle replays them and the parameters are compared after every step.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch

from conformance_tests.harness import (
    assert_close,
    assert_equal,
    assert_no_grad,
    assert_rejects,
    assert_that,
    generator,
    host,
    on_device,
)

F64 = torch.float64
CLAUSE = "CCAPO-UPDATE-1"
B, T, D, A = 10, 4, 3, 4
LR = 0.3


class SharedPolicy(torch.nn.Module):
    """log-softmax over the legal actions of tanh(oW)V + oW: W reaches the logits through two paths.

    Records the observations of every forward, and whether autograd was on, for the loop checks.
    """

    def __init__(self, g: torch.Generator):
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(D, A, generator=g, dtype=F64))
        self.V = torch.nn.Parameter(torch.randn(A, A, generator=g, dtype=F64))
        self.seen: list[tuple[torch.Tensor, bool]] = []

    def forward(self, obs, legal):
        self.seen.append((host(obs), torch.is_grad_enabled()))
        z = obs @ self.W
        return torch.log_softmax((torch.tanh(z) @ self.V + z).masked_fill(~legal, -math.inf), -1)


class RecordingSGD(torch.optim.SGD):
    """SGD that records, at each step, ``on_step()``, the gradient it applies and the parameters after it."""

    def __init__(self, params, lr, on_step):
        super().__init__(params, lr=lr)
        self.on_step, self.grads, self.after = on_step, [], []

    def step(self, closure=None):
        ps = [p for grp in self.param_groups for p in grp["params"]]
        self.on_step()
        self.grads.append([p.grad.detach().clone() for p in ps])
        out = super().step(closure)
        self.after.append([p.detach().clone() for p in ps])
        return out


# ----------------------------------------------------------------------------- the from-scratch oracle
def _o_logp(W, V, obs, legal, action):
    z = obs @ W
    logits = torch.where(legal, torch.tanh(z) @ V + z, torch.full_like(z, -math.inf))
    logp = logits - torch.logsumexp(logits, -1, keepdim=True)
    return logp.gather(-1, action[..., None]).squeeze(-1)


def _o_objective(new, old, ref, adv, mask, clip_eps, beta_kl):
    """−(mean_τ (1/T_τ)Σ_t min(ρA, clip(ρ)A) − β mean_τ (1/T_τ)Σ_t (e^Δ − Δ − 1)), Δ = ref − new."""
    m = mask.to(F64)
    rho = torch.exp(new - old)
    surr = torch.minimum(rho * adv, torch.clamp(rho, 1 - clip_eps, 1 + clip_eps) * adv)
    d = ref - new
    k3 = torch.exp(d) - d - 1
    per = lambda x: ((x * m).sum(-1) / m.sum(-1)).mean()  # noqa: E731 - every test trajectory has a step
    return -(per(surr) - beta_kl * per(k3)), per(k3)


def _o_run(W, V, ref, batch, minibatches, *, clip_eps, beta_kl, max_norm, logp_ref=None):
    """SGD steps on the given minibatches; per step the applied gradient, the parameters, loss, kl.
    The KL is taken to the policy with parameters ``ref`` unless ``logp_ref`` is given."""
    W, V = W.clone().requires_grad_(), V.clone().requires_grad_()
    if logp_ref is None:
        with torch.no_grad():
            logp_ref = _o_logp(ref[0], ref[1], batch["obs"], batch["legal"], batch["action"])
    steps = []
    for idx in minibatches:
        new = _o_logp(W, V, batch["obs"][idx], batch["legal"][idx], batch["action"][idx])
        loss, kl = _o_objective(new, batch["logp_old"][idx], logp_ref[idx], batch["advantage"][idx],
                                batch["mask"][idx], clip_eps, beta_kl)
        grads = torch.autograd.grad(loss, [W, V])
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
        coef = min(1.0, max_norm / (norm + 1e-6))
        with torch.no_grad():
            W -= LR * coef * grads[0]
            V -= LR * coef * grads[1]
        steps.append({"grads": [coef * g for g in grads], "params": [W.detach().clone(), V.detach().clone()],
                      "loss": float(loss.detach()), "kl_ref": float(kl.detach()), "clipped": coef < 1.0,
                      "grad_norm": norm})
    return steps


# ----------------------------------------------------------------------------- setup
def _batch(g: torch.Generator) -> dict:
    """B trajectories of 1..T real steps, legal masks with >= 2 actions, actions of a behaviour policy."""
    legal = torch.rand(B, T, A, generator=g) < 0.6
    legal[..., :2] = True
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    action = torch.multinomial(legal.reshape(-1, A).double(), 1, generator=g).reshape(B, T)
    behaviour = SharedPolicy(g)  # the sampling policy: neither the trained one nor the reference
    obs = torch.randn(B, T, D, generator=g, dtype=F64)
    with torch.no_grad():
        old = behaviour(obs, legal).gather(-1, action[..., None]).squeeze(-1)
    return {"obs": obs, "legal": legal, "action": action, "logp_old": old,
            "advantage": 2 * torch.randn(B, T, generator=g, dtype=F64), "mask": mask}


def _rows(obs: torch.Tensor, batch_obs: torch.Tensor) -> list[int]:
    """Indices of the batch trajectories a forward saw (observations are distinct random floats)."""
    first = batch_obs[:, 0, :]
    return [int(torch.nonzero((first == o[0]).all(-1))[0]) for o in obs]


def _run(ccapo, seed: int, *, minibatch_size: int, epochs: int = 3, clip_eps=0.2, beta_kl=0.5, max_norm=0.6,
         generator_seed: int | None = None):
    g = torch.Generator().manual_seed(seed)
    batch = _batch(g)
    policy, ref = SharedPolicy(g), SharedPolicy(g)  # ref ≠ policy ≠ behaviour: the KL's source shows
    W0, V0 = policy.W.detach().clone(), policy.V.detach().clone()
    ref_params = [p.detach().clone() for p in ref.parameters()]
    policy, ref = on_device(policy), on_device(ref)
    rows_per_step, marks = [], [0]

    def record_rows():  # the trajectories forwarded with autograd on since the previous step
        rows_per_step.append([i for obs, grad in policy.seen[marks[-1]:] if grad for i in _rows(obs, batch["obs"])])
        marks.append(len(policy.seen))

    opt = RecordingSGD(policy.parameters(), lr=LR, on_step=record_rows)
    records = ccapo.ccapo_update(policy, ref, opt, batch, clip_eps=clip_eps, beta_kl=beta_kl, epochs=epochs,
                                 minibatch_size=minibatch_size, max_grad_norm=max_norm,
                                 generator=generator(seed + 7 if generator_seed is None else generator_seed))
    want = _o_run(W0, V0, ref_params, batch, [torch.tensor(r) for r in rows_per_step], clip_eps=clip_eps,
                  beta_kl=beta_kl, max_norm=max_norm)
    return {"batch": batch, "ref": ref, "ref_params": ref_params, "opt": opt, "rows": rows_per_step,
            "records": records, "want": want, "epochs": epochs, "start": (W0, V0)}


# ----------------------------------------------------------------------------- CCAPO-UPDATE-1
# each case its own hyper-parameters: an update that keeps one at its default (ignores the keyword) fails
@pytest.mark.clause(CLAUSE)
@pytest.mark.parametrize("seed, minibatch_size, hp", [
    (0, 4, dict(clip_eps=0.2, beta_kl=0.5, max_norm=0.6)),
    (1, 3, dict(clip_eps=0.08, beta_kl=0.1, max_norm=0.3)),
    (2, B, dict(clip_eps=0.35, beta_kl=1.5, max_norm=0.45)),
])
def test_update_trajectory_matches_a_from_scratch_loop(ccapo, seed, minibatch_size, hp):
    r = _run(ccapo, seed, minibatch_size=minibatch_size, **hp)
    n_mb = math.ceil(B / minibatch_size)
    assert_equal(len(r["rows"]), r["epochs"] * n_mb, CLAUSE, what="optimiser steps (epochs x minibatches)")
    assert_that(any(s["clipped"] for s in r["want"]), CLAUSE, [s["clipped"] for s in r["want"]],
                "the oracle run to clip at least once (the test is meaningful)")
    for k, (s, grads, params) in enumerate(zip(r["want"], r["opt"].grads, r["opt"].after)):
        for name, got, w in zip(("W", "V"), grads, s["grads"]):  # a gradient of this minibatch alone
            assert_close(got, w, CLAUSE, what=f"clipped gradient of {name} applied at step {k}")
        for name, got, w in zip(("W", "V"), params, s["params"]):
            assert_close(got, w, CLAUSE, what=f"{name} after step {k}")
    if len(r["records"]) == len(r["want"]):  # the reported metrics, when one record per step is given
        for k, (rec, s) in enumerate(zip(r["records"], r["want"])):
            assert_close(rec["loss"], s["loss"], CLAUSE, what=f"loss reported for minibatch {k}")
            assert_close(rec["kl_ref"], s["kl_ref"], CLAUSE, what=f"kl_ref reported for minibatch {k}")
            assert_close(rec["grad_norm"], s["grad_norm"], CLAUSE, what=f"grad_norm (before clipping), minibatch {k}")
            assert_equal((rec["epoch"], rec["minibatch"]), (k // n_mb, k % n_mb), CLAUSE, f"record {k}'s position")


@pytest.mark.clause(CLAUSE)
@pytest.mark.parametrize("seed, minibatch_size", [(3, 4), (4, 3)])
def test_each_epoch_is_a_fresh_shuffle_using_every_trajectory_once(ccapo, seed, minibatch_size):
    r = _run(ccapo, seed, minibatch_size=minibatch_size, epochs=4)
    n_mb = math.ceil(B / minibatch_size)
    sizes = [minibatch_size] * (B // minibatch_size) + ([B % minibatch_size] if B % minibatch_size else [])
    orders = []
    for e in range(r["epochs"]):
        mbs = r["rows"][e * n_mb:(e + 1) * n_mb]
        assert_equal([len(m) for m in mbs], sizes, CLAUSE, what=f"minibatch sizes of epoch {e}, remainder last")
        order = [i for m in mbs for i in m]
        assert_equal(sorted(order), list(range(B)), CLAUSE, what=f"trajectories used in epoch {e}: each exactly once")
        orders.append(order)
    assert_that(len({tuple(o) for o in orders}) == len(orders), CLAUSE, orders, "a different order in every epoch")
    assert_that(any(o != list(range(B)) for o in orders), CLAUSE, orders, "shuffled, not the stored order")


# The shuffle is drawn from the caller's generator: an update run twice with generators seeded alike is one update
# (a run can be replayed), and another seed gives another order. An update that ignores ``generator`` is neither.
@pytest.mark.clause(CLAUSE)
def test_the_shuffle_follows_the_generator(ccapo):
    first, again = (_run(ccapo, 6, minibatch_size=3, epochs=4, generator_seed=11) for _ in range(2))
    other = _run(ccapo, 6, minibatch_size=3, epochs=4, generator_seed=12)
    assert_that(again["rows"] == first["rows"], CLAUSE, again["rows"],
                f"the minibatches of a run whose generator is seeded alike: {first['rows']}")
    for k, (p1, p2) in enumerate(zip(first["opt"].after, again["opt"].after)):
        for name, a, b in zip(("W", "V"), p1, p2):
            assert_equal(b, a, CLAUSE, what=f"{name} after step {k} of two runs with generators seeded alike")
    assert_that(other["rows"] != first["rows"], CLAUSE, other["rows"], "another order under another seed")


@pytest.mark.clause(CLAUSE)
def test_reference_policy_is_frozen_and_is_the_kl_source(ccapo):
    r = _run(ccapo, 5, minibatch_size=4)
    ref, batch = r["ref"], r["batch"]
    assert_no_grad(CLAUSE, "reference policy parameters", *ref.parameters())
    for p, p0 in zip(ref.parameters(), r["ref_params"]):
        assert_equal(p.detach(), p0, CLAUSE, what="reference parameters after the update")
    seen = sorted({i for obs, _ in ref.seen for i in _rows(obs, batch["obs"])})
    assert_equal(seen, list(range(B)), CLAUSE, what="trajectories the reference policy was evaluated on")
    # the first step's gradient is the one with the KL to π_ref, not the one with the KL to the
    # sampling policy (whose log-probs the batch caches): the two differ in this setting
    first = [torch.tensor(r["rows"][0])]
    kw = dict(clip_eps=0.2, beta_kl=0.5, max_norm=0.6)
    to_old = _o_run(*r["start"], r["ref_params"], batch, first, logp_ref=batch["logp_old"], **kw)[0]["grads"]
    got = r["opt"].grads[0]
    assert_close(got[0], r["want"][0]["grads"][0], CLAUSE, what="first gradient of W (KL to π_ref)")
    assert_that(not torch.allclose(host(got[0]), to_old[0], rtol=1e-6, atol=1e-9), CLAUSE, got[0],
                "a gradient unlike the one with the KL to the sampling policy")


@pytest.mark.clause(CLAUSE)
def test_one_step_golden(ccapo):
    # one trajectory, one step, a = 0 with A = 2, logits (0, 0), old = ref = current: ρ = 1 and the
    # KL and its gradient are 0, so dL/dz = −A(e_0 − π) = (−1, 1); norm √2 < 10; SGD lr 0.5
    # -> z = (0.5, −0.5)
    class Table(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.z = torch.nn.Parameter(torch.zeros(2, dtype=F64))

        def forward(self, obs, legal):
            return torch.log_softmax(self.z.masked_fill(~legal, -math.inf), -1)

    policy, ref = on_device(Table()), on_device(Table().requires_grad_(False))
    batch = {"obs": torch.zeros(1, 1, 1, dtype=F64), "legal": torch.ones(1, 1, 2, dtype=torch.bool),
             "action": torch.tensor([[0]]), "logp_old": torch.tensor([[math.log(0.5)]], dtype=F64),
             "advantage": torch.tensor([[2.0]], dtype=F64), "mask": torch.tensor([[True]])}
    ccapo.ccapo_update(policy, ref, torch.optim.SGD(policy.parameters(), lr=0.5), batch, epochs=1, minibatch_size=1,
                       max_grad_norm=10.0)
    assert_close(policy.z.detach(), [0.5, -0.5], CLAUSE, what="logits after one step")


@pytest.mark.clause("CCAPO-INPUT-3")  # a bad-input check: the input clause (SHOULD), not the update's MUST rule
def test_rejects_a_batch_without_the_cached_log_probs(ccapo):
    g = torch.Generator().manual_seed(0)
    batch = _batch(g)
    del batch["logp_old"]
    policy = on_device(SharedPolicy(g))
    assert_rejects(("CCAPO-INPUT-3", CLAUSE), ccapo.raw("ccapo_update"), policy, copy.deepcopy(policy),
                   torch.optim.SGD(policy.parameters(), lr=0.1), batch, epochs=1, minibatch_size=4)
