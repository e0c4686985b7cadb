"""SAC §1/§3: stable masked softmax, legal set with eos and fallback, entropy target, entropy."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_close,
    assert_equal,
    assert_low_precision,
    assert_rejects,
    assert_that,
    convention,
    host,
    require_dtype,
    to_numpy,
)
from conformance_tests.test_sac_losses import spec_default

EPS = 1e-8


def np_legal_softmax(z: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Softmax over the legal set in float64 (0 on illegal entries), from the logits as given."""
    zs = np.where(mask, z - np.where(mask, z, -np.inf).max(-1, keepdims=True), -np.inf)
    return np.exp(zs) / np.exp(zs).sum(-1, keepdims=True)


def assert_masked_probs(got, z, mask, clause: str, *, eps: float = EPS, dtype=None) -> None:
    """The masked softmax under the mask_fill convention. Normative whatever is declared: the legal entries
    are the softmax over the legal set and nothing is NaN. The seed's eps_clip lifts every entry to at least
    eps (illegal ones exactly eps); "finite" leaves illegal entries in [0, eps] and "neg_inf" at exactly 0,
    legal entries unclipped."""
    p, m = np_legal_softmax(z.double().numpy(), to_numpy(mask)), to_numpy(mask)
    got = host(got)
    assert_that(~torch.isnan(got), clause, got, "no NaN")
    fill = convention("mask_fill")
    low = dtype is not None and dtype != torch.float64
    check = (lambda g, e, what: assert_low_precision(g, e, clause, dtype, what)) if low else (
        lambda g, e, what: assert_close(g, e, clause, what=what))
    if fill == "eps_clip":
        check(got, np.maximum(p, eps), "probabilities")
        return
    g = got.double()
    check(torch.where(mask, g, torch.zeros_like(g)), np.where(m, p, 0.0), "legal probabilities")
    illegal = g[~mask]
    if fill == "neg_inf":
        assert_equal(illegal, torch.zeros_like(illegal), clause, "illegal entries exactly 0 (neg_inf fill)")
    else:
        assert_that((illegal >= 0) & (illegal <= eps), clause, illegal, f"illegal entries in [0, {eps}] (finite fill)")


@pytest.mark.clause("SAC-MASK-1")
@given(st_.logits_and_masks())
def test_masked_softmax_matches_softmax_over_legal_set(sac, zm):
    z, mask = zm
    assert_masked_probs(sac.masked_softmax(z, mask), z, mask, "SAC-MASK-1")


@pytest.mark.clause("SAC-MASK-1")
@pytest.mark.parametrize("actions", [1500, 6000])
def test_masked_softmax_of_a_large_vocabulary_in_float64(sac, actions):
    # the strategies draw at most a dozen actions: a vocabulary in the thousands (the V2 size is 6000), where
    # a fast path might switch algorithm or precision, is held to the float64 tolerance here
    g = torch.Generator().manual_seed(actions)
    z = 4.0 * torch.randn(3, actions, generator=g, dtype=torch.float64)
    mask = torch.rand(3, actions, generator=g) < 0.3
    mask[:, 0] = True
    assert_masked_probs(sac.masked_softmax(z, mask), z, mask, "SAC-MASK-1")


@pytest.mark.clause("SAC-MASK-1")
@given(st_.logits_and_masks(), st.floats(-1e3, 1e3))
def test_masked_softmax_is_shift_invariant(sac, zm, c):
    z, mask = zm
    zc = z + c  # in float32 the shift itself rounds z by up to 6e-5: compare with the softmax of what was passed
    assert_close(sac.masked_softmax(zc, mask), to_numpy(sac.masked_softmax(zc - c, mask)), "SAC-MASK-1")


