"""Legal sets and the numerically stable masked softmax (seed 000, §1 and §3)."""
from __future__ import annotations

import torch

from reference_impl import _checks

MASK_FILL = -1e9  # SAC-MASK-1: the document's finite stand-in for -inf
PROB_EPS = 1e-8  # SAC-MASK-2: ε-clip before any log


def _fill_value(dtype: torch.dtype) -> float:
    """-1e9, or the dtype's most negative finite value where -1e9 does not fit (float16)."""
    return max(MASK_FILL, torch.finfo(dtype).min)


def prob_clip(eps: float, dtype: torch.dtype) -> float:
    """SAC-MASK-2's ε as ``dtype`` holds it: ε, or the dtype's smallest positive value where ε would round to 0
    (1e-8 in float16: 6e-8), so every log stays finite and the clip raises legal probabilities as little as the
    dtype allows (the errata of SAC-MASK-2)."""
    info = torch.finfo(dtype)
    return max(eps, info.smallest_normal * info.eps)  # the smallest subnormal


def masked_softmax(logits: torch.Tensor, legal_mask: torch.Tensor, *, eps: float = PROB_EPS) -> torch.Tensor:
    r"""Stable masked policy: shift, fill illegal logits, softmax, ε-clip.

    .. math:: \hat z = z-\max z,\ \tilde z_i = \hat z_i\,[i\in\mathcal A]\ \text{else}\ -10^9,\
              \pi=\max(\mathrm{softmax}(\tilde z), \epsilon)

    Implements: SAC-MASK-1, SAC-MASK-2, SAC-MASK-3 (bad input: SAC-INPUT-1, SAC-INPUT-2).
    """
    _checks.bool_mask(legal_mask, "SAC-INPUT-2")
    _checks.same_shape("SAC-INPUT-2", logits=logits, legal_mask=legal_mask)
    _checks.finite(logits, "SAC-INPUT-1", "logits")
    _checks.rows_nonempty(legal_mask, "SAC-INPUT-2")
    # SAC-MASK-1 shift by the max over the *legal* logits: equal in exact arithmetic, but a large
    # illegal logit would otherwise round the legal ones together in low precision (SAC-MASK-3)
    row_max = logits.masked_fill(~legal_mask, torch.finfo(logits.dtype).min).max(dim=-1, keepdim=True).values
    shifted = logits - row_max
    masked = shifted.masked_fill(~legal_mask, _fill_value(logits.dtype))  # SAC-MASK-1 fill
    return torch.softmax(masked, dim=-1).clamp_min(prob_clip(eps, logits.dtype))  # SAC-MASK-2


def legal_set(
    compliance: torch.Tensor, *, eos_index: int, fallback: torch.Tensor, min_legal: int = 3
) -> torch.Tensor:
    r"""A(s) = {a : Compliance(h, a) = 1} ∪ {<eos>}; rows with |A(s)| < 3 use the whitelist ∪ {<eos>}.

    ``compliance`` is [..., V] bool; ``fallback`` is the layered whitelist, [V] or [..., V] bool.

    Implements: SAC-LEGAL-1, SAC-LEGAL-2.
    """
    _checks.bool_mask(compliance, "SAC-LEGAL-1", "compliance")
    _checks.bool_mask(fallback, "SAC-LEGAL-2", "fallback")
    V = compliance.shape[-1]
    if not 0 <= eos_index < V:
        raise IndexError(f"[SAC-LEGAL-1] eos_index={eos_index} outside [0, {V})")
    eos = torch.zeros(V, dtype=torch.bool, device=compliance.device)
    eos[eos_index] = True
    legal = compliance | eos  # SAC-LEGAL-1
    too_strict = legal.view(torch.uint8).sum(-1, keepdim=True, dtype=torch.int32) < min_legal  # SAC-LEGAL-2 (bytes: 6x faster)
    return torch.where(too_strict, fallback.expand_as(legal) | eos, legal)


def target_entropy(legal_mask: torch.Tensor, *, kappa: float = 0.9, dtype: torch.dtype | None = None) -> torch.Tensor:
    r"""H_tgt(s) = κ · log|A(s)| in nats, per row, in ``dtype`` (default: torch's default dtype): an update
    compares it with the entropy of its policy, so it asks for that dtype (a float32 target would cost a
    float64 run 5e-8 nats per step).

    Implements: SAC-ENT-1.
    """
    _checks.bool_mask(legal_mask, "SAC-ENT-1")
    count = legal_mask.sum(-1).to(dtype or (legal_mask.dtype if legal_mask.is_floating_point() else
                                            torch.get_default_dtype()))
    return kappa * torch.log(count)


def entropy(probs: torch.Tensor, legal_mask: torch.Tensor) -> torch.Tensor:
    r""":math:`H(\pi) = -\sum_{a \in A(s)} \pi \log \pi` over the legal set (illegal entries carry only the ε-clip).

    Implements: SAC-ENT-2.
    """
    _checks.same_shape("SAC-ENT-2", probs=probs, legal_mask=legal_mask)
    terms = torch.where(legal_mask, probs * torch.log(probs), torch.zeros_like(probs))
    return -terms.sum(-1)

