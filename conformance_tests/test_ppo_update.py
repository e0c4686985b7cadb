"""PPO §4, §7, §8, §9 at trainer level: the implementation's ``ppo_update`` on small hypothesis-drawn
rollouts, with table actors (one row of logits per state) whose every forward is recorded, so each
minibatch's metrics and the first parameter step can be recomputed independently in numpy."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import logsumexp

from conformance_tests import strategies as st_
from conformance_tests.oracles import ratio_band
from conformance_tests.harness import (
    assert_between,
    assert_close,
    assert_equal,
    assert_no_grad,
    assert_rejects,
    assert_that,
    convention,
    fits,
    generator,
    host,
    np_approx_kl,
    np_clip_fraction_bounds,
    on_device,
    pin,
    slack,
    to_numpy,
    tolerance,
)

HP = dict(clip_eps=0.2, vf_coef=0.5, ent_coef=0.01)


class TableActor(torch.nn.Module):
    """logits = table[state]; records (states, table) at every forward."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(logits.clone())
        self.forwards: list[tuple[np.ndarray, np.ndarray]] = []

    def forward(self, obs):
        self.forwards.append((to_numpy(host(obs)).copy(), to_numpy(host(self.table)).copy()))
        return self.table[obs]


class TableCritic(torch.nn.Module):
    def __init__(self, values: torch.Tensor):
        super().__init__()
        self.v = torch.nn.Parameter(values.clone())

    def forward(self, obs):
        return self.v[obs]


def np_log_softmax(z, mask):
    zz = np.where(mask, z, -np.inf)
    return zz - logsumexp(zz, axis=-1, keepdims=True)


def setup(ppo, r, *, lr=0.5, attached_old=False):
    """Actor, critic (on the audited device), SGD optimiser and the stored batch; actions and old log-probs
    from the sampler, on the host (old_log_prob stays on the device when attached to the actor's graph)."""
    actor, critic = on_device(TableActor(r["logits"])), on_device(TableCritic(r["values"]))
    n = r["logits"].shape[0]
    obs = torch.arange(n)
    with torch.no_grad():
        action, old = host(ppo.sample_actions(actor(obs), r["mask"], generator=generator(r["seed"])))
    if attached_old:  # the same values, still attached to the actor's graph: the update must detach them
        lp = torch.log_softmax(actor.table.masked_fill(on_device(~r["mask"]), fits(-1e9, actor.table.dtype)), -1)
        old = lp.gather(1, on_device(action.view(-1, 1))).squeeze(1)
    actor.forwards.clear()
    batch = {"obs": obs, "action": action, "old_log_prob": old, "mask": r["mask"],
             "advantage": r["advantage"], "return": r["return"]}
    opt = torch.optim.SGD([*actor.parameters(), *critic.parameters()], lr=lr)
    return actor, critic, opt, batch


def oracle_metrics(forward, batch, clip_eps=HP["clip_eps"]):
    """Metrics of one minibatch from the recorded forward (states, table) alone, approx_kl and clip_fraction
    under the declared conventions. The clip fraction is a (least, greatest) pair: a ratio within the rounding
    of the batch's dtype of 1 ± ε may count either way."""
    states, table = forward
    mask = to_numpy(batch["mask"])[states]
    lp = np_log_softmax(table[states], mask)
    new = lp[np.arange(len(states)), to_numpy(batch["action"])[states]]
    old = to_numpy(batch["old_log_prob"])[states]
    r = np.exp(new - old)
    ent = -np.where(mask, np.exp(lp) * np.where(mask, lp, 0.0), 0.0).sum(-1)
    adv = to_numpy(batch["advantage"])[states]
    band = ratio_band(r, new, old, torch.finfo(batch["old_log_prob"].dtype).eps)
    return {"approx_kl": np_approx_kl(old, new, convention("approx_kl")),
            "k3_kl": np.mean(np.expm1(new - old) - (new - old)), "ratio_mean": r.mean(),
            "clip_fraction": np_clip_fraction_bounds(r, clip_eps, convention("clip_fraction"), adv, band),
            "entropy": ent.mean()}