@pytest.mark.clause("SAC-MASK-1")
def test_masked_softmax_golden(sac):
    # logits [1, 2, 3] with the middle action illegal: softmax over {1, 3} = [1/(1+e^2), e^2/(1+e^2)]
    z = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    mask = torch.tensor([[True, False, True]])
    e2 = math.exp(2.0)
    got = sac.masked_softmax(z, mask)
    assert_close(got[:, [0, 2]], [[1 / (1 + e2), e2 / (1 + e2)]], "SAC-MASK-1")
    illegal = {"eps_clip": EPS, "neg_inf": 0.0}.get(convention("mask_fill"))
    if illegal is None:  # a finite fill: anywhere in [0, eps]
        assert_that((got[0, 1] >= 0) & (got[0, 1] <= EPS), "SAC-MASK-1", got[0, 1], f"in [0, {EPS}]")
    else:
        assert_close(got[:, 1], [illegal], "SAC-MASK-1", what="the illegal entry")


@pytest.mark.clause("SAC-MASK-2")
@given(st_.logits_and_masks(scale=1e3), st_.keyword_arguments("sac.masked_softmax"))
def test_every_probability_is_clipped_at_eps(sac, zm, kw):
    z, mask = zm
    eps = kw["eps"]
    got = host(sac.masked_softmax(z, mask, **kw))
    assert_that(~torch.isnan(got), "SAC-MASK-2", got, "no NaN")
    if convention("mask_fill") != "eps_clip":  # no clip declared: a distribution over the legal set, no NaN
        legal_mass = torch.where(mask, got, torch.zeros_like(got)).sum(-1)
        assert_close(legal_mass, np.ones(len(legal_mass)), "SAC-MASK-2", what="legal mass", approx="reduction")
        return
    illegal, held = got[~mask], float(torch.tensor(eps, dtype=got.dtype))  # eps as the dtype holds it
    if held > 0:
        assert_that(got >= eps, "SAC-MASK-2", got, f"every entry >= {eps}")
        assert_equal(illegal, torch.full_like(illegal, eps), "SAC-MASK-2", "illegal entries hold exactly eps")
    else:  # float16 rounds 1e-8 to 0: the clip is raised (errata), to at most the dtype's smallest normal
        tiny = torch.finfo(got.dtype).tiny
        assert_that((got > 0).all() and (illegal <= tiny).all(), "SAC-MASK-2", got,
                    f"every entry > 0 and illegal ones at most {tiny:g}, as {eps} rounds to 0 in {got.dtype}")
    assert_that(torch.isfinite(torch.log(got.float())), "SAC-MASK-2", got, "finite log everywhere")


@pytest.mark.clause("SAC-MASK-3")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@given(zm=st_.logits_and_masks(scale=1e4))
def test_masked_softmax_stays_finite_in_low_precision(sac, dtype, zm):
    z, mask = zm
    got = host(sac.masked_softmax(z.to(dtype), mask))
    assert_that(torch.isfinite(got) & (got >= 0), "SAC-MASK-3", got, "finite, non-negative probabilities")
    if convention("mask_fill") == "eps_clip":  # the clip is what keeps every log finite
        assert_that(torch.isfinite(torch.log(got.float())), "SAC-MASK-3", got, "finite log")
    legal_mass = torch.where(mask, got.double(), torch.zeros_like(got.double())).sum(-1)
    assert_close(legal_mass, np.ones(len(legal_mass)), "SAC-MASK-3", dtype=dtype, what="legal mass")
    # the values, not only their finiteness: the float64 answer for the same rounded logits
    assert_masked_probs(got, z.to(dtype), mask, "SAC-MASK-3", dtype=dtype)


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


# The max shift is subtracted (z - max z): softmax is shift-invariant, so only rounding tells a wrong sign
# apart. float32 holds 1e7 and 1e7 + 1 exactly but not 2e7 + 1 (spacing 2 above 2^24).
@pytest.mark.clause("SAC-MASK-1")
def test_masked_softmax_shift_keeps_large_logits_apart(sac):

    require_dtype(torch.float32)
    logits = torch.tensor([[1e7, 1e7 + 1.0, 5.0]], dtype=torch.float32)
    legal = torch.tensor([[True, True, False]])
    p1 = 1.0 / (1.0 + np.exp(-1.0))  # softmax of the legal pair, whose logits differ by exactly 1
    want = np.array([[1.0 - p1, p1, spec_default("SAC-DEFAULT-9", "prob_eps")]])
    assert_close(sac.masked_softmax(logits, legal), want, "SAC-MASK-1", dtype=torch.float32,
                 what="masked_softmax of legal logits 1e7 and 1e7 + 1 in float32")


