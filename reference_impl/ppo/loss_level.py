"""PPO-Clip at the level libraries are built: the losses of one minibatch in one call.

Composes the checked ops of ``masking`` and ``losses`` with TorchRL's ``ClipPPOLoss`` key names, so
a library loss module can be compared with the seed's §4 update path through one call.
"""
from __future__ import annotations

import torch

from reference_impl import _checks
from reference_impl.ppo.losses import (
    approx_kl,
    clip_fraction,
    clipped_policy_loss,
    ratio,
    value_loss,
)
from reference_impl.ppo.masking import evaluate_actions

LOSSES_BATCH_KEYS = ("obs", "action", "old_log_prob", "mask", "advantage", "return")


def losses(actor, critic, batch: dict, *, clip_eps: float = 0.2, vf_coef: float = 0.5,
           ent_coef: float = 0.01) -> dict:
    r"""loss_objective, loss_critic, loss_entropy, entropy, clip_fraction, kl_approx of a minibatch.

    The three losses sum to the PPO-LOSS-3 total L_π + c_v L_V − c_e H̄.

    Implements: PPO-LOSSES-1 (composing PPO-MASK-3, PPO-LOGP-1, PPO-ENT-1, PPO-RATIO-1, PPO-KL-1,
    PPO-CLIPFRAC-1, PPO-LOSS-1, PPO-LOSS-2, PPO-LOSS-3, PPO-GRAD-2).
    """
    _checks.has_fields(batch, LOSSES_BATCH_KEYS, "PPO-LOSSES-1")
    old = batch["old_log_prob"].detach()  # PPO-GRAD-2: the cached log-prob is a constant
    new, h = evaluate_actions(actor(batch["obs"]), batch["mask"], batch["action"])  # PPO-MASK-3, PPO-ENT-1
    r = ratio(new, old)  # PPO-RATIO-1
    entropy = h.mean()
    with torch.no_grad():
        kl, frac = approx_kl(old, new), clip_fraction(r, clip_eps=clip_eps)  # PPO-KL-1, PPO-CLIPFRAC-1
    return {
        "loss_objective": clipped_policy_loss(r, batch["advantage"], clip_eps=clip_eps),  # PPO-LOSS-1
        "loss_critic": vf_coef * value_loss(critic(batch["obs"]), batch["return"]),  # PPO-LOSS-2, -3
        "loss_entropy": -ent_coef * entropy,  # PPO-LOSS-3
        "entropy": entropy.detach(), "clip_fraction": frac, "kl_approx": kl,
    }
