"""Meta-tests of the reference's SAC update step (reference_impl/sac/step.py) where its options and its report
meet a caller: the plain path takes no fused head, option B's policy loss keeps its Top-p mass, the diagnostics
are the documented ones, and a one-element log α is read like a 0-d one.
"""
from __future__ import annotations

from unittest import mock

import pytest
import torch

from conformance_tests.harness import assert_close
from conformance_tests.meta.test_sac_graph import A, D, _batch, _nets, _state
from reference_impl import _checks
from reference_impl.sac import fast, masking, step
from reference_impl.sac.losses import policy_loss_total
from reference_impl.sac.step import policy_objective, step_hp, update_step

pytestmark = pytest.mark.meta

# update_step's report, as its docstring lists it
DIAGNOSTICS = {"critic_loss", "cql_loss", "policy_loss", "bc_loss", "alpha_loss", "critic_grad_norm",
               "policy_grad_norm", "target_mean", "q_mean", "top_p_coverage", "demo_share", "entropy",
               "target_entropy", "alpha"}


def _refuse(*_a, **_k):
    raise AssertionError("a fused head ran on the plain path")


@pytest.mark.clause("SAC-STEP-1")
def test_the_plain_path_takes_no_fused_head():
    """fast=False is the oracle of the fused heads: it must not run any of them (a plain path that did would
    make every differential test compare a head with itself)."""
    with mock.patch.multiple(fast, critic_heads_fused=_refuse, policy_head_fused=_refuse,
                             top_p_backup_fused=_refuse), mock.patch.multiple(
            step, critic_heads_fused=_refuse, policy_head_fused=_refuse, top_p_backup_fused=_refuse):
        out = update_step(*_nets(5, D, A), _batch(40), top_p=0.9, fast=False)
    assert set(out) == DIAGNOSTICS


@pytest.mark.clause("SAC-POL-3", "SAC-POL-2")
def test_option_b_policy_loss_keeps_its_top_p_mass():
    """policy_use_topp: the policy objective is L_π over the Top-p set (SAC-POL-2) plus BC, at the step's p."""
    nets, b = _nets(6, D, A), _batch(41)
    s = _state(nets)
    hp = step_hp(top_p=0.7, policy_use_topp=True, lambda_bc=0.2)
    with _checks.validation(False):
        loss, _, _ = policy_objective(s, b, hp)
        with torch.no_grad():
            pi = masking.masked_softmax(s["policy"](b["obs"]), b["legal_mask"])
            q1, q2 = s["critic"](b["obs"])
            want = policy_loss_total(pi, q1, q2, b["legal_mask"], b["action"], b["is_demo"],
                                     alpha=s["log_alpha"].detach().exp(), lam_bc=0.2, p=0.7)
    assert_close(loss.detach(), want, "SAC-POL-3", what="option B total at p = 0.7")


@pytest.mark.clause("SAC-STEP-1")
def test_the_report_is_the_documented_diagnostics_with_a_one_element_log_alpha():
    """The diagnostics are exactly the documented names, and a log α of shape [1] reports like a 0-d one."""
    scalar, vector = _nets(7, D, A), list(_nets(7, D, A))
    vector[3] = vector[3].detach().reshape(1).requires_grad_(True)
    vector[4]["alpha"] = torch.optim.Adam([vector[3]], lr=0.05)
    with _checks.validation(False):
        got = update_step(*vector, _batch(42), top_p=0.9)
        want = update_step(*scalar, _batch(42), top_p=0.9)
    assert set(got) == set(want) == DIAGNOSTICS
    for k in DIAGNOSTICS:
        assert_close(torch.tensor(got[k]), torch.tensor(want[k]), "SAC-STEP-1", what=k)


@pytest.mark.clause("SAC-STEP-1")
def test_the_update_defaults_are_v2s():
    """update_step with its keywords left out is the V2 update: CQL on and a Huber δ of 1 (neither is in the
    defaults table), plus the table's values, which test_reference_entry_points.py checks by name."""
    with _checks.validation(False):
        implicit = update_step(*_nets(8, D, A), _batch(43))
        explicit = update_step(*_nets(8, D, A), _batch(43), use_cql=True, huber_delta=1.0)
    assert implicit == explicit and implicit["cql_loss"] != 0.0


@pytest.mark.parametrize("want", [torch.float64, torch.float32])
def test_the_target_entropy_comes_in_the_dtype_the_update_asks_for(want):
    """The update compares H_tgt with its policy's entropy, so it asks target_entropy for that dtype: a bool mask
    gives κ·log|A(s)| in the dtype asked, whatever torch's default is (a float32 target would cost a float64 run
    5e-8 nats per step), and in the default dtype when none is asked."""
    legal = torch.tensor([[True, True, False, True], [True, False, False, False]])
    got = masking.target_entropy(legal, kappa=0.9, dtype=want)
    assert got.dtype == want
    assert torch.equal(got, 0.9 * torch.log(torch.tensor([3.0, 1.0], dtype=want)))
    assert masking.target_entropy(legal).dtype == torch.get_default_dtype()


def test_the_legal_set_takes_leading_batch_axes_as_its_docstring_says():
    """legal_set documents compliance as [..., V] (the contract passes [B, V]): a [T, B, V] stack gives each
    [B, V] slice's legal set, the fallback taken row by row, not by a count over the wrong axis."""
    torch.manual_seed(5)
    V = 6
    compliance = torch.rand(2, 4, V) < 0.4
    compliance[0, 0] = torch.tensor([True, True, True, True, False, False])  # 4 legal with <eos>: no fallback
    compliance[1, 3] = False  # only <eos>: the fallback row
    fallback = torch.tensor([False, True, True, False, False, False])
    stacked = masking.legal_set(compliance, eos_index=V - 1, fallback=fallback)
    for t in range(2):
        assert torch.equal(stacked[t], masking.legal_set(compliance[t], eos_index=V - 1, fallback=fallback))
    assert torch.equal(stacked[1, 3], torch.tensor([False, True, True, False, False, True]))
    assert torch.equal(stacked[0, 0], torch.tensor([True, True, True, True, False, True]))