# The shift is the max over the LEGAL logits: an illegal logit far above the legal ones must not move it, or the
# legal logits underflow (exp(−3000) = 0 in every dtype) and the legal probabilities are lost. 3000 and 1e4 fit in
# float16 and bfloat16 (SAC-MASK-3: logits as large as 1e4).
@pytest.mark.clause("SAC-MASK-1", "SAC-MASK-3")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_masked_softmax_ignores_a_huge_illegal_logit(sac, dtype):
    require_dtype(dtype)
    z = torch.tensor([[0.0, 1.0, 3000.0, -1.0], [2.0, 1e4, 0.5, 0.25]], dtype=dtype)
    mask = torch.tensor([[True, True, False, True], [True, False, True, True]])
    clause = "SAC-MASK-1" if dtype in (torch.float64, torch.float32) else "SAC-MASK-3"
    assert_masked_probs(sac.masked_softmax(z, mask), z, mask, clause, dtype=dtype)


# ----------------------------------------------------------------------------- legal set
@st.composite
def compliance_rows(draw):
    B, V = draw(st_.batch_shapes(min_actions=4))
    comp = draw(st_.legal_masks((B, V), min_legal=0))
    eos = draw(st.integers(0, V - 1))
    fallback = draw(st_.legal_masks((1, V), min_legal=1))[0]
    return comp, eos, fallback


@pytest.mark.clause("SAC-LEGAL-1", "SAC-LEGAL-2")
@given(compliance_rows(), st.integers(1, 6))
def test_legal_set_adds_eos_and_falls_back_when_too_strict(sac, case, min_legal):
    """The threshold is the caller's min_legal (drawn; the document's 3, the default, has the golden test)."""
    comp, eos, fallback = case
    got = sac.legal_set(comp, eos_index=eos, fallback=fallback, min_legal=min_legal)
    for b in range(comp.shape[0]):
        row = comp[b].clone()
        row[eos] = True
        if int(row.sum()) < min_legal:
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


# Counts past 255: the real vocabulary has ~6,000 characters, so a count kept in 8 bits wraps (256 legal -> 0, 258 ->
# 2) and a row with hundreds of legal actions would be replaced by the fallback.
@pytest.mark.clause("SAC-LEGAL-2")
def test_legal_set_counts_past_255_legal_actions(sac):
    V, eos = 600, 599
    comp = torch.zeros(4, V, dtype=torch.bool)
    comp[0, :255] = True  # 255 + eos = 256
    comp[1, :257] = True  # 257 + eos = 258
    comp[2, 100:400] = True
    comp[3, 7] = True  # 2 < 3: the only row that falls back
    fallback = torch.zeros(V, dtype=torch.bool)
    fallback[500:510] = True
    want = comp.clone()
    want[:, eos] = True
    want[3] = fallback
    want[3, eos] = True
    assert_equal(sac.legal_set(comp, eos_index=eos, fallback=fallback), want, "SAC-LEGAL-2",
                 "rows of 256, 258 and 301 legal actions kept; only the row of 2 falls back")


# The <eos> index must lie in [0, V) (SAC-INPUT-2): index V is rejected as bad input, not left to fail on
# indexing with an error that names no clause, and -1 is not read as "the last id".
@pytest.mark.clause("SAC-INPUT-2")
@pytest.mark.parametrize("eos_index", [-1, 5, 6])
def test_legal_set_rejects_an_eos_index_outside_the_vocabulary(sac, eos_index):

    comp = torch.tensor([[True, False, True, True, False], [False, False, False, False, True]])
    assert_rejects(("SAC-INPUT-2", "SAC-LEGAL-1"), sac.raw("legal_set"), comp, eos_index=eos_index, fallback=torch.ones(5, dtype=torch.bool))


