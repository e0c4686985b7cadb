"""Meta: the TorchRL adapter passes pre-flight with honest declarations, and each TorchRL finding page's
repro (the library alone) still prints the defect it reports, so a fixed upstream release is noticed."""
from __future__ import annotations

import math
import re

import pytest
import torch

from conformance_tests.errors import NotApplicable
from conformance_tests.meta.test_adapters_sb3_contrib import (
    check_declarations,
    repro_output,
)

pytestmark = pytest.mark.meta
IMPL = "conformance_tests.adapters.torchrl:make"
F64 = torch.float64


@pytest.fixture(autouse=True)
def _torchrl():
    pytest.importorskip("torchrl")


@pytest.fixture(scope="module")
def impl():
    pytest.importorskip("torchrl")
    from conformance_tests.preflight import build

    return build(IMPL)


def test_torchrl_adapter_preflight(impl):
    check_declarations(IMPL, {
        "sac": ["entropy_from_logits", "policy_loss_from_logits", "losses", "temperature_loss", "temperature_update",
                "td_target", "soft_update", "ema_update", "init_target", "cql_penalty"],
        "ppo": ["masked_distribution", "sample_actions", "evaluate_actions", "gae", "losses", "clipped_policy_loss",
                "normalize_advantages"],
        "ccapo": ["macro_advantage", "policy_loss"]})
    # the weight DiscreteCQLLoss does not take, the eps and the (absent) clamp of ClipPPOLoss's standardisation
    assert impl.capabilities["pinned"] == {"sac.cql_penalty": {"lam": 1.0},
                                           "ppo.normalize_advantages": {"eps": 1e-6, "clamp": None}}


def test_no_op_is_left_out_as_not_adapted_yet():
    from conformance_tests.adapters import torchrl as adapter

    assert not [op for op, why in adapter.LEFT_OUT.items() if "not adapted yet" in why]


# ----------------------------------------------------------------------------- SoftUpdate
def test_soft_and_ema_updates_are_softupdate_steps(impl):
    got = impl.sac.soft_update(torch.tensor([0.0, 10.0], dtype=F64), torch.tensor([1.0, 0.0], dtype=F64), tau=0.005)
    assert got.tolist() == pytest.approx([0.005, 9.95], abs=1e-12)
    assert impl.sac.ema_update(torch.tensor([2.0], dtype=F64), torch.tensor([4.0], dtype=F64), m=0.99).tolist() == \
        pytest.approx([2.02], abs=1e-12)
    assert impl.sac.soft_update(torch.tensor(0.5), torch.tensor(1.5), tau=0.5).dtype == torch.float32
    with pytest.raises(ValueError):  # SoftUpdate checks eps = 1 - tau in [0, 1] (objectives/utils.py:582)
        impl.sac.soft_update(torch.zeros(2), torch.ones(2), tau=1.5)


def test_init_target_holds_torchrl_target_parameters(impl):
    from conformance_tests.modules import TwinTable

    critic = TwinTable(torch.tensor([[1.0, 2.0]], dtype=F64), torch.tensor([[3.0, 4.0]], dtype=F64))
    target = impl.sac.init_target(critic)
    online = dict(critic.named_parameters())
    assert sorted(dict(target.named_parameters())) == sorted(online)
    for name, p in target.named_parameters():
        assert torch.equal(p, online[name].detach()) and not p.requires_grad
        assert p.data_ptr() != online[name].data_ptr()
    with torch.no_grad():
        critic.q1.table.add_(10.0)
    assert target(torch.tensor([0]))[0].tolist() == [[1.0, 2.0]]