def oracle_first_gradient(r, batch, vf_coef=HP["vf_coef"], ent_coef=HP["ent_coef"]):
    """Closed-form gradient of the total loss at θ = θ_old (ratio 1): per-state table and value rows (the
    value term's factor from the value_loss_factor convention)."""
    z, mask = to_numpy(r["logits"]), to_numpy(r["mask"])
    n = len(z)
    lp = np_log_softmax(z, mask)
    p = np.where(mask, np.exp(lp), 0.0)
    logp = np.where(mask, lp, 0.0)
    H = -(p * logp).sum(-1, keepdims=True)
    onehot = np.eye(z.shape[1])[to_numpy(batch["action"])]
    adv = to_numpy(r["advantage"])[:, None]
    g_z = -adv * (onehot - p) / n + ent_coef * p * (logp + H) / n
    g_v = 2 * convention("value_loss_factor") * vf_coef * (to_numpy(r["values"]) - to_numpy(r["return"])) / n
    return g_z, g_v


def np_clip_steps(g_z: np.ndarray, g_v: np.ndarray, max_norm: float) -> tuple[np.ndarray, np.ndarray]:
    """The actor's and critic's gradients after clipping to ``max_norm`` (coefficient c / (norm + 1e-6),
    capped at 1) under the grad_clip_scope convention: each network's own norm (the seed), or one norm over
    both (global)."""
    def coef(*gs):
        return min(1.0, max_norm / (float(np.sqrt(sum((g**2).sum() for g in gs))) + 1e-6))

    if convention("grad_clip_scope") == "global":
        c = coef(g_z, g_v)
        return g_z * c, g_v * c
    return g_z * coef(g_z), g_v * coef(g_v)


# ----------------------------------------------------------------------------- PPO-UPDATE-1
@pytest.mark.clause("PPO-UPDATE-1")
@given(st_.rollouts(), st.integers(1, 12), st.integers(1, 3))
def test_first_minibatch_has_ratio_exactly_one(ppo, r, mb, epochs):
    actor, critic, opt, batch = setup(ppo, r)
    recs = ppo.ppo_update(actor, critic, opt, batch, epochs=epochs, minibatch_size=mb, max_grad_norm=1.0,
                          target_kl=None, generator=generator(0), **HP)
    first = recs[0]
    assert_that(first["ratio_mean"] == 1.0, "PPO-UPDATE-1", first["ratio_mean"], "ratio_mean exactly 1")
    assert_that(first["approx_kl"] == 0.0, "PPO-UPDATE-1", first["approx_kl"], "approx_kl exactly 0")
    assert_that(first["k3_kl"] == 0.0, "PPO-UPDATE-1", first["k3_kl"], "k3_kl exactly 0")
    assert_that(first["clip_fraction"] == 0.0, "PPO-UPDATE-1", first["clip_fraction"], "clip_fraction 0")
    assert_that((first["epoch"], first["minibatch"]) == (0, 0), "PPO-UPDATE-1", first, "epoch 0, minibatch 0 first")


# ----------------------------------------------------------------------------- PPO-UPDATE-2
@pytest.mark.clause("PPO-UPDATE-2", "PPO-OLD-1")
@pytest.mark.parametrize("clip_eps", [HP["clip_eps"], 0.05], ids=["eps-0.2", "eps-0.05"])
@given(st_.rollouts(), st.integers(2, 6))
def test_each_minibatch_reports_the_metrics_of_the_replayed_batch(ppo, clip_eps, r, mb):
    """At the document's clip range and another: the reported clip fraction is of the range the update is given."""
    actor, critic, opt, batch = setup(ppo, r, lr=1.0)
    hp = pin("ppo.ppo_update", {**HP, "clip_eps": clip_eps})
    recs = ppo.ppo_update(actor, critic, opt, batch, epochs=3, minibatch_size=mb, max_grad_norm=10.0,
                          target_kl=None, generator=generator(1), **hp)
    assert_that(len(recs) == len(actor.forwards), "PPO-UPDATE-2", len(recs), f"{len(actor.forwards)} records, one per actor forward")
    for k, (rec, fwd) in enumerate(zip(recs, actor.forwards)):
        want = oracle_metrics(fwd, batch, clip_eps=hp["clip_eps"])
        for key, value in want.items():
            if key == "clip_fraction":
                assert_between(rec[key], *value, "PPO-UPDATE-2", what=f"minibatch {k}: {key}")
            else:
                assert_close(torch.tensor(rec[key], dtype=torch.float64), value, "PPO-UPDATE-2",
                             what=f"minibatch {k}: {key}")


