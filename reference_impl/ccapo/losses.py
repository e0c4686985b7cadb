r"""PPO-clip objective with a KL penalty to the reference policy (seed 004 §6)."""
from __future__ import annotations

import torch

from reference_impl import _checks
from reference_impl._clip import pessimistic_surrogate


def _traj_mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """(1/T_τ) Σ_t over each trajectory's real steps, then the mean over trajectories with T_τ > 0."""
    mf = m.to(x.dtype)
    steps = mf.sum(-1)
    per_traj = (x * mf).sum(-1) / steps.clamp_min(1.0)
    has = steps > 0
    return per_traj[has].mean() if bool(has.any()) else x.sum() * 0.0


def policy_loss(logp_new, logp_old, logp_ref, advantages, mask, *, clip_eps: float = 0.2,
                beta_kl: float = 0.04) -> dict[str, torch.Tensor]:
    r"""Negated CCAPO objective.

    \mathcal{L}(\theta) = \mathbb{E}_\tau\Big[\tfrac{1}{T}\sum_t \min(\rho_t A_t, \mathrm{clip}(\rho_t, 1-\epsilon, 1+\epsilon) A_t)\Big]
      - \beta_{KL}\,\mathbb{E}_\tau\Big[\tfrac{1}{T}\sum_t k_3\Big],\quad k_3 = e^{\Delta}-\Delta-1,\ \Delta = \log\pi_{ref} - \log\pi_\theta

    ρ_t = exp(logp_new − logp_old); logp_old, logp_ref and the advantages are constants. The diagnostic
    ``approx_kl`` estimates KL(π_old‖π_θ) by k3, (ρ − 1) − log ρ (never negative), averaged like the
    surrogate.
    Implements: CCAPO-PPO-1, CCAPO-PPO-2
    """
    m = torch.as_tensor(mask)
    if m.dtype != torch.bool:
        raise ValueError(f"[CCAPO-INPUT-3] mask must be bool, got {m.dtype}")
    _checks.same_shape("CCAPO-INPUT-3", logp_new=logp_new, logp_old=logp_old, logp_ref=logp_ref,
                       advantages=advantages, mask=m)
    for name, t in (("logp_new", logp_new), ("logp_old", logp_old), ("logp_ref", logp_ref),
                    ("advantages", advantages)):
        _checks.finite(t, "CCAPO-INPUT-1", name)
    _checks.in_range(clip_eps, 0.0, 1.0, "CCAPO-INPUT-5", "clip_eps", hi_open=True)
    old, ref, adv = logp_old.detach(), logp_ref.detach(), advantages.detach()
    log_ratio = logp_new - old
    ratio = log_ratio.exp()
    unclipped, clipped = ratio * adv, ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv
    surr = pessimistic_surrogate(unclipped, clipped)
    delta = ref - logp_new
    k3 = delta.exp() - delta - 1.0
    objective = _traj_mean(surr, m)
    kl_ref = _traj_mean(k3, m)
    with torch.no_grad():
        approx_kl = _traj_mean((ratio - 1.0) - log_ratio, m)
        clipped = ((ratio - 1.0).abs() > clip_eps).to(logp_new.dtype)
        clip_fraction = _traj_mean(clipped, m)
    return {"loss": -(objective - beta_kl * kl_ref), "loss_clip": -objective, "loss_kl": beta_kl * kl_ref,
            "kl_ref": kl_ref.detach(), "approx_kl": approx_kl, "clip_fraction": clip_fraction}