# ----------------------------------------------------------------------------- DiscreteCQLLoss
def test_cql_penalty_is_loss_cql_at_weight_one(impl):
    # SAC-CQL-1 at the pinned lam = 1 over every action: logsumexp(Q) - Q(a), mean, gradient (softmax - e_a)/B
    q = torch.tensor([[0.3, -1.2, 2.0, 0.7], [1.5, 0.1, -0.4, 3.2], [-2.0, 0.9, 0.0, 1.1]], dtype=F64)
    a = torch.tensor([2, 0, 3])
    x = q.clone().requires_grad_(True)
    got = impl.sac.cql_penalty(x, a, lam=1.0)
    want = (torch.logsumexp(q, -1) - q[torch.arange(3), a]).mean()
    assert got.item() == pytest.approx(want.item(), abs=1e-12)
    assert impl.sac.cql_penalty(q, a).item() == pytest.approx(want.item(), abs=1e-12)  # TorchRL's weight is 1
    got.backward()
    grad = (torch.softmax(q, -1) - torch.nn.functional.one_hot(a, 4)) / 3
    assert torch.allclose(x.grad, grad, atol=1e-12)
    legal = torch.ones(3, 4, dtype=torch.bool)
    assert impl.sac.cql_penalty(q, a, lam=1.0, legal_mask=legal).item() == pytest.approx(want.item(), abs=1e-12)
    with pytest.raises(NotApplicable):  # no legal mask in DiscreteCQLLoss (cql.py:1346)
        impl.sac.cql_penalty(q, a, lam=1.0, legal_mask=legal.logical_xor(torch.eye(3, 4, dtype=torch.bool)))


# ----------------------------------------------------------------------------- ClipPPOLoss(normalize_advantage=True)
def test_normalize_advantages_is_clipppoloss_standardisation(impl):
    norm = impl.ppo.normalize_advantages
    assert norm(torch.tensor([1.0, 2.0, 3.0], dtype=F64)).tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-12)
    tiny = norm(torch.tensor([0.0, 2e-7], dtype=F64))  # Bessel std 1.4e-7, clamped at 1e-6 (_utils.py:1263)
    assert tiny.tolist() == pytest.approx([-0.1, 0.1], rel=1e-9)
    assert norm(torch.tensor([5.0], dtype=F64)).tolist() == [5.0]  # skipped for one element (ppo.py:1074): finding
    assert norm(torch.tensor([1.0, float("nan")], dtype=F64)).isnan().all()  # no finiteness check: finding


# ----------------------------------------------------------------------------- GRPOLoss
NEW = [[-0.2, -1.4, -0.9], [-0.5, -2.0, 0.0]]
OLD = [[-0.6, -1.0, -0.95], [-0.1, -2.1, 0.0]]
REF = [[-0.4, -1.1, -1.3], [-0.8, -1.7, 0.0]]
ADV = [[1.5, -0.7, 2.0], [-1.2, 0.8, 0.0]]


def _loop(new, old, ref, adv, mask, clip=0.2):
    """Per-trajectory means of the clipped surrogate and of k3 over real steps, then means over trajectories."""
    surr, kl = [], []
    for b in range(len(new)):
        steps = [t for t in range(len(new[b])) if mask[b][t]]
        r = [math.exp(new[b][t] - old[b][t]) for t in steps]
        surr.append(sum(min(x * adv[b][t], min(max(x, 1 - clip), 1 + clip) * adv[b][t]) for x, t in zip(r, steps))
                    / len(steps))
        kl.append(sum(math.exp(ref[b][t] - new[b][t]) - (ref[b][t] - new[b][t]) - 1 for t in steps) / len(steps))
    return sum(surr) / len(surr), sum(kl) / len(kl)


def test_policy_loss_is_grpoloss_prompt_mean(impl):
    t = [torch.tensor(v, dtype=F64) for v in (NEW, OLD, REF, ADV)]
    full = torch.ones(2, 3, dtype=torch.bool)
    out = impl.ccapo.policy_loss(*t, full, clip_eps=0.2, beta_kl=0.04)
    surr, kl = _loop(NEW, OLD, REF, ADV, full.tolist())
    assert out["loss_clip"].item() == pytest.approx(-surr, abs=1e-12)  # no padding: the contract's value
    assert out["kl_ref"].item() == pytest.approx(kl, abs=1e-12)
    assert out["loss"].item() == pytest.approx(-surr + 0.04 * kl, abs=1e-12)
    zero = impl.ccapo.policy_loss(*t, full, clip_eps=0.2, beta_kl=0.0)  # no KL term at 0 (grpo.py:747)
    assert zero["loss_kl"].item() == 0.0 and zero["kl_ref"].item() == pytest.approx(kl, abs=1e-12)


