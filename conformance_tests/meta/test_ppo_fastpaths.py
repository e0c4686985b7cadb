"""Differential tests of the PPO update's fast path (reference_impl/ppo/fast.py) against the plain formulas.

``fast.loss_terms_fused`` (closed-form gradients, the trainers' loss) must give the loss, the
diagnostics and the gradients of ``update.loss_terms_deferred`` (autograd through the plain formulas,
each held to independent oracles in test_ppo_*.py); ``ppo_update`` with ``fast.minibatch_loss_fused``
must take the same steps as with the plain loss, with the guards on and off, and its metrics
converted once per update must equal those converted per minibatch. Cases: ratio exactly 1 (the
first epoch), ratios far outside the clip range, entropy bonus on, one legal action per row, float32
and float64.
"""
from __future__ import annotations

import pytest
import torch

from conformance_tests.harness import assert_close, assert_equal
from reference_impl import _checks
from reference_impl.ppo import fast, update

pytestmark = pytest.mark.meta

HP = dict(clip_eps=0.2, vf_coef=0.5, ent_coef=0.01)


def _case(seed: int, dtype, n: int = 24, a: int = 9, *, spread: float = 0.0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, a, generator=g) < 0.5
    mask[:, 2] = True
    mask[0] = False
    mask[0, 2] = True  # one legal action
    logits = torch.randn(n, a, generator=g, dtype=dtype)
    log_pi = torch.log_softmax(logits.masked_fill(~mask, -1e9), -1)
    action = torch.multinomial(mask.double(), 1, generator=g).squeeze(1)
    old = log_pi.gather(1, action[:, None]).squeeze(1) + spread * torch.randn(n, generator=g, dtype=dtype)
    mb = {"mask": mask, "action": action, "advantage": torch.randn(n, generator=g, dtype=dtype),
          "return": torch.randn(n, generator=g, dtype=dtype)}
    return logits, torch.randn(n, generator=g, dtype=dtype), mb, old


def _plain_and_fused(logits, values, mb, old) -> list[tuple]:
    """(loss, diagnostics, ∂/∂logits, ∂/∂values) of the plain path, then of the fused one."""
    out = []
    for loss_terms in (update.loss_terms_deferred, fast.loss_terms_fused):
        z, v = logits.clone().requires_grad_(), values.clone().requires_grad_()
        loss, metrics = loss_terms(z, v, mb, old_log_prob=old, **HP)
        out.append((loss, metrics, *torch.autograd.grad(loss, (z, v))))
    return out


def _assert_fused_is_plain(want: tuple, got: tuple, dtype=None, what: str = "") -> None:
    (loss, metrics, gz, gv), (want_loss, want_m, want_gz, want_gv) = got, want
    assert_close(loss, want_loss, "PPO-LOSS-3", dtype=dtype, what=f"fused loss == plain loss{what}")
    assert_equal(sorted(metrics), sorted(want_m), "PPO-LOSS-3", "the same diagnostics")
    for k in want_m:
        assert_close(metrics[k], want_m[k], "PPO-LOSS-3", dtype=dtype, what=f"diagnostic {k}{what}")
    assert_close(gz, want_gz, "PPO-LOSS-1", dtype=dtype, what=f"gradient into the logits{what}")
    assert_close(gv, want_gv, "PPO-LOSS-2", dtype=dtype, what=f"gradient into the values{what}")


@pytest.mark.clause("PPO-LOSS-3", "PPO-LOSS-1", "PPO-LOSS-2", "PPO-ENT-1", "PPO-LOGP-1")
@pytest.mark.parametrize("spread", [0.0, 0.05, 1.0])  # ratio 1, near the clip edges, far outside
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(4))
def test_fused_loss_terms_equal_the_plain_ones(seed, dtype, spread):
    _assert_fused_is_plain(*_plain_and_fused(*_case(seed, dtype, spread=spread)))


