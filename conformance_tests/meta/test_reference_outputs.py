"""The reference reports every output its contract documents, under the documented names.

The contract lets an implementation leave an optional diagnostic out (``Output(required=False)``: a test
that reads it is then *not applicable*), so a renamed key in the reference would only turn its own checks
N/A and the audit would still pass. The reference computes them all; here each op that returns a dict is
called once on a small valid input and its keys are held to ``OUTPUTS``.
"""
from __future__ import annotations

import pytest
import torch

from conformance_tests.contract import outputs
from conformance_tests.modules import TableModule, TwinTable
from reference_impl.ccapo.losses import policy_loss
from reference_impl.ppo import loss_level as ppo_loss_level
from reference_impl.sac import loss_level as sac_loss_level

pytestmark = pytest.mark.meta
B, A = 3, 4


def _mask() -> torch.Tensor:
    m = torch.ones(B, A, dtype=torch.bool)
    m[0, 3] = False
    return m


def _ccapo() -> dict:
    z = torch.zeros(2, 3, dtype=torch.float64)
    return policy_loss(z.clone().requires_grad_(), z, z, z, torch.ones(2, 3, dtype=torch.bool))


def _ppo() -> dict:
    g = torch.Generator().manual_seed(0)
    batch = {"obs": torch.arange(B), "action": torch.tensor([0, 1, 2]), "old_log_prob": torch.full((B,), -1.0),
             "mask": _mask(), "advantage": torch.randn(B, generator=g), "return": torch.randn(B, generator=g)}
    return ppo_loss_level.losses(TableModule(torch.randn(B, A, generator=g)), TableModule(torch.randn(B, generator=g)),
                                 batch)


def _sac() -> dict:
    g = torch.Generator().manual_seed(1)

    def twin():
        return TwinTable(torch.randn(B, A, generator=g), torch.randn(B, A, generator=g))
    batch = {"obs": torch.arange(B), "next_obs": torch.arange(B), "action": torch.tensor([0, 1, 2]),
             "reward": torch.randn(B, generator=g), "done": torch.tensor([False, True, False]),
             "legal_mask": _mask(), "next_legal_mask": _mask()}
    return sac_loss_level.losses(TableModule(torch.randn(B, A, generator=g)), twin(), twin(), batch,
                                 log_alpha=torch.zeros((), requires_grad=True), gamma=0.99)


CALLS = {"ccapo.policy_loss": _ccapo, "ppo.losses": _ppo, "sac.losses": _sac}


@pytest.mark.parametrize("op", CALLS)
def test_the_reference_reports_every_documented_output(op):
    documented = outputs(op)
    assert documented, f"{op} has no OUTPUTS entry in its family's contract"
    assert sorted(CALLS[op]()) == sorted(documented)


def test_every_op_with_documented_outputs_is_called_here():
    import importlib

    for family in ("ccapo", "ppo", "sac", "isreshape"):
        declared = getattr(importlib.import_module(f"conformance_tests.contract.{family}"), "OUTPUTS", {})
        assert {f"{family}.{name}" for name in declared} <= set(CALLS), family