def test_policy_loss_padding_findings(impl):
    # one padded step: the surrogate is right, the KL is divided by B*T = 6, not per trajectory (grpo.py:915)
    t = [torch.tensor(v, dtype=F64) for v in (NEW, OLD, REF, ADV)]
    mask = [[True, True, True], [True, True, False]]
    out = impl.ccapo.policy_loss(*t, torch.tensor(mask), clip_eps=0.2, beta_kl=0.04)
    surr, kl = _loop(NEW, OLD, REF, ADV, mask)
    real_k3 = sum(math.exp(REF[b][s] - NEW[b][s]) - (REF[b][s] - NEW[b][s]) - 1 for b in range(2) for s in range(3)
                  if mask[b][s])
    assert out["loss_clip"].item() == pytest.approx(-surr, abs=1e-12)
    assert out["kl_ref"].item() == pytest.approx(real_k3 / 6, abs=1e-12) and abs(out["kl_ref"].item() - kl) > 1e-3
    # an all-padding row counts as a sample with loss 0 in prompt_mean (grpo.py:804-810)
    pad = [torch.cat([x, torch.full((1, 3), -0.3, dtype=F64)]) for x in t]
    padded = impl.ccapo.policy_loss(*pad, torch.tensor(mask + [[False] * 3]), clip_eps=0.2, beta_kl=0.0)
    assert padded["loss_clip"].item() == pytest.approx(-surr * 2 / 3, abs=1e-12)


def test_torchrl_popart_is_not_the_seed_recursion():
    # why sac.popart_step is left out: from mu = 0, var = 1 (debiasing done), beta = 0.5, x = 2 the seed gives
    # mu = 1, var = 0.5 + 0.5 (2 - 1)^2 = 1; PopArtValueNorm's second-moment EMA gives 1.5 (value_norm.py:165-185)
    from torchrl.modules import PopArtValueNorm

    vn = PopArtValueNorm(shape=1, beta=0.5, epsilon=1e-12)
    vn.running_mean.fill_(0.0), vn.running_mean_sq.fill_(1.0), vn.debiasing_term.fill_(1.0)
    vn.update(torch.tensor([2.0]))
    mean, var = vn._running_stats()
    assert mean.item() == pytest.approx(1.0) and var.item() == pytest.approx(1.5)


# Each finding page's repro, and what its output must show while the defect is there.
REPROS = {
    "torchrl-discrete-sac-masked-nan.md": ["'loss_actor': nan", "'loss_alpha': nan", "'entropy': nan"],
    "torchrl-mcadvantage-non-finite-returns.md": ["advantage: [nan, nan]"],
    "torchrl-masked-categorical-unchecked-inputs.md": [
        "illegal replayed action 1, log_prob: [-inf]",  # scored instead of raising
        "NaN logit, log_prob(0): [-inf]", "probs: [[nan, nan, nan]]"],
    "torchrl-td0-accepts-any-gamma.md": ["gamma=-0.5: target [-1.5, 1.0]", "gamma=1.5: target [8.5, 1.0]",
                                         "TD0Estimator(gamma=-0.5) accepted"],
    "torchrl-clipppoloss-unvalidated-clip-epsilon.md": [
        "clip_epsilon=1.5: log-ratio clip bounds [nan, 0.916], loss_objective nan", "NaN advantage: loss_objective nan"],
    "torchrl-clipppoloss-advantage-normalisation-unchecked.md": [
        "[5.0] -> normalised 5.0", "[1.0, nan, 3.0] -> normalised [nan, nan, nan]"],
    "torchrl-grpoloss-kl-averaged-over-padding.md": [
        "token_mean kl_to_ref: 0.0266", "prompt_mean kl_to_ref: 0.0266", "k3 of every real token: 0.0426"],
    "torchrl-grpoloss-prompt-mean-counts-empty-samples.md": ["loss_objective: -0.5 "],
    "torchrl-grpoloss-unchecked-inputs.md": ["clip_epsilon=0.0 accepted, clip bounds: [-0.0, 0.0]",
                                             "NaN logit: loss_objective nan"],
}


@pytest.mark.parametrize("page", sorted(REPROS))
def test_torchrl_finding_repro_prints_the_defect(page, run_python):
    out = repro_output(page, run_python)
    assert all(needle in out for needle in REPROS[page]), out


def test_torchrl_mcadvantage_degenerate_group_repro_prints_non_zero_advantages(run_python):
    out = repro_output("torchrl-mcadvantage-degenerate-group.md", run_python)
    values = [float(v) for v in re.search(r"advantage: \[(.*?)\]", out).group(1).split(",")]
    assert len(values) == 7 and all(abs(v - 0.9258201122283936) < 1e-6 for v in values), out  # equal returns