@pytest.mark.clause("PPO-LOSS-3")
@pytest.mark.parametrize("n", [1, 2])
def test_the_ratio_spread_of_a_tiny_minibatch(n):
    """One sample has no spread (0, not the NaN of Bessel's std); two have |r0 - r1| / sqrt(2)."""
    logits, values, mb, old = _case(7, torch.float64, n=n, spread=0.3)
    for loss, metrics, *_ in _plain_and_fused(logits, values, mb, old):
        r = torch.exp(torch.log_softmax(logits.masked_fill(~mb["mask"], -1e9), -1)
                      .gather(1, mb["action"][:, None]).squeeze(1) - old)
        want = 0.0 if n == 1 else float((r[0] - r[1]).abs()) / 2 ** 0.5
        assert_close(metrics["ratio_std"], want, "PPO-LOSS-3", dtype=torch.float64, what=f"ratio_std of {n} sample(s)")


@pytest.mark.clause("PPO-LOSS-3", "PPO-LOSS-1", "PPO-LOSS-2")
@pytest.mark.parametrize("wide", ["advantage and return", "old log-prob", "logits"])
def test_fused_loss_terms_promote_mixed_dtypes_as_the_plain_ones_do(wide):
    """float64 advantages and returns (a numpy GAE) or old log-probs against float32 networks, or the
    other way round: the plain formulas promote; the fused path gives their loss and diagnostics and a
    gradient in each input's dtype. Compared at float32's tolerance."""
    logits, values, mb, old = _case(5, torch.float32, spread=0.3)
    if wide == "advantage and return":
        mb = {**mb, "advantage": mb["advantage"].double(), "return": mb["return"].double()}
    elif wide == "old log-prob":
        old = old.double()
    else:
        logits = logits.double()
    want, got = _plain_and_fused(logits, values, mb, old)
    assert got[0].dtype == want[0].dtype == torch.float64
    assert (got[2].dtype, got[3].dtype) == (logits.dtype, values.dtype)
    _assert_fused_is_plain(want, got, torch.float32, ", mixed dtypes")


def _run(guards: bool, target_kl, minibatch_loss, **kwargs):
    torch.manual_seed(0)
    actor, critic = torch.nn.Linear(5, 9), torch.nn.Linear(5, 1)
    opt = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=0.05)
    g = torch.Generator().manual_seed(1)
    _, _, mb, old = _case(3, torch.float32, n=64, spread=0.1)
    batch = {**mb, "obs": torch.randn(64, 5, generator=g), "old_log_prob": old}
    with _checks.validation(guards):
        recs = update.ppo_update(actor, critic, opt, batch, epochs=3, minibatch_size=16, max_grad_norm=0.5,
                                 target_kl=target_kl, generator=torch.Generator().manual_seed(2),
                                 minibatch_loss=minibatch_loss, **HP, **kwargs)
    return [p.detach() for p in (*actor.parameters(), *critic.parameters())], recs


@pytest.mark.clause("PPO-UPDATE-1", "PPO-KLSTOP-2")
@pytest.mark.parametrize("guards", [True, False])
@pytest.mark.parametrize("target_kl", [None, 1e9])  # metrics once per update / once per minibatch
def test_fused_update_follows_the_plain_one(target_kl, guards):
    want_p, want_r = _run(True, target_kl, update.minibatch_loss_deferred)
    got_p, got_r = _run(guards, target_kl, fast.minibatch_loss_fused)
    for w, g_ in zip(want_p, got_p):
        # the fast loss rounds differently: held to the loss clause's tolerance, not UPDATE-1's exactness
        assert_close(g_, w, "PPO-LOSS-3", what="parameters after the update")
    assert_equal(len(got_r), len(want_r), "PPO-UPDATE-1", "one record per minibatch")
    for w, g_ in zip(want_r, got_r):
        assert_equal(type(g_["approx_kl"]), float, "PPO-UPDATE-1", "metrics are Python floats")
        for k in w:
            assert_close(torch.tensor(float(g_[k])), torch.tensor(float(w[k])), "PPO-LOSS-3", what=f"record {k}")