# ----------------------------------------------------------------------------- entropy
@pytest.mark.clause("SAC-ENT-1")
@given(st_.batch_shapes(), st.data(), st.floats(0.7, 1.2))
def test_target_entropy_is_kappa_log_legal_count(sac, shape, data, kappa):
    mask = data.draw(st_.legal_masks(shape))
    got = _per_state(sac.target_entropy(mask, kappa=kappa), mask)
    assert_close(got, kappa * np.log(_target_count(mask)), "SAC-ENT-1",
                 dtype=torch.float64 if got.dtype == torch.float64 else got.dtype)


@pytest.mark.clause("SAC-ENT-1")
def test_target_entropy_golden(sac):
    mask = torch.tensor([[True] * 8 + [False] * 2])
    want = 0.9 * math.log(8 if convention("target_entropy") == "per_state_legal" else 10)
    assert_close(_per_state(sac.target_entropy(mask, kappa=0.9), mask), [want], "SAC-ENT-1", dtype=torch.float32)


@pytest.mark.clause("SAC-ENT-1")
@pytest.mark.parametrize("legal", [255, 256, 300, 6000])
def test_target_entropy_counts_past_255_legal_actions(sac, legal):
    # a count kept in 8 bits wraps at 256 (log 0 = −inf, log 44 for 300)
    mask = torch.zeros(2, 6100, dtype=torch.bool)
    mask[0, :legal] = True
    mask[1, 3:6] = True
    got = _per_state(sac.target_entropy(mask, kappa=0.9), mask)
    assert_close(got, 0.9 * np.log(_target_count(mask)), "SAC-ENT-1",
                 dtype=torch.float64 if got.dtype == torch.float64 else got.dtype, what=f"{legal} legal actions")


def _target_count(mask: torch.Tensor) -> np.ndarray:
    """|A(s)| per state (the seed), or the whole action space for every state (target_entropy "scalar")."""
    m = to_numpy(mask)
    return m.sum(-1) if convention("target_entropy") == "per_state_legal" else np.full(len(m), m.shape[-1])


def _per_state(target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A declared scalar target is one number for every state: broadcast it to the rows."""
    if convention("target_entropy") == "scalar" and target.numel() == 1:
        return target.reshape(()).expand(mask.shape[0])
    return target


@pytest.mark.clause("SAC-ENT-2")
@given(st_.policies())
def test_entropy_sums_over_the_legal_set(sac, pm):
    p, mask = pm
    pn, mn = to_numpy(p), to_numpy(mask)
    expected = -np.where(mn, pn * np.log(pn), 0.0).sum(-1)
    assert_close(sac.entropy(p, mask), expected, "SAC-ENT-2")


@pytest.mark.clause("SAC-ENT-2")
def test_entropy_of_uniform_legal_policy_is_log_count(sac):
    p = torch.tensor([[0.25, 0.25, 0.25, 0.25, EPS, EPS]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True, False, False]])
    assert_close(sac.entropy(p, mask), [math.log(4)], "SAC-ENT-2")


# Called without kappa: the spec's default.
@pytest.mark.clause("SAC-DEFAULT-3", "SAC-ENT-1")
def test_target_entropy_default_kappa(sac):
    legal = torch.tensor([[True, True, False, True], [True, False, False, False], [True, True, True, True]])
    counts = [3.0, 1.0, 4.0] if convention("target_entropy") == "per_state_legal" else [4.0] * 3  # "scalar": κ log|A|
    want = spec_default("SAC-DEFAULT-3", "kappa") * np.log(counts)
    # a bool mask carries no float dtype: the result may come in float32, so float32's tolerance applies
    assert_close(sac.target_entropy(legal), want, "SAC-ENT-1", dtype=torch.float32, what="target_entropy without kappa")
