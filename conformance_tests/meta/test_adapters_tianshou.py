"""Meta: the Tianshou adapter passes pre-flight with honest declarations and goes through the library's
own checks. The audit of Tianshou 2.0.1 has no finding (no tianshou page in docs/audits/findings); these
tests pin what the adapter relies on, so a release that changes it is noticed."""
from __future__ import annotations

import pytest
import torch

from conformance_tests.meta.test_adapters_sb3_contrib import check_declarations
from conformance_tests.preflight import build

pytestmark = pytest.mark.meta
IMPL = "conformance_tests.adapters.tianshou:make"


@pytest.fixture(autouse=True)
def _tianshou():
    pytest.importorskip("tianshou")


def test_tianshou_adapter_preflight():
    check_declarations(IMPL, {"sac": ["td_target", "losses", "temperature_update"], "ppo": ["gae"]})
    caps = build(IMPL).capabilities
    assert caps["masks"] is False and caps["differentiable"] is False  # no masks, numbers only


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