@pytest.mark.clause("PPO-UPDATE-2", "PPO-OLD-1")
def test_later_minibatches_compare_against_the_cached_old_log_prob(ppo):
    # after one step the policy has moved: a ratio recomputed from the current policy would read 1
    r = {"logits": torch.zeros(4, 3, dtype=torch.float64), "values": torch.zeros(4, dtype=torch.float64),
         "mask": torch.tensor([[True, True, True], [True, True, False], [True, False, True], [True, True, True]]),
         "advantage": torch.tensor([1.0, -1.0, 2.0, 0.5], dtype=torch.float64),
         "return": torch.zeros(4, dtype=torch.float64), "seed": 3}
    actor, critic, opt, batch = setup(ppo, r, lr=2.0)
    recs = ppo.ppo_update(actor, critic, opt, batch, epochs=2, minibatch_size=4, max_grad_norm=100.0,
                          target_kl=None, generator=generator(0), **HP)
    want = oracle_metrics(actor.forwards[1], batch)
    assert_that(abs(want["approx_kl"]) > 1e-3, "PPO-UPDATE-2", want["approx_kl"], "a policy that moved (test premise)")
    assert_close(torch.tensor(recs[1]["approx_kl"], dtype=torch.float64), want["approx_kl"], "PPO-UPDATE-2")
    assert_close(torch.tensor(recs[1]["ratio_mean"], dtype=torch.float64), want["ratio_mean"], "PPO-UPDATE-2")


# ----------------------------------------------------------------------------- PPO-UPDATE-3
@pytest.mark.clause("PPO-UPDATE-3", "PPO-OLD-1")
@given(st_.rollouts(), st.booleans())
def test_first_step_follows_the_gradient_of_the_documented_loss(ppo, r, attached):
    actor, critic, opt, batch = setup(ppo, r, lr=1.0, attached_old=attached)
    ppo.ppo_update(actor, critic, opt, batch, epochs=1, minibatch_size=len(r["values"]), max_grad_norm=1e9,
                   target_kl=None, generator=generator(0), **HP)
    g_z, g_v = np_clip_steps(*oracle_first_gradient(r, batch), 1e9)  # a bound far above: clipping is inactive
    step_z = to_numpy(r["logits"]) - to_numpy(actor.table)
    step_v = to_numpy(r["values"]) - to_numpy(critic.v)
    rtol, atol = tolerance("PPO-UPDATE-3", r["logits"].dtype)  # the rollout's declared dtype
    ok = np.allclose(step_z, g_z, rtol=rtol, atol=atol) and np.allclose(step_v, g_v, rtol=rtol, atol=atol)
    note = "old_log_prob given attached to the actor's graph" if attached else "old_log_prob given detached"
    assert_that(ok, "PPO-UPDATE-3", {"actor step": step_z.round(6).tolist(), "critic step": step_v.round(6).tolist()},
                f"lr x closed-form gradient {g_z.round(6).tolist()}, {g_v.round(6).tolist()} ({note})")


