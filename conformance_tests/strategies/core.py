"""Shared strategies: shapes, logits, legal masks, probability rows, scalars in a range.

Every strategy honours what the implementation declares (``impl.capabilities``, read at draw time):
floating tensors come in a declared dtype (:func:`declared_dtype`) and, with ``masks: False``, every
mask is all-legal (:func:`legal_masks`), so no illegal action is ever drawn for it.
"""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conformance_tests import harness

__all__ = [
    "batch_shapes", "logits", "legal_masks", "logits_and_masks", "policies", "q_values",
    "unit_interval", "open_unit_interval", "tensors", "keyword_arguments", "KEYWORD_RANGES",
    "declared_dtype", "float_dtypes", "well_conditioned",
]

_FINITE = dict(allow_nan=False, allow_infinity=False)


def batch_shapes(max_batch: int = 6, min_actions: int = 2, max_actions: int = 12):
    """(B, A) pairs."""
    return st.tuples(st.integers(1, max_batch), st.integers(min_actions, max_actions))


def declared_dtype(dtype: torch.dtype) -> torch.dtype:
    """``dtype`` if the implementation declares it (or it is not floating), else its widest declared dtype.

    Called at draw time: the tolerance of an assertion then follows the dtype actually handed in."""
    return harness.working_dtype(dtype) if dtype.is_floating_point else dtype


@st.composite
def float_dtypes(draw, *candidates: torch.dtype):
    """One of ``candidates`` (default float64, float32) the implementation declares; its widest declared
    dtype when it declares none of them."""
    cands = candidates or (torch.float64, torch.float32)
    return draw(st.sampled_from([d for d in cands if harness.supports_dtype(d)] or [harness.working_dtype(cands[0])]))


def well_conditioned(x: torch.Tensor, *, spread: float = 0.05) -> torch.Tensor:
    """``x`` unchanged, but in a low-precision dtype only when its spread is at least ``spread`` of its
    magnitude (else Hypothesis drops the example): standardising a near-constant float32 vector amplifies
    its rounding past any tolerance, which says nothing about the convention under test."""
    if x.dtype != torch.float64:
        a = x.double()
        assume(float(a.max() - a.min()) >= spread * max(1.0, float(a.abs().max())))
    return x


def tensors(shape, *, lo: float = -10.0, hi: float = 10.0, dtype=torch.float64):
    """A float tensor of ``shape`` with entries in [lo, hi] (in ``dtype`` when declared, see :func:`declared_dtype`)."""
    return hnp.arrays(np.float64, shape, elements=st.floats(lo, hi, **_FINITE)).map(
        lambda a: torch.tensor(a, dtype=declared_dtype(dtype))
    )


def logits(shape, *, scale: float = 10.0, dtype=torch.float64):
    return tensors(shape, lo=-scale, hi=scale, dtype=dtype)


@st.composite
def legal_masks(draw, shape, *, min_legal: int = 1):
    """A bool mask with at least ``min_legal`` True entries per row; all True when the implementation
    declares ``masks: False``."""
    B, A = shape
    if not harness.masks_supported():
        return torch.ones((B, A), dtype=torch.bool)
    min_legal = min(min_legal, A)
    rows = []
    for _ in range(B):
        row = draw(hnp.arrays(np.bool_, (A,)))
        k = int(row.sum())
        if k < min_legal:
            idx = draw(st.permutations(range(A)))[: min_legal]
            row[list(idx)] = True
        rows.append(row)
    return torch.tensor(np.stack(rows))


@st.composite
def logits_and_masks(draw, *, scale: float = 10.0, dtype=torch.float64, min_legal: int = 1, **shape_kw):
    shape = draw(batch_shapes(**shape_kw))
    return draw(logits(shape, scale=scale, dtype=dtype)), draw(legal_masks(shape, min_legal=min_legal))


