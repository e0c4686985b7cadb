"""SAC at the level libraries are built: logits entry points and one call for the three losses.

Nothing here is a new formula: each function composes the checked ops of ``masking``, ``backup`` and
``losses`` (the clauses they implement are cited where they are called), so a library whose loss
module takes logits and networks can be compared with the seed through one call.
"""
from __future__ import annotations

import torch

from reference_impl import _checks
from reference_impl.sac.backup import soft_value, td_target, top_p_soft_value
from reference_impl.sac.losses import critic_loss, policy_loss, temperature_loss
from reference_impl.sac.masking import entropy, masked_softmax, target_entropy

LOSSES_BATCH_KEYS = ("obs", "next_obs", "action", "reward", "done", "legal_mask", "next_legal_mask")


def entropy_from_logits(logits: torch.Tensor, legal_mask: torch.Tensor) -> torch.Tensor:
    r""":math:`H = -\sum_{a \in A(s)} \pi \log \pi` with π the stable masked policy of ``logits``.

    Implements: SAC-ENT-3 (through SAC-MASK-1/2 and SAC-ENT-2).
    """
    return entropy(masked_softmax(logits, legal_mask), legal_mask)  # SAC-MASK-1/2, SAC-ENT-2


def soft_value_from_logits(logits, q1, q2, legal_mask, *, alpha) -> torch.Tensor:
    r""":math:`V_{soft} = \sum_{a \in A(s)} \pi\,(\min(q_1, q_2) - \alpha \log \pi)` with π the stable masked
    policy of ``logits``.

    Implements: SAC-V-2 (through SAC-MASK-1/2 and SAC-V-1).
    """
    return soft_value(masked_softmax(logits, legal_mask), q1, q2, legal_mask, alpha=alpha)  # SAC-V-1


def policy_loss_from_logits(logits, q1, q2, legal_mask, *, alpha) -> torch.Tensor:
    r""":math:`L_\pi = E_o \sum_{a \in A(s)} \pi\,(\alpha \log \pi - \min(q_1, q_2))`, gradient only into
    ``logits``.

    Implements: SAC-POL-4 (through SAC-MASK-1/2 and SAC-POL-1).
    """
    return policy_loss(masked_softmax(logits, legal_mask), q1, q2, legal_mask, alpha=alpha)  # SAC-POL-1


def _taken(q_all: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    return q_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)


def _target(policy, target_critic, batch: dict, alpha, gamma: float, top_p: float) -> torch.Tensor:
    """y = r + γ(1 − done)·V_soft(o'), under no_grad: the full legal-set expectation (p = 1) or the
    Top-p backup. ``done`` is a termination; a truncated row still bootstraps."""
    with torch.no_grad():
        legal = batch["next_legal_mask"]
        pi_next = masked_softmax(policy(batch["next_obs"]), legal)  # SAC-MASK-1/2
        q1, q2 = target_critic(batch["next_obs"])
        if top_p >= 1.0:
            v_next = soft_value(pi_next, q1, q2, legal, alpha=alpha)  # SAC-V-1
        else:
            v_next = top_p_soft_value(pi_next, q1, q2, legal, alpha=alpha, p=top_p)  # SAC-TOPP-3
        return td_target(batch["reward"], batch["done"], v_next, gamma=gamma)  # SAC-TD-1


def losses(policy, critic, target_critic, batch: dict, *, log_alpha: torch.Tensor, gamma: float,
           kappa: float = 0.9, delta: float = 1.0, top_p: float = 1.0) -> dict:
    r"""loss_actor, loss_qvalue, loss_alpha and entropy of one batch, computed, never stepped.

    α = exp(log α) detached in the actor loss and the target; the actor loss holds the online Q
    constant; the critic loss holds y constant; the temperature loss holds H constant.

    Implements: SAC-LOSSES-1, SAC-LOSSES-2 (composing SAC-TD-1, SAC-V-1, SAC-CRITIC-1, SAC-POL-1,
    SAC-ENT-1, SAC-ENT-2, SAC-TEMP-2).
    """
    _checks.has_fields(batch, LOSSES_BATCH_KEYS, "SAC-LOSSES-1")
    alpha = log_alpha.detach().exp()
    y = _target(policy, target_critic, batch, alpha, gamma, top_p)
    q1_all, q2_all = critic(batch["obs"])
    action = batch["action"]
    loss_qvalue = critic_loss(_taken(q1_all, action), _taken(q2_all, action), y, delta=delta)  # SAC-CRITIC-1
    legal = batch["legal_mask"]
    pi = masked_softmax(policy(batch["obs"]), legal)  # SAC-MASK-1/2
    loss_actor = policy_loss(pi, q1_all.detach(), q2_all.detach(), legal, alpha=alpha)  # SAC-POL-1
    h = entropy(pi, legal)  # SAC-ENT-2
    h_tgt = target_entropy(legal, kappa=kappa, dtype=h.dtype)  # SAC-ENT-1, in the loss's dtype
    loss_alpha = temperature_loss(log_alpha, h, h_tgt)  # SAC-TEMP-2
    return {"loss_actor": loss_actor, "loss_qvalue": loss_qvalue, "loss_alpha": loss_alpha,
            "entropy": h.detach().mean(), "alpha": alpha, "target_value": y}
