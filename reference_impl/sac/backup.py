"""Expected soft backup, Top-p selection and the TD target (seed 000, §6)."""
from __future__ import annotations

import torch

from reference_impl import _checks


def _min_q(q1: torch.Tensor, q2: torch.Tensor) -> torch.Tensor:
    return torch.minimum(q1, q2)  # SAC-V-1: pessimistic twin-Q


def _weighted_soft(pi: torch.Tensor, q: torch.Tensor, support: torch.Tensor, alpha) -> torch.Tensor:
    """Σ_{a∈support} π(a) [q(a) − α log π(a)], with entries off the support contributing exactly 0."""
    safe_log = torch.log(torch.where(support, pi, torch.ones_like(pi)))
    return torch.where(support, pi * (q - alpha * safe_log), torch.zeros_like(pi)).sum(-1)


def soft_value(probs, q1, q2, legal_mask, *, alpha) -> torch.Tensor:
    r"""V_soft(s') = Σ_{a∈A(s')} π(a|o') [min_i Q'_i(o',a) − α log π(a|o')].

    Implements: SAC-V-1.
    """
    _checks.same_shape("SAC-V-1", probs=probs, q1=q1, q2=q2, legal_mask=legal_mask)
    return _weighted_soft(probs, _min_q(q1, q2), legal_mask, alpha)


def _select_sorted(pi: torch.Tensor, legal_mask: torch.Tensor, p: float) -> torch.Tensor:
    """Sort each row (ties by lower column), keep each legal action while the mass before it is below p."""
    sorted_pi, order = torch.sort(pi, dim=-1, descending=True, stable=True)
    mass_before = torch.cumsum(sorted_pi, dim=-1) - sorted_pi
    keep_sorted = (mass_before < p) & torch.gather(legal_mask, -1, order)
    return torch.zeros_like(legal_mask).scatter(-1, order, keep_sorted)


def _top_candidates(pi: torch.Tensor, p: float, candidates: int) -> torch.Tensor | None:
    """Column ids (ascending) of each row's ``candidates`` most probable legal actions, when the best
    ``candidates − 1`` of them already reach p in every row, so the minimal set lies among them;
    None when the shortcut does not apply. The check reads one flag back to the host."""
    if not 1 < candidates < pi.shape[-1]:
        return None
    top = pi.topk(candidates, dim=-1)
    if not bool((top.values[..., :-1].sum(-1) >= p).all()):
        return None
    return top.indices.sort(dim=-1).values  # ascending ids keep the lower-id tie-break


def _legal_probs(probs: torch.Tensor, legal_mask: torch.Tensor, p: float, clause: str) -> torch.Tensor:
    _checks.in_range(p, 0.0, 1.0, "SAC-INPUT-3", "p")
    _checks.bool_mask(legal_mask, clause)
    _checks.same_shape(clause, probs=probs, legal_mask=legal_mask)
    return torch.where(legal_mask, probs.detach(), torch.zeros_like(probs))  # select among legal only


def top_p_select(probs: torch.Tensor, legal_mask: torch.Tensor, *, p: float, candidates: int = 256) -> torch.Tensor:
    r"""The smallest legal set P with Σ_{a∈P} π(a) ≥ p, as a detached bool mask.

    Actions are taken in decreasing probability (ties by lower index); an action is kept while the
    mass before it is still below p, so the set is minimal and never empty. Sorting whole rows is the
    costliest step over a character vocabulary, so when every row's best ``candidates − 1`` actions
    reach p only the top ``candidates`` columns are sorted (the same set). ``candidates=0`` always
    sorts whole rows.

    Implements: SAC-TOPP-1 (bad input: SAC-INPUT-3).
    """
    pi = _legal_probs(probs, legal_mask, p, "SAC-TOPP-1")
    idx = _top_candidates(pi, p, candidates)
    if idx is None:
        return _select_sorted(pi, legal_mask, p)
    sub = _select_sorted(pi.gather(-1, idx), legal_mask.gather(-1, idx), p)
    return torch.zeros_like(legal_mask).scatter(-1, idx, sub)


def top_p_probs(probs: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    r"""π_p ∝ π · 1[a ∈ P], renormalised to sum to one (differentiable through π).

    Implements: SAC-TOPP-2.
    """
    _checks.same_shape("SAC-TOPP-2", probs=probs, selected=selected)
    kept = torch.where(selected, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def top_p_soft_value(probs, q1, q2, legal_mask, *, alpha, p: float, candidates: int = 256) -> torch.Tensor:
    r"""\hat V_soft(s') = Σ_{a∈P} π_p(a) [min_i Q'_i(o',a) − α log π_p(a)].

    Implements: SAC-TOPP-3.
    """
    idx = _top_candidates(_legal_probs(probs, legal_mask, p, "SAC-TOPP-3"), p, candidates)
    if idx is not None:  # the sum runs over P only, so the other columns can be dropped first
        probs, q1, q2, legal_mask = (t.gather(-1, idx) for t in (probs, q1, q2, legal_mask))
    selected = top_p_select(probs, legal_mask, p=p, candidates=0)
    return _weighted_soft(top_p_probs(probs, selected), _min_q(q1, q2), selected, alpha)


def td_target(reward, done, next_value, *, gamma: float) -> torch.Tensor:
    r"""y = r + γ (1 − done) \hat V_soft(s'): no bootstrap through a terminal step.

    Implements: SAC-TD-1 (bad input: SAC-INPUT-4).
    """
    _checks.in_range(gamma, 0.0, 1.0, "SAC-INPUT-4", "gamma", hi_open=True)
    _checks.same_shape("SAC-TD-1", reward=reward, done=done, next_value=next_value)
    not_done = 1.0 - done.to(next_value.dtype)
    return reward + gamma * not_done * next_value.detach()