@st.composite
def policies(draw, *, dtype=torch.float64, min_legal: int = 1, eps: float = 1e-8, **shape_kw):
    """(probs, legal_mask) with probs a masked, ε-clipped softmax computed here in numpy (never by the
    implementation): legal entries sum to one over the legal set, illegal entries hold ε."""
    z, mask = draw(logits_and_masks(dtype=torch.float64, min_legal=min_legal, **shape_kw))
    zn, mn = harness.to_numpy(z), harness.to_numpy(mask)
    zs = np.where(mn, zn - zn.max(-1, keepdims=True), -np.inf)
    e = np.exp(zs - zs.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    dt = declared_dtype(dtype)
    p = np.maximum(p, harness.prob_floor(eps, dt))  # float16 rounds 1e-8 to 0: SAC-MASK-2's errata
    return torch.tensor(p, dtype=dt), mask


def q_values(shape, *, scale: float = 10.0, dtype=torch.float64):
    return tensors(shape, lo=-scale, hi=scale, dtype=dtype)


def unit_interval(*, lo: float = 1e-3, hi: float = 1.0):
    return st.floats(lo, hi, **_FINITE)


def open_unit_interval(*, lo: float = 1e-3, hi: float = 0.999):
    return st.floats(lo, hi, **_FINITE)


# ----------------------------------------------------------------------------- keyword hyper-parameters
def _f(lo: float, hi: float, *edges: float):
    """A float in [lo, hi], with the named edges (and the ends) drawn on purpose."""
    return st.one_of(st.sampled_from(sorted({lo, hi, *edges})), st.floats(lo, hi, **_FINITE))


_CLIP_EPS = _f(0.01, 0.95, 0.1, 0.2, 0.3)
_TAU = _f(0.1, 4.0, 1.0)
_GAMMA = _f(0.0, 1.0, 0.5)
_LOG_RATIO_CLAMP = _f(0.5, 30.0, 2.0, 20.0)
_MASK_EPS = _f(0.0, 1e-2, 1e-8, 1e-4)

# Every keyword hyper-parameter of every contract operation that takes one, with its valid range (the
# contract's docstrings and the INPUT clauses). A test draws them all, so no formula is checked at
# its defaults only and an implementation that ignores a keyword is caught.
KEYWORD_RANGES: dict[str, dict] = {
    # ppo
    "ppo.clip_fraction": {"clip_eps": _CLIP_EPS},
    "ppo.clipped_policy_loss": {"clip_eps": _CLIP_EPS},
    "ppo.total_loss": {"vf_coef": _f(0.0, 2.0, 0.5), "ent_coef": _f(0.0, 0.2, 0.01)},
    "ppo.normalize_advantages": {"eps": _f(0.0, 1.0, 1e-8), "clamp": st.one_of(st.none(), _f(0.1, 10.0, 5.0))},
    "ppo.kl_early_stop": {"target_kl": _f(1e-3, 0.2, 0.015), "factor": _f(0.5, 4.0, 1.0, 2.0)},
    "ppo.scale_reward": {"scale": _f(0.01, 100.0, 1.0)},
    "ppo.log_ratio_excess": {"threshold": _f(0.0, 5.0, 2.0)},
    # isreshape
    "isreshape.importance_ratio": {"log_ratio_clamp": _LOG_RATIO_CLAMP},
    "isreshape.reward_gamma": {"beta": _f(0.0, 4.0, 1.0), "gamma_min": _GAMMA, "gamma_max": _GAMMA},
    "isreshape.sapo_weight": {"tau": _TAU},
    "isreshape.sapo_gate": {"tau": _TAU},
    "isreshape.reshape_weight": {"tau": _TAU},
    "isreshape.reshape_f": {"tau": _TAU},
    "isreshape.policy_loss": {"tau": _TAU, "beta": _f(0.0, 4.0, 1.0), "gamma_min": _GAMMA, "gamma_max": _GAMMA,
                              "log_ratio_clamp": _LOG_RATIO_CLAMP, "mask_eps": _MASK_EPS},
    "isreshape.sft_loss": {"tau": _TAU, "gamma_sft": _GAMMA, "log_ratio_clamp": _LOG_RATIO_CLAMP,
                           "mask_eps": _MASK_EPS},
    "isreshape.loss_metrics": {"tau": _TAU, "beta": _f(0.0, 4.0, 1.0), "gamma_min": _GAMMA, "gamma_max": _GAMMA,
                               "log_ratio_clamp": _LOG_RATIO_CLAMP},
    "isreshape.sft_metrics": {"tau": _TAU, "gamma_sft": _GAMMA, "log_ratio_clamp": _LOG_RATIO_CLAMP},
    # ccapo
    "ccapo.importance": {"alpha_smooth": _f(0.05, 5.0, 1.0)},
    "ccapo.criticality": {"eps": _f(1e-12, 1e-3, 1e-8)},
    "ccapo.distance_decay": {"distance_exponent": _f(0.0, 3.0, 0.5)},
    "ccapo.q_stdb": {"lam": _f(0.0, 5.0, 1.0)},
    "ccapo.score_steps": {"alpha_smooth": _f(0.05, 5.0, 1.0), "distance_exponent": _f(0.0, 3.0, 0.5),
                          "lam": _f(0.0, 5.0, 1.0), "eps": _f(1e-12, 1e-3, 1e-8)},
    "ccapo.macro_return": {"r_terminal": _f(0.0, 100.0, 10.0), "r_penalty": _f(-1.0, 0.0, -0.1)},
    "ccapo.macro_advantage": {"eps": _f(1e-12, 1e-3, 1e-8)},
    "ccapo.micro_advantage": {"sigma_min": _f(1e-3, 2.0, 0.1)},
    "ccapo.fuse_advantages": {"beta": _f(0.0, 2.0, 0.5)},
    "ccapo.policy_loss": {"clip_eps": _CLIP_EPS, "beta_kl": _f(0.0, 1.0, 0.04)},
    # sac
    "sac.masked_softmax": {"eps": _f(1e-12, 1e-4, 1e-8)},
    "sac.target_entropy": {"kappa": _f(0.05, 1.0, 0.9)},
    "sac.critic_loss": {"delta": _f(0.05, 10.0, 1.0)},
    "sac.cql_penalty": {"lam": _f(0.0, 2.0, 0.5)},
    "sac.bc_loss": {"lam": _f(0.0, 2.0, 0.1)},
    "sac.soft_update": {"tau": _f(0.0, 1.0, 0.005)},
    "sac.ema_update": {"m": _f(0.0, 1.0, 0.99)},
    "sac.popart_step": {"beta": _f(1e-4, 0.5, 1e-3), "eps": _f(1e-12, 1e-4, 1e-8)},
    "sac.info_nce": {"tau": _f(0.02, 2.0, 0.07)},
    "sac.td_target": {"gamma": _f(0.01, 0.999, 0.995)},
    "sac.shaped_reward": {"gamma": _f(0.01, 0.999, 0.995)},
}

# Keyword pairs with an order between them (low, high): drawn independently, then sorted.
_ORDERED = (("gamma_min", "gamma_max"),)


@st.composite
def keyword_arguments(draw, op: str, **fixed):
    """Every keyword hyper-parameter of ``op`` ("family.op") drawn from its valid range; ``fixed``
    pins some (e.g. ``alpha`` a test supplies itself). Ordered pairs come out ordered, and a declared
    convention that fixes a keyword (huber_delta, log_ratio_clamp) or a value the library hard-codes
    (``pinned``) pins it."""
    kw = {name: draw(strategy) for name, strategy in KEYWORD_RANGES[op].items() if name not in fixed}
    if op == "sac.critic_loss" and "delta" in kw:  # huber_delta: δ = 1 unless any δ is declared supported
        kw["delta"] = harness.critic_delta(kw["delta"])
    if "log_ratio_clamp" in kw:  # a declared log_ratio_clamp is the one the implementation applies
        kw["log_ratio_clamp"] = harness.log_ratio_clamp(kw["log_ratio_clamp"])
    for lo, hi in _ORDERED:
        if lo in kw and hi in kw and kw[lo] > kw[hi]:
            kw[lo], kw[hi] = kw[hi], kw[lo]
    return {**harness.pin(op, kw), **fixed}  # a hard-coded (pinned) value replaces the drawn one