# ----------------------------------------------------------------------------- PPO-GRAD-1 (in the loop)
@pytest.mark.clause("PPO-GRAD-1")
@given(st_.rollouts(), st.floats(1e-3, 0.05))
def test_update_clips_the_gradient_norm_of_each_network(ppo, r, max_norm):
    """Both networks' steps are the clipped gradients (each network's own norm, or one norm over both under
    the declared grad_clip_scope); the bound is small enough that the critic's is clipped too."""
    actor, critic, opt, batch = setup(ppo, r, lr=1.0)
    ppo.ppo_update(actor, critic, opt, batch, epochs=1, minibatch_size=len(r["values"]), max_grad_norm=max_norm,
                   target_kl=None, generator=generator(0), **HP)
    expected, expected_v = np_clip_steps(*oracle_first_gradient(r, batch), max_norm)
    step = to_numpy(r["logits"]) - to_numpy(actor.table)
    assert_close(torch.from_numpy(step), expected, "PPO-GRAD-1", what="actor step = lr x clipped gradient")
    step_v = to_numpy(r["values"]) - to_numpy(critic.v)
    assert_close(torch.from_numpy(step_v), expected_v, "PPO-GRAD-1", what="critic step = lr x clipped gradient")


# ----------------------------------------------------------------------------- PPO-LOSS-4 (in the loop)
@pytest.mark.clause("PPO-LOSS-4")
@given(st_.rollouts())
def test_duplicating_the_batch_changes_nothing(ppo, r):
    results = []
    for copies in (1, 2):
        actor, critic, opt, batch = setup(ppo, r)
        big = {k: v.repeat(copies, *([1] * (v.dim() - 1))) for k, v in batch.items()}
        recs = ppo.ppo_update(actor, critic, opt, big, epochs=1, minibatch_size=len(big["action"]), max_grad_norm=1e9,
                              target_kl=None, generator=generator(0), **HP)
        results.append((recs[0], actor.table.detach().clone(), critic.v.detach().clone()))
    (r1, a1, v1), (r2, a2, v2) = results
    for key in ("loss", "policy_loss", "value_loss", "entropy"):
        assert_close(torch.tensor(r2[key], dtype=torch.float64), r1[key], "PPO-LOSS-4", what=key)
    assert_close(a2, a1, "PPO-LOSS-4", what="actor after the step")
    assert_close(v2, v1, "PPO-LOSS-4", what="critic after the step")


# ----------------------------------------------------------------------------- PPO-MASK-3 (in the loop)
@pytest.mark.clause("PPO-MASK-3")
@given(st_.rollouts(), st.integers(1, 12))
def test_every_replayed_action_is_legal_and_scored_under_its_stored_mask(ppo, r, mb):
    actor, critic, opt, batch = setup(ppo, r)
    recs = ppo.ppo_update(actor, critic, opt, batch, epochs=2, minibatch_size=mb, max_grad_norm=1.0,
                          target_kl=None, generator=generator(2), **HP)
    for rec, (states, table) in zip(recs, actor.forwards):
        mask = to_numpy(batch["mask"])[states]
        a = to_numpy(batch["action"])[states]
        assert_that(bool(mask[np.arange(len(a)), a].all()), "PPO-MASK-3", a, "replayed actions legal under the stored mask")
        lp = np_log_softmax(table[states], mask)[np.arange(len(a)), a]
        assert_close(torch.tensor(rec["log_prob_min"], dtype=torch.float64), lp.min(), "PPO-MASK-3",
                     what="smallest replayed log-prob (under the stored mask)")


@pytest.mark.clause("PPO-MASK-3")
def test_update_rejects_a_stored_action_illegal_under_its_mask(ppo):
    r = {"logits": torch.zeros(3, 4, dtype=torch.float64), "values": torch.zeros(3, dtype=torch.float64),
         "mask": torch.tensor([[True, False, True, True]] * 3), "advantage": torch.ones(3, dtype=torch.float64),
         "return": torch.ones(3, dtype=torch.float64), "seed": 0}
    actor, critic, opt, batch = setup(ppo, r)
    batch["action"] = torch.tensor([0, 1, 2])  # the §0 symptom: a replayed action illegal under its mask
    assert_rejects("PPO-MASK-3", ppo.raw("ppo_update"), actor, critic, opt, batch, epochs=1, minibatch_size=3,
                   max_grad_norm=1.0, target_kl=None, **HP)


