"""Meta: the Tianshou adapter passes pre-flight with honest declarations and goes through the library's
own checks, and each tianshou finding page's repro (the library alone) still prints the defect it reports. These
tests pin what the adapter relies on, so a release that changes it is noticed."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conformance_tests.meta.test_adapters_sb3_contrib import (
    check_declarations,
    repro_output,
)
from conformance_tests.preflight import build

pytestmark = pytest.mark.meta
IMPL = "conformance_tests.adapters.tianshou:make"


@pytest.fixture(autouse=True)
def _tianshou():
    pytest.importorskip("tianshou")


def test_tianshou_adapter_preflight():
    check_declarations(IMPL, {"sac": ["td_target", "losses", "temperature_update", "cql_penalty"],
                              "ppo": ["gae", "clipped_policy_loss", "value_loss", "normalize_advantages"]})
    caps = build(IMPL).capabilities
    assert caps["masks"] is False  # no masks; only the losses read from Tianshou's frames keep a graph
    assert sorted(caps["differentiable"]) == ["ppo.clipped_policy_loss", "ppo.value_loss", "sac.cql_penalty"]
    assert caps["pinned"] == {"ppo.normalize_advantages": {"eps": 1e-8, "clamp": None}}


F64 = torch.float64


def test_tianshou_clipped_policy_loss_is_ppos_own_with_a_float32_ratio():
    # r = 1.5 and 0.5 are clipped on their advantage's side (no gradient), r = 1 is not: loss -(2.4 - 0.8 + 3)/3
    r = torch.tensor([1.5, 0.5, 1.0], dtype=F64, requires_grad=True)
    loss = build(IMPL).ppo.clipped_policy_loss(r, torch.tensor([2.0, -1.0, 3.0], dtype=F64), clip_eps=0.2)
    loss.backward()
    assert loss.dtype == F64 and abs(loss.item() + 4.6 / 3) < 1e-7 and r.grad.tolist() == [0.0, 0.0, -1.0]
    # ppo.py:187 .float(): the float64 ratio 1.1 comes back as float32's 1.1 (tianshou-ppo-ratio-float32.md)
    one = build(IMPL).ppo.clipped_policy_loss(torch.tensor([1.1], dtype=F64), torch.ones(1, dtype=F64), clip_eps=0.2)
    assert one.item() == -torch.tensor(1.1).item() != -1.1


def test_tianshou_value_loss_has_no_half_and_a_gradient():
    v = torch.tensor([1.0, 2.0], dtype=F64, requires_grad=True)
    loss = build(IMPL).ppo.value_loss(v, torch.tensor([0.0, 4.0], dtype=F64))
    loss.backward()  # (returns - value).pow(2).mean() (ppo.py:208): declared value_loss_factor 1.0
    assert loss.item() == 2.5 and v.grad.tolist() == [1.0, -2.0]


def test_tianshou_normalize_advantages_in_row_order_leaves_numpy_rng_alone():
    a = torch.tensor([1.0, 5.0, 2.0, 3.0, 0.5, -4.0], dtype=F64)
    state = np.random.get_state()[1].copy()
    got = build(IMPL).ppo.normalize_advantages(a)  # Batch.split shuffles with np.random (data/batch.py:1209)
    assert np.array_equal(np.random.get_state()[1], state)
    assert torch.allclose(got, (a - a.mean()) / (a.std() + 1e-8), rtol=1e-12, atol=0)


def test_tianshou_cql_penalty_is_discrete_cqls_weighted_term():
    # logsumexp of two equal values x is x + log 2; minus the taken Q leaves log 2 per row, times min_q_weight
    q = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=F64, requires_grad=True)
    got = build(IMPL).sac.cql_penalty(q, torch.tensor([0, 1]), lam=0.5)
    got.backward()  # d/dQ: lam (softmax - onehot) / B
    assert abs(got.item() - 0.5 * math.log(2)) < 1e-12
    assert torch.allclose(q.grad, torch.tensor([[-0.125, 0.125], [0.125, -0.125]], dtype=F64), rtol=0, atol=1e-15)


def test_tianshou_gae_truncation_bootstraps_termination_does_not():
    # hand-computed: γ = 0.5, λ = 1, V = 0, V' = 4; step 0 truncated (keeps γV' = 2, cuts the trace),
    # step 1 terminated (no bootstrap): A = (1 + 2, 1)
    one, zero, four = (torch.full((2,), v, dtype=torch.float64) for v in (1.0, 0.0, 4.0))
    adv, ret = build(IMPL).ppo.gae(one, zero, four, torch.tensor([False, True]), gamma=0.5, lam=1.0,
                                   truncated=torch.tensor([True, False]))
    assert adv.tolist() == [3.0, 1.0] and ret.tolist() == [3.0, 1.0]


@pytest.mark.parametrize("gamma", [1.5, -0.5])
def test_tianshou_td_target_goes_through_the_algorithms_gamma_check(gamma):
    # DiscreteSAC's constructor asserts 0 <= gamma <= 1 (modelfree/ddpg.py:254); the bare staticmethod does not
    x = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(AssertionError, match="gamma"):
        build(IMPL).sac.td_target(x, x, x, gamma=gamma)


# Each finding page's repro, and what its output must show while the defect is there.
REPROS = {
    "tianshou-ppo-ratio-float32.md": ["actor_loss: -1.1051709651947021 float64: -1.1051709180756477"],
    "tianshou-ppo-no-input-checks.md": [
        "eps_clip=1.5: actor_loss 0", "adv [nan, 1]: actor_loss nan, params finite: False",
        "one row, normalised: actor_loss nan, params finite: False", "2 rows, 1 advantage: actor_loss -1"],
}


@pytest.mark.parametrize("page", sorted(REPROS))
def test_tianshou_finding_repro_prints_the_defect(page, run_python):
    out = repro_output(page, run_python)
    assert all(needle in out for needle in REPROS[page]), out