@pytest.mark.clause("PPO-UPDATE-1")
def test_metrics_synced_across_ranks_are_the_ones_recorded():
    """Under data parallelism each minibatch's metrics pass through ``sync_metrics`` (one call per minibatch,
    its result recorded); an identity sync leaves the update and its records as they are without one."""
    calls = []

    def sync(m):
        calls.append(dict(m))
        return {k: v + (100.0 if k == "entropy" else 0.0) for k, v in m.items()}  # a visible mark

    want_p, want_r = _run(False, None, update.minibatch_loss_deferred)
    got_p, got_r = _run(False, None, update.minibatch_loss_deferred, sync_metrics=sync)
    assert len(calls) == len(want_r) == len(got_r)
    for w, g_ in zip(want_p, got_p):
        assert_equal(g_, w, "PPO-UPDATE-1", "a metrics sync does not change the steps")
    for w, g_ in zip(want_r, got_r):
        assert g_["entropy"] == pytest.approx(w["entropy"] + 100.0) and g_["approx_kl"] == pytest.approx(w["approx_kl"])


@pytest.mark.clause("PPO-LOSS-3")
def test_the_float_diagnostics_minibatch_loss_is_the_deferred_one_read_once():
    """``update.minibatch_loss`` (float diagnostics; the shipped mutants build on it) is the deferred loss
    with its diagnostics read to the host: the same loss, the same numbers."""
    torch.manual_seed(0)
    actor, critic = torch.nn.Linear(5, 9), torch.nn.Linear(5, 1)
    _, _, mb, old = _case(5, torch.float32, n=16, spread=0.1)
    mb = {**mb, "obs": torch.randn(16, 5, generator=torch.Generator().manual_seed(3)), "old_log_prob": old}
    loss, floats = update.minibatch_loss(actor, critic, mb, **HP)
    want, tensors = update.minibatch_loss_deferred(actor, critic, mb, **HP)
    assert_equal(loss, want, "PPO-LOSS-3", "the same loss")
    assert floats.keys() == tensors.keys() and all(type(v) is float for v in floats.values())
    for k, v in tensors.items():
        assert floats[k] == float(v), k


@pytest.mark.clause("PPO-UPDATE-1")
def test_without_a_generator_the_update_shuffles_with_the_global_one():
    """``generator`` left out (the contract's default): the shuffle draws from torch's global generator, so the
    same global seed gives the same update, and every minibatch of every epoch is recorded."""
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        actor, critic = torch.nn.Linear(5, 9), torch.nn.Linear(5, 1)
        opt = torch.optim.SGD([*actor.parameters(), *critic.parameters()], lr=0.1)
        _, _, mb, old = _case(3, torch.float32, n=20, spread=0.1)
        batch = {**mb, "obs": torch.randn(20, 5, generator=torch.Generator().manual_seed(1)), "old_log_prob": old}
        recs = update.ppo_update(actor, critic, opt, batch, epochs=2, minibatch_size=8, max_grad_norm=0.5,
                                 target_kl=None, **HP)
        runs.append(([p.detach() for p in (*actor.parameters(), *critic.parameters())], recs))
    assert [(r["epoch"], r["minibatch"]) for r in runs[0][1]] == [(e, k) for e in range(2) for k in range(3)]
    for a, b in zip(runs[0][0], runs[1][0]):
        assert_equal(a, b, "PPO-UPDATE-1", "the same global seed, the same update")