# ----------------------------------------------------------------------------- PPO-KLSTOP-2
@pytest.mark.clause("PPO-KLSTOP-2")
@given(st_.rollouts(), st.integers(1, 6), st.sampled_from([1e-4, 1e-3, 0.015]))
def test_kl_guard_ends_the_update_before_the_offending_step(ppo, r, mb, target):
    actor, critic, opt, batch = setup(ppo, r, lr=3.0)
    recs = ppo.ppo_update(actor, critic, opt, batch, epochs=4, minibatch_size=mb, max_grad_norm=10.0,
                          target_kl=target, generator=generator(4), **HP)
    bound = convention("kl_stop_factor") * target  # the seed's 2 x target_kl, or the declared factor
    for k, (rec, fwd) in enumerate(zip(recs, actor.forwards)):
        kl = oracle_metrics(fwd, batch)["approx_kl"]
        if abs(kl - bound) <= slack("PPO-UPDATE-2", bound, batch["old_log_prob"].dtype):
            return  # within the tolerance approx_kl is held to, rounding decides; nothing to check
        assert_equal(bool(rec["early_stop"]), bool(kl > bound), "PPO-KLSTOP-2", f"minibatch {k}: approx_kl={kl:.4g}")
        if rec["early_stop"]:
            assert_that(k == len(recs) - 1, "PPO-KLSTOP-2", f"{len(recs) - 1 - k} more minibatch(es)", "none after the stop")
            assert_equal(actor.table.detach(), torch.from_numpy(fwd[1]), "PPO-KLSTOP-2",
                         "no step on the minibatch that tripped the guard")
    n_mb = -(-len(r["values"]) // mb)
    if not any(rec["early_stop"] for rec in recs):
        assert_that(len(recs) == 4 * n_mb, "PPO-KLSTOP-2", len(recs), f"all {4 * n_mb} minibatches without a stop")


# ----------------------------------------------------------------------------- PPO-MAPPO-3
class LinearActor(torch.nn.Module):
    def __init__(self, d_in, n_actions):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(d_in, n_actions, generator=g, dtype=torch.float64) * 0.3)

    def forward(self, obs):
        return obs @ self.w


class LinearCritic(torch.nn.Module):
    def __init__(self, d_in):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-0.2, 0.3, d_in, dtype=torch.float64))

    def forward(self, obs):
        return obs @ self.w


