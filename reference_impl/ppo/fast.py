r"""The PPO update's fast path, the same result as the plain formulas it names (its oracle).

It trades readability for speed: the minibatch loss takes one masked ``log_softmax`` and computes the
gradients into the logits and the values in closed form next to the value, so backward is one autograd
node instead of some thirty. Its oracles are ``update.loss_terms_deferred`` and
``update.minibatch_loss_deferred`` (autograd through the formulas of ``losses`` and ``masking``);
``conformance_tests/meta/test_ppo_fastpaths.py`` holds it to them (loss, diagnostics, gradients, and
the steps of a whole ``ppo_update``). The trainers pass :func:`minibatch_loss_fused` to ``ppo_update``;
the plain formulas stay the specification's text.
"""
from __future__ import annotations

from typing import Callable

import torch

from reference_impl._clip import pessimistic_surrogate, pessimistic_weight
from reference_impl._dtypes import promoted
from reference_impl._fused import with_gradients
# by name: the package attribute ``ppo.losses`` is the contract op once ``reference_impl.ppo`` has loaded
from reference_impl.ppo.losses import approx_kl, clip_fraction, k3_kl, ratio
from reference_impl.ppo.masking import _check_logits_and_mask, fill_value
from reference_impl.ppo.update import _forward


def loss_terms_fused(logits: torch.Tensor, values: torch.Tensor, mb: dict, *, old_log_prob: torch.Tensor,
                     clip_eps: float, vf_coef: float, ent_coef: float) -> tuple[torch.Tensor, dict]:
    r"""Fast path of :func:`update.loss_terms_deferred` for a validated batch: the same loss and diagnostics,
    with the gradients into the logits and the values in closed form, computed with the value (one
    autograd node instead of some thirty). With n rows, r = exp(ℓ_new − ℓ_old) and w the branch
    weight of the clipped objective:

    ∂L/∂ℓ_new = −A r w / n;  ∂ℓ_new/∂z = 1[a] − π;  ∂(−c_e H̄)/∂z = c_e π (log π + H) / n;
    ∂L/∂V = c_v (V − R) / n.

    Masked logits and log-probs as in PPO-MASK-1/4 (one log_softmax). The plain path is its oracle
    (conformance_tests/meta/test_ppo_fastpaths.py).

    Implements: PPO-LOGP-1, PPO-ENT-1, PPO-RATIO-1, PPO-KL-1, PPO-KL-2, PPO-CLIPFRAC-1, PPO-LOSS-1..4.
    """
    _check_logits_and_mask(logits, mb["mask"])  # the guards of evaluate_actions (off in a validated loop)
    with torch.no_grad():
        # mixed dtypes (float64 advantages from a numpy GAE, float32 networks) promote, as in the plain formulas
        z, v, adv, ret, old_log_prob = promoted(logits.detach(), values.detach(), mb["advantage"].detach(),
                                                mb["return"].detach(), old_log_prob)
        log_pi = torch.log_softmax(z.masked_fill(~mb["mask"], fill_value(z.dtype)), dim=-1)  # PPO-MASK-1/4
        pi = log_pi.exp()
        idx = mb["action"].long().unsqueeze(-1)
        new = log_pi.gather(-1, idx).squeeze(-1)  # PPO-LOGP-1
        H = -torch.linalg.vecdot(pi, log_pi)  # PPO-ENT-1, exactly 0 from illegal entries (π = 0)
        n = new.shape[0]
        r = ratio(new, old_log_prob)  # PPO-RATIO-1
        lo, hi = 1.0 - clip_eps, 1.0 + clip_eps
        unclipped, clipped = r * adv, r.clamp(lo, hi) * adv
        pl = -pessimistic_surrogate(unclipped, clipped).mean()  # PPO-LOSS-1
        vl = 0.5 * (ret - v).pow(2).mean()  # PPO-LOSS-2
        ent = H.mean()
        loss = pl + vf_coef * vl - ent_coef * ent  # PPO-LOSS-3
        in_range = ((r >= lo) & (r <= hi)).to(r.dtype)
        d_new = -(adv * r * pessimistic_weight(unclipped, clipped, in_range)) / n
        g_z = pi * (log_pi.add_(H[:, None]).mul_(ent_coef / n)).sub_(d_new[:, None])  # −d_new·π + entropy
        g_z.scatter_add_(-1, idx, d_new[:, None])  # + d_new at the replayed action
        g_v = (v - ret).mul_(vf_coef / n)
        metrics = {
            "loss": loss, "policy_loss": pl, "value_loss": vl, "entropy": ent,
            "approx_kl": approx_kl(old_log_prob, new),  # PPO-KL-1
            "k3_kl": k3_kl(old_log_prob, new),  # PPO-KL-2
            "clip_fraction": clip_fraction(r, clip_eps=clip_eps),  # PPO-CLIPFRAC-1
            "ratio_mean": r.mean(), "ratio_std": r.std() if n > 1 else torch.zeros_like(r.sum()),
            "log_prob_min": new.min(),  # §7 diagnostic, PPO-SLO-5
        }
    return with_gradients(loss, [logits, values], [g_z, g_v]), metrics


def minibatch_loss_fused(actor: Callable, critic: Callable, mb: dict, *, clip_eps: float, vf_coef: float,
                         ent_coef: float) -> tuple[torch.Tensor, dict]:
    """:func:`update.minibatch_loss_deferred` through :func:`loss_terms_fused` (the trainers' step: the same
    path whether the guards are on or off, so a resumed run repeats an uninterrupted one exactly).

    Implements: PPO-OLD-1, PPO-MAPPO-2.
    """
    return _forward(actor, critic, mb, loss_terms_fused, clip_eps=clip_eps, vf_coef=vf_coef, ent_coef=ent_coef)