def test_parameter_groups_clip_a_shared_parameter_once_and_accept_plain_functions():
    """Actor parameters, then the critic's that the actor does not already hold; a network given as a plain
    function (no parameters) adds no group."""
    trunk = torch.nn.Linear(3, 3)
    actor = torch.nn.Sequential(trunk, torch.nn.Linear(3, 4))
    critic = torch.nn.Sequential(trunk, torch.nn.Linear(3, 1))
    actor_ps, critic_ps = list(actor.parameters()), list(critic[1].parameters())
    groups = update._param_groups(actor, critic)
    assert [[id(p) for p in g] for g in groups] == [[id(p) for p in actor_ps], [id(p) for p in critic_ps]]
    assert [[id(p) for p in g] for g in update._param_groups(actor, lambda obs: obs.sum(-1))] == \
        [[id(p) for p in actor_ps]]
    assert [[id(p) for p in g] for g in update._param_groups(lambda obs: obs, critic)] == \
        [[id(p) for p in critic.parameters()]]


def _on_the_edge(new: torch.Tensor, target: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Old log-probs that put the ratio exp(new − old), as torch computes it, exactly on ``target`` (a walk over
    the last bits of old, from new − log(target)), and which rows it reached (exp skips some values)."""
    import math

    old = new - math.log(target)
    for _ in range(64):
        r = torch.exp(new - old)
        old = torch.where(r == target, old, torch.nextafter(old, torch.where(r > target, math.inf, -math.inf)))
    return old, torch.exp(new - old) == target


@pytest.mark.clause("PPO-LOSS-1")
@pytest.mark.parametrize("edge", [0.8, 1.2], ids=["ratio-at-1-eps", "ratio-at-1+eps"])
def test_fused_gradient_at_a_ratio_exactly_on_the_clip_edge(edge):
    """r = 1 ± ε exactly: the two objectives tie and the clamp sits on its edge, where autograd takes half of
    each branch and the clamp passes the gradient, so the gradient is the unclipped one. The fused path, fed
    ratios exactly on the edge (every action legal: its log-probs are log_softmax(z) itself), must give the
    plain gradient with ε = 0.5, where r is inside the range (the plain path's own ratios may sit an ulp
    off the edge, where the gradient of a row with A < 0 jumps to 0)."""
    logits, values, mb, _ = _case(7, torch.float64, n=48)
    mb = {**mb, "mask": torch.ones_like(mb["mask"])}
    new = torch.log_softmax(logits, -1).gather(1, mb["action"][:, None]).squeeze(1)
    old, hit = _on_the_edge(new, edge)
    logits, values, old = logits[hit], values[hit], old[hit]
    mb = {k: v[hit] for k, v in mb.items()}
    assert bool((mb["advantage"] < 0).sum() >= 3 and (mb["advantage"] > 0).sum() >= 3), "too few rows on the edge"
    z, v = logits.clone().requires_grad_(), values.clone().requires_grad_()
    loss, _ = update.loss_terms_deferred(z, v, mb, old_log_prob=old, **{**HP, "clip_eps": 0.5})
    want = torch.autograd.grad(loss, z)[0]
    zf, vf = logits.clone().requires_grad_(), values.clone().requires_grad_()
    got = torch.autograd.grad(fast.loss_terms_fused(zf, vf, mb, old_log_prob=old, **HP)[0], zf)[0]
    assert_close(got, want, "PPO-LOSS-1", what=f"gradient into the logits at r = {edge}, ε = {HP['clip_eps']}")


@pytest.mark.clause("PPO-LOSS-3")
def test_fused_gradient_scales_with_the_upstream_gradient():
    """A loss scaled before backward (accumulation, a loss weight) scales both closed-form gradients."""
    logits, values, mb, old = _case(2, torch.float64, spread=0.3)
    grads = []
    for fn in (update.loss_terms_deferred, fast.loss_terms_fused):
        z, v = logits.clone().requires_grad_(), values.clone().requires_grad_()
        grads.append(torch.autograd.grad(-3.0 * fn(z, v, mb, old_log_prob=old, **HP)[0], (z, v)))
    assert_close(grads[1][0], grads[0][0], "PPO-LOSS-3", what="logits gradient of -3 x loss")
    assert_close(grads[1][1], grads[0][1], "PPO-LOSS-3", what="values gradient of -3 x loss")