@pytest.mark.clause("PPO-MAPPO-3")
@given(st_.mappo_batches(wide=False), st.data())
def test_storage_order_does_not_change_the_update(ppo, case, data):
    batch, _ = case
    n = len(batch["action"])
    perm = torch.tensor(data.draw(st.permutations(range(n))))
    losses = []
    for b in (batch, {k: v[perm] for k, v in batch.items()}):
        aligned = ppo.align_batch(b)
        fields = {k: aligned[k] for k in ("obs", "critic_obs", "action", "old_log_prob", "mask", "advantage", "return")}
        actor, critic = on_device(LinearActor(3, 5)), on_device(LinearCritic(2))
        opt = torch.optim.SGD([*actor.parameters(), *critic.parameters()], lr=0.1)
        recs = ppo.ppo_update(actor, critic, opt, fields, epochs=2, minibatch_size=max(1, n // 2), max_grad_norm=1.0,
                              target_kl=None, generator=generator(5), **HP)
        losses.append(([rec["loss"] for rec in recs], actor.w.detach().clone()))
    (l1, w1), (l2, w2) = losses
    assert_close(torch.tensor(l2, dtype=torch.float64), np.array(l1), "PPO-MAPPO-3", what="per-minibatch losses")
    assert_close(w2, w1, "PPO-MAPPO-3", what="actor after the update")


# ----------------------------------------------------------------------------- bad input
@pytest.mark.clause("PPO-INPUT-5")
@pytest.mark.parametrize("case", ["missing", "ragged"])
def test_incomplete_or_ragged_batches_are_rejected(ppo, case):
    r = {"logits": torch.zeros(3, 2, dtype=torch.float64), "values": torch.zeros(3, dtype=torch.float64),
         "mask": torch.ones(3, 2, dtype=torch.bool), "advantage": torch.ones(3, dtype=torch.float64),
         "return": torch.ones(3, dtype=torch.float64), "seed": 0}
    actor, critic, opt, batch = setup(ppo, r)
    if case == "missing":
        del batch["old_log_prob"]
    else:
        batch["advantage"] = torch.ones(4, dtype=torch.float64)
    assert_rejects("PPO-INPUT-5", ppo.raw("ppo_update"), actor, critic, opt, batch, epochs=1, minibatch_size=3,
                   max_grad_norm=1.0, target_kl=None, **HP)


# ----------------------------------------------------------------------------- PPO-UPDATE-4
class SharedActorCritic:
    """A small MLP trunk shared by a policy head and a value head; the actor records, at every
    forward, the rows it sees (by their obs) and a snapshot of every parameter."""

    def __init__(self, d_in: int, n_actions: int, seed: int, hidden: int = 8):
        g = torch.Generator().manual_seed(seed)
        self.trunk = torch.nn.Linear(d_in, hidden).double()
        self.pi = torch.nn.Linear(hidden, n_actions).double()
        self.v = torch.nn.Linear(hidden, 1).double()
        with torch.no_grad():
            for p in self.params():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
        self.forwards: list[tuple[torch.Tensor, list[torch.Tensor]]] = []
        outer = self

        class Actor(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.trunk, self.pi = outer.trunk, outer.pi

            def forward(self, obs):
                outer.forwards.append((host(obs).clone(), [host(p).clone() for p in outer.params()]))
                return self.pi(torch.tanh(self.trunk(obs)))

        class Critic(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.trunk, self.v = outer.trunk, outer.v

            def forward(self, obs):
                return self.v(torch.tanh(self.trunk(obs))).squeeze(-1)

        self.actor, self.critic = on_device(Actor()), on_device(Critic())  # the shared layers move in place

    def params(self) -> list[torch.nn.Parameter]:
        return [*self.trunk.parameters(), *self.pi.parameters(), *self.v.parameters()]


def plain_minibatch_loss(params, mb, *, clip_eps, vf_coef, ent_coef):
    """The documented total loss of one minibatch, written out in plain torch on explicit parameters."""
    w1, b1, w2, b2, w3, b3 = params
    h = torch.tanh(mb["obs"] @ w1.T + b1)
    logits = (h @ w2.T + b2).masked_fill(~mb["mask"], float("-inf"))
    logp = logits - torch.logsumexp(logits, -1, keepdim=True)
    new = logp.gather(1, mb["action"].view(-1, 1)).squeeze(1)
    ratio = torch.exp(new - mb["old_log_prob"])
    adv = mb["advantage"]
    pl = -torch.min(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv).mean()
    values = (h @ w3.T + b3).squeeze(-1)
    vl = convention("value_loss_factor") * ((mb["return"] - values) ** 2).mean()
    legal_logp = torch.where(mb["mask"], logp, torch.zeros_like(logp))  # no -inf * 0 in value or gradient
    ent = -(logp.exp() * legal_logp).sum(-1).mean()
    return pl + vf_coef * vl - ent_coef * ent


@st.composite
def shared_update_cases(draw):
    """A rollout of 8..16 rows for a shared-trunk actor-critic: (batch, net seed, epochs, minibatch size, loss
    hyper-parameters). The coefficients are drawn: an update that keeps one at its default fails."""
    n, a, d = draw(st.integers(8, 16)), draw(st.integers(2, 5)), 3
    g = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mask = g.random((n, a)) < 0.6
    mask[np.arange(n), g.integers(0, a, n)] = True
    action = np.array([g.choice(np.flatnonzero(m)) for m in mask])
    batch = {"obs": torch.tensor(g.standard_normal((n, d))), "mask": torch.tensor(mask),
             "action": torch.tensor(action, dtype=torch.int64),
             "advantage": torch.tensor(g.standard_normal(n) * draw(st.sampled_from([0.5, 2.0]))),
             "return": torch.tensor(g.standard_normal(n))}
    mb = draw(st.one_of(st.sampled_from([1, n, n - 1, n // 3 + 1]), st.integers(1, n)))
    hp = dict(clip_eps=draw(st.floats(0.05, 0.5)), vf_coef=draw(st.floats(0.1, 2.0)), ent_coef=draw(st.floats(0.0, 0.2)))
    return batch, draw(st.integers(0, 2**16)), draw(st.integers(2, 3)), mb, hp


def _rows_of(obs_mb: torch.Tensor, obs: torch.Tensor) -> list[int]:
    """Indices of the stored rows an actor forward saw (obs rows are distinct by construction)."""
    return torch.cdist(obs_mb, obs).argmin(-1).tolist()


@pytest.mark.clause("PPO-UPDATE-4", "PPO-GRAD-2")
@given(shared_update_cases())
def test_every_step_matches_a_plain_loop_with_a_shared_trunk(ppo, case):
    batch, seed, epochs, mb_size, hp = case
    hp = pin("ppo.ppo_update", hp)
    net = SharedActorCritic(batch["obs"].shape[1], batch["mask"].shape[1], seed)
    with torch.no_grad():  # old log-probs of the initial policy, computed here
        d = on_device(batch)
        z = net.actor(d["obs"]).masked_fill(~d["mask"], float("-inf"))
        old = host((z - torch.logsumexp(z, -1, keepdim=True)).gather(1, d["action"].view(-1, 1)).squeeze(1))
    net.forwards.clear()
    start = [host(p).clone() for p in net.params()]
    # the stored statistics are requires-grad leaves: the update must leave them without gradient
    stored = {"old_log_prob": old.clone().requires_grad_(True), "advantage": batch["advantage"].clone().requires_grad_(True),
              "return": batch["return"].clone().requires_grad_(True)}
    opt = torch.optim.Adam(net.params(), lr=0.05)
    recs = ppo.ppo_update(net.actor, net.critic, opt, {**batch, **stored}, epochs=epochs, minibatch_size=mb_size,
                          max_grad_norm=1e9, target_kl=None, generator=generator(seed), **hp)
    for name, leaf in stored.items():
        assert_no_grad("PPO-GRAD-2", f"the stored {name}", leaf)

    n = len(batch["action"])
    seen = [_rows_of(obs, batch["obs"]) for obs, _ in net.forwards]
    n_mb = -(-n // mb_size)
    assert_that(len(seen) == epochs * n_mb and len(recs) == len(seen), "PPO-UPDATE-4", (len(seen), len(recs)),
                f"{epochs} epochs x {n_mb} minibatches, one forward and one record each")
    orders = [sum(seen[e * n_mb:(e + 1) * n_mb], []) for e in range(epochs)]
    sizes = [len(s) for s in seen[:n_mb]]
    assert_that(sizes == [mb_size] * (n // mb_size) + ([n % mb_size] if n % mb_size else []), "PPO-UPDATE-4",
                sizes, f"minibatches of {mb_size} rows, the remainder last")
    for e, order in enumerate(orders):
        assert_that(sorted(order) == list(range(n)), "PPO-UPDATE-4", order,
                    f"epoch {e}: every one of the {n} rows exactly once, none dropped")
    assert_that(any(o != orders[0] for o in orders[1:]) and orders[0] != list(range(n)), "PPO-UPDATE-4", orders,
                "a fresh shuffle per epoch (not storage order, not one shuffle reused)")

    # the from-scratch loop: same initial parameters, same minibatches, its own Adam steps
    params = [p.clone().requires_grad_(True) for p in start]
    own = torch.optim.Adam(params, lr=0.05)
    fields = {**batch, "old_log_prob": old}
    for k, rows in enumerate(seen):
        got = net.forwards[k][1]
        for i, (pg, pw) in enumerate(zip(got, params)):
            assert_close(pg, to_numpy(pw), "PPO-UPDATE-4", what=f"parameter {i} before step {k}")
        idx = torch.tensor(rows)
        mb = {key: v[idx] for key, v in fields.items()}
        own.zero_grad()
        plain_minibatch_loss(params, mb, **hp).backward()
        own.step()
    for i, (pg, pw) in enumerate(zip(net.params(), params)):
        assert_close(pg.detach(), to_numpy(pw), "PPO-UPDATE-4", what=f"parameter {i} after the update")
