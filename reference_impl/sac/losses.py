"""Critic, policy, temperature, CQL and BC losses (seed 000, §6 and §7)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from reference_impl import _checks
from reference_impl._dtypes import promoted
from reference_impl.sac.backup import (
    _min_q,
    _weighted_soft,
    top_p_probs,
    top_p_select,
)

ALPHA_MIN, ALPHA_MAX = 1e-4, 2.0  # SAC-TEMP-3


def critic_loss(q1_taken, q2_taken, target, *, delta: float = 1.0) -> torch.Tensor:
    r""":math:`L_Q = E_B \sum_{i=1,2} \mathrm{Huber}_\delta(Q_i(o,a) - y)`, with y a constant (no gradient into
    the target).

    Implements: SAC-CRITIC-1.
    """
    _checks.same_shape("SAC-CRITIC-1", q1_taken=q1_taken, q2_taken=q2_taken, target=target)
    q1_taken, q2_taken, y = promoted(q1_taken, q2_taken, target.detach())  # huber_loss's backward needs one dtype
    per_sample = F.huber_loss(q1_taken, y, reduction="none", delta=delta) + F.huber_loss(
        q2_taken, y, reduction="none", delta=delta
    )
    return per_sample.mean()


def policy_loss(probs, q1, q2, legal_mask, *, alpha) -> torch.Tensor:
    r"""Option A: :math:`L_\pi = E_o \sum_{a \in A(s)} \pi(a|o)\,[\alpha \log \pi(a|o) - \min_i Q_i(o,a)]`.

    Q is a constant here; only π carries gradient.

    Implements: SAC-POL-1.
    """
    _checks.same_shape("SAC-POL-1", probs=probs, q1=q1, q2=q2, legal_mask=legal_mask)
    # _weighted_soft computes Σ π (q − α log π) = −Σ π (α log π − q)
    return -_weighted_soft(probs, _min_q(q1, q2).detach(), legal_mask, alpha).mean()


def policy_loss_top_p(probs, q1, q2, legal_mask, *, alpha, p: float) -> torch.Tensor:
    r"""Option B: the same sum over the detached Top-p set P with the renormalised π_p.

    Implements: SAC-POL-2.
    """
    selected = top_p_select(probs, legal_mask, p=p)  # detached selection
    return -_weighted_soft(top_p_probs(probs, selected), _min_q(q1, q2).detach(), selected, alpha).mean()


def clamp_log_alpha(log_alpha, *, alpha_min: float = ALPHA_MIN, alpha_max: float = ALPHA_MAX):
    r"""log α clamped so that α ∈ [alpha_min, alpha_max] (after an SGD or an optimiser step).

    Implements: SAC-TEMP-3.
    """
    return log_alpha.clamp(math.log(alpha_min), math.log(alpha_max))


def temperature_update(log_alpha, entropy, target_entropy, *, lr: float,
                       alpha_min: float = ALPHA_MIN, alpha_max: float = ALPHA_MAX) -> torch.Tensor:
    r""":math:`\tilde\alpha \leftarrow \tilde\alpha + \eta_\alpha \cdot E_o[H_{tgt}(s) - H(\pi(\cdot|o))]`, then α
    clamped to [1e-4, 2].

    An entropy deficit (H < H_tgt) raises α.

    Implements: SAC-TEMP-1, SAC-TEMP-3.
    """
    _checks.same_shape("SAC-TEMP-1", entropy=entropy, target_entropy=target_entropy)
    step = lr * (target_entropy.detach() - entropy.detach()).mean()  # SAC-TEMP-1
    return clamp_log_alpha(log_alpha.detach() + step, alpha_min=alpha_min, alpha_max=alpha_max)  # SAC-TEMP-3


def temperature_loss(log_alpha, entropy, target_entropy) -> torch.Tensor:
    r"""Loss for an optimiser on log α: J = log α · E[H − H_tgt], so ∂J/∂log α = E[H − H_tgt]
    and a descent step moves log α by −η E[H − H_tgt] = +η E[H_tgt − H].

    Implements: SAC-TEMP-2.
    """
    _checks.same_shape("SAC-TEMP-2", entropy=entropy, target_entropy=target_entropy)
    return log_alpha * (entropy.detach() - target_entropy.detach()).mean()


def cql_penalty(q_all, actions, *, lam: float = 0.5, legal_mask=None) -> torch.Tensor:
    r""":math:`L_{CQL} = \lambda\,(E_o[\log \sum_{a \in A(s)} \exp Q(o,a)] - E_{(o,a)\sim B}[Q(o,a)])` for one
    critic.

    The log-sum-exp runs over the legal set (errata of SAC-CQL-1); ``legal_mask=None`` means every
    action is legal.

    Implements: SAC-CQL-1.
    """
    _checks.index_in_range(actions, q_all.shape[-1], "SAC-CQL-1", "actions")
    taken = q_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    if legal_mask is not None:
        _checks.bool_mask(legal_mask, "SAC-INPUT-2")
        _checks.same_shape("SAC-INPUT-2", q_all=q_all, legal_mask=legal_mask)
        _checks.rows_nonempty(legal_mask, "SAC-INPUT-2")
        q_all = q_all.masked_fill(~legal_mask, float("-inf"))  # illegal actions leave the sum
    return lam * (torch.logsumexp(q_all, dim=-1).mean() - taken.mean())


def bc_loss(log_probs, actions, is_demo, *, lam: float = 0.1) -> torch.Tensor:
    r""":math:`L_{BC} = \lambda_{BC} \cdot E_{(o,a^*) \in B_{demo}}[-\log \pi(a^*|o)]`; agent samples never
    contribute.

    Implements: SAC-BC-1.
    """
    _checks.bool_mask(is_demo, "SAC-BC-1", "is_demo")
    _checks.index_in_range(actions, log_probs.shape[-1], "SAC-BC-1", "actions")
    nll = -log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    demo = is_demo.to(nll.dtype)
    # an all-agent batch gives exactly 0 (still attached to the graph)
    return lam * (nll * demo).sum() / demo.sum().clamp_min(1.0)


# ----------------------------------------------------------------------------- totals (appended)
def critic_loss_total(q1_all, q2_all, actions, target, *, legal_mask=None, delta: float = 1.0,
                      lam_cql: float = 0.5, use_cql: bool = True) -> torch.Tensor:
    r""":math:`L_Q^{tot} = L_Q + \sum_{i=1,2} L_{CQL}(\phi_i)`: the Huber loss of both critics at the taken
    actions plus, when ``use_cql``, one CQL term per critic (log-sum-exp over the legal set).

    Implements: SAC-CRITIC-2.
    """
    _checks.same_shape("SAC-CRITIC-2", q1_all=q1_all, q2_all=q2_all)
    idx = actions.long().unsqueeze(-1)
    _checks.index_in_range(actions, q1_all.shape[-1], "SAC-CRITIC-2", "actions")
    loss = critic_loss(q1_all.gather(-1, idx).squeeze(-1), q2_all.gather(-1, idx).squeeze(-1), target,
                       delta=delta)  # SAC-CRITIC-1
    if not use_cql:
        return loss
    return loss + sum(cql_penalty(q, actions, lam=lam_cql, legal_mask=legal_mask)
                      for q in (q1_all, q2_all))  # SAC-CQL-1, one term per critic


def policy_loss_total(probs, q1, q2, legal_mask, actions, is_demo, *, alpha, lam_bc: float = 0.1,
                      p: float | None = None) -> torch.Tensor:
    r"""L_π^tot = L_π + L_BC: option A (``p=None``) or option B (Top-p mass ``p``) plus behaviour
    cloning on the demo rows, scored with log π of the full masked policy (not π_p).

    Implements: SAC-POL-3.
    """
    if p is None:
        loss_pi = policy_loss(probs, q1, q2, legal_mask, alpha=alpha)  # SAC-POL-1
    else:
        loss_pi = policy_loss_top_p(probs, q1, q2, legal_mask, alpha=alpha, p=p)  # SAC-POL-2
    return loss_pi + bc_loss(torch.log(probs), actions, is_demo, lam=lam_bc)  # SAC-BC-1


