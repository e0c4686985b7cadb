"""SAC §1/§3: stable masked softmax, legal set with eos and fallback, entropy target, entropy."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance_tests import oracles
from conformance_tests import strategies as st_
from conformance_tests.harness import assert_low_precision, assert_close, assert_equal, assert_rejects, assert_that

EPS = 1e-8


@pytest.mark.clause("SAC-MASK-1")
@given(st_.logits_and_masks())
def test_masked_softmax_matches_softmax_over_legal_set(sac, zm):
    z, mask = zm
    got = sac.masked_softmax(z, mask)
    expected = np.maximum(oracles.masked_softmax(z.numpy(), mask.numpy()), EPS)
    assert_close(got, expected, "SAC-MASK-1")


@pytest.mark.clause("SAC-MASK-1")
@given(st_.logits_and_masks(), st.floats(-1e3, 1e3))
def test_masked_softmax_is_shift_invariant(sac, zm, c):
    z, mask = zm
    assert_close(sac.masked_softmax(z + c, mask), sac.masked_softmax(z, mask).numpy(), "SAC-MASK-1")


@pytest.mark.clause("SAC-MASK-1")
def test_masked_softmax_golden(sac):
    # logits [1, 2, 3] with the middle action illegal: softmax over {1, 3} = [1/(1+e^2), e^2/(1+e^2)]
    z = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    mask = torch.tensor([[True, False, True]])
    e2 = math.exp(2.0)
    assert_close(sac.masked_softmax(z, mask), [[1 / (1 + e2), EPS, e2 / (1 + e2)]], "SAC-MASK-1")


@pytest.mark.clause("SAC-MASK-2")
@given(st_.logits_and_masks(scale=1e3), st_.keyword_arguments("sac.masked_softmax"))
def test_every_probability_is_clipped_at_eps(sac, zm, kw):
    z, mask = zm
    eps = kw["eps"]
    got = sac.masked_softmax(z, mask, **kw)
    assert_that(got >= eps, "SAC-MASK-2", got, f"every entry >= {eps}")
    illegal = got[~mask]
    assert_equal(illegal, torch.full_like(illegal, eps), "SAC-MASK-2", "illegal entries hold exactly eps")
    assert_that(torch.isfinite(torch.log(got)), "SAC-MASK-2", got, "finite log everywhere")


@pytest.mark.clause("SAC-MASK-3")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@given(zm=st_.logits_and_masks(scale=1e4))
def test_masked_softmax_stays_finite_in_low_precision(sac, dtype, zm):
    z, mask = zm
    got = sac.masked_softmax(z.to(dtype), mask)
    assert_that(torch.isfinite(got) & (got > 0), "SAC-MASK-3", got, "finite, positive probabilities")
    assert_that(torch.isfinite(torch.log(got.float())), "SAC-MASK-3", got, "finite log")
    legal_mass = torch.where(mask, got.double(), torch.zeros_like(got.double())).sum(-1)
    assert_close(legal_mass, np.ones(len(legal_mass)), "SAC-MASK-3", dtype=dtype, what="legal mass")
    # the values, not only their finiteness: the float64 answer for the same rounded logits
    zr, m = z.to(dtype).double().numpy(), mask.numpy()
    zs = np.where(m, zr - np.where(m, zr, -np.inf).max(-1, keepdims=True), -np.inf)
    expected = np.maximum(np.exp(zs) / np.exp(zs).sum(-1, keepdims=True), EPS)
    assert_low_precision(got, expected, "SAC-MASK-3", dtype, "probabilities")


@pytest.mark.clause("SAC-INPUT-1")
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_logits_are_rejected(sac, bad):
    z = torch.tensor([[0.5, bad, 1.0]], dtype=torch.float64)
    assert_rejects("SAC-INPUT-1", sac.raw("masked_softmax"), z, torch.ones(1, 3, dtype=torch.bool))


@pytest.mark.clause("SAC-INPUT-2")
def test_row_without_legal_action_is_rejected(sac):
    z = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[True, False, False], [False, False, False]])
    assert_rejects("SAC-INPUT-2", sac.raw("masked_softmax"), z, mask)


@pytest.mark.clause("SAC-INPUT-2")
def test_mismatched_shapes_are_rejected(sac):
    assert_rejects("SAC-INPUT-2", sac.raw("masked_softmax"), torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool))


# ----------------------------------------------------------------------------- legal set
@st.composite
def compliance_rows(draw):
    B, V = draw(st_.batch_shapes(min_actions=4))
    comp = draw(st_.legal_masks((B, V), min_legal=0))
    eos = draw(st.integers(0, V - 1))
    fallback = draw(st_.legal_masks((1, V), min_legal=1))[0]
    return comp, eos, fallback


@pytest.mark.clause("SAC-LEGAL-1", "SAC-LEGAL-2")
@given(compliance_rows())
def test_legal_set_adds_eos_and_falls_back_when_too_strict(sac, case):
    comp, eos, fallback = case
    got = sac.legal_set(comp, eos_index=eos, fallback=fallback)
    for b in range(comp.shape[0]):
        row = comp[b].clone()
        row[eos] = True
        if int(row.sum()) < 3:
            row = fallback.clone()
            row[eos] = True
            clause = "SAC-LEGAL-2"
        else:
            clause = "SAC-LEGAL-1"
        assert_equal(got[b], row, clause, f"row {b}")


@pytest.mark.clause("SAC-LEGAL-2")
def test_legal_set_golden(sac):
    comp = torch.tensor([[True, False, False, False, False], [True, True, False, True, False]])
    fallback = torch.tensor([False, True, True, False, False])
    got = sac.legal_set(comp, eos_index=4, fallback=fallback)
    # row 0: {0, eos} has 2 < 3 legal -> whitelist {1, 2} + eos; row 1: {0, 1, 3, eos} kept
    assert_equal(got, [[False, True, True, False, True], [True, True, False, True, True]], "SAC-LEGAL-2")


# ----------------------------------------------------------------------------- entropy
@pytest.mark.clause("SAC-ENT-1")
@given(st_.batch_shapes(), st.data(), st.floats(0.7, 1.2))
def test_target_entropy_is_kappa_log_legal_count(sac, shape, data, kappa):
    mask = data.draw(st_.legal_masks(shape))
    got = sac.target_entropy(mask, kappa=kappa)
    assert_close(got, kappa * np.log(mask.numpy().sum(-1)), "SAC-ENT-1", dtype=torch.float64 if got.dtype == torch.float64 else got.dtype)


@pytest.mark.clause("SAC-ENT-1")
def test_target_entropy_golden(sac):
    mask = torch.tensor([[True] * 8 + [False] * 2])
    assert_close(sac.target_entropy(mask, kappa=0.9), [0.9 * math.log(8)], "SAC-ENT-1", dtype=torch.float32)


@pytest.mark.clause("SAC-ENT-2")
@given(st_.policies())
def test_entropy_sums_over_the_legal_set(sac, pm):
    p, mask = pm
    pn, mn = p.numpy(), mask.numpy()
    expected = -np.where(mn, pn * np.log(pn), 0.0).sum(-1)
    assert_close(sac.entropy(p, mask), expected, "SAC-ENT-2")


@pytest.mark.clause("SAC-ENT-2")
def test_entropy_of_uniform_legal_policy_is_log_count(sac):
    p = torch.tensor([[0.25, 0.25, 0.25, 0.25, EPS, EPS]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True, False, False]])
    assert_close(sac.entropy(p, mask), [math.log(4)], "SAC-ENT-2")
