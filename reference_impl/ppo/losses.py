"""Ratio, KL estimators, clip fraction and the PPO-Clip losses (seed 002, §4, §8).

Every reduction over the batch is a mean (§2 rule 4), so the losses do not scale with batch size.
"""
from __future__ import annotations

import torch

from reference_impl import _checks
from reference_impl._clip import pessimistic_surrogate


def _pair(clause: str, **t: torch.Tensor) -> None:
    _checks.same_shape(clause, **t)
    for name, x in t.items():
        _checks.finite(x, clause, name)


def ratio(new_log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    r""":math:`r = \exp(\ell_{\text{new}} - \ell_{\text{old}})`.

    Implements: PPO-RATIO-1.
    """
    _pair("PPO-INPUT-4", new_log_prob=new_log_prob, old_log_prob=old_log_prob)
    return torch.exp(new_log_prob - old_log_prob)


def approx_kl(old_log_prob: torch.Tensor, new_log_prob: torch.Tensor) -> torch.Tensor:
    r"""The document's estimator :math:`\widehat{KL} = \mathrm{mean}(\ell_{\text{old}} - \ell_{\text{new}})`.

    Unbiased for KL(old‖new) only on actions drawn from the old policy; can be negative per batch.

    Implements: PPO-KL-1.
    """
    _pair("PPO-INPUT-4", old_log_prob=old_log_prob, new_log_prob=new_log_prob)
    return (old_log_prob - new_log_prob).mean()


def k3_kl(old_log_prob: torch.Tensor, new_log_prob: torch.Tensor) -> torch.Tensor:
    r"""Non-negative estimator :math:`\mathrm{mean}((r-1) - \log r)` with :math:`\log r = \ell_{\text{new}}-\ell_{\text{old}}`.

    Written as expm1(log r) − log r, which keeps the precision near r = 1.

    Implements: PPO-KL-2.
    """
    _pair("PPO-INPUT-4", old_log_prob=old_log_prob, new_log_prob=new_log_prob)
    log_r = new_log_prob - old_log_prob
    return (torch.expm1(log_r) - log_r).mean()


def _check_clip_eps(clip_eps: float) -> None:
    _checks.in_range(clip_eps, 0.0, 1.0, "PPO-INPUT-4", "clip_eps", hi_open=True)


def clip_fraction(ratio: torch.Tensor, *, clip_eps: float) -> torch.Tensor:
    r""":math:`\mathrm{mean}(\mathbf 1[|r-1|>\epsilon])`.

    Implements: PPO-CLIPFRAC-1.
    """
    _check_clip_eps(clip_eps)
    _checks.finite(ratio, "PPO-INPUT-4", "ratio")
    return ((ratio - 1.0).abs() > clip_eps).to(ratio.dtype).mean()


def clipped_policy_loss(ratio: torch.Tensor, advantage: torch.Tensor, *, clip_eps: float) -> torch.Tensor:
    r""":math:`L_\pi = -\mathrm{mean}\big(\min(rA,\ \mathrm{clip}(r, 1-\epsilon, 1+\epsilon)A)\big)`.

    The advantage is a constant of the loss (PPO-GRAD-2).

    Implements: PPO-LOSS-1, PPO-LOSS-4, PPO-GRAD-2.
    """
    _check_clip_eps(clip_eps)
    _pair("PPO-INPUT-4", ratio=ratio, advantage=advantage)
    advantage = advantage.detach()
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantage
    return -pessimistic_surrogate(unclipped, clipped).mean()


def value_loss(values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    r""":math:`L_V = \tfrac12\,\mathrm{mean}\big((R - V)^2\big)`.

    The returns are the regression target, a constant of the loss (PPO-GRAD-2).

    Implements: PPO-LOSS-2, PPO-LOSS-4, PPO-GRAD-2.
    """
    _pair("PPO-INPUT-4", values=values, returns=returns)
    return 0.5 * (returns.detach() - values).pow(2).mean()


def total_loss(policy_loss: torch.Tensor, value_loss: torch.Tensor, entropy: torch.Tensor, *,
               vf_coef: float, ent_coef: float) -> torch.Tensor:
    r""":math:`L = L_\pi + c_v L_V - c_e \bar H`; a per-row entropy is averaged first.

    Implements: PPO-LOSS-3.
    """
    return policy_loss + vf_coef * value_loss - ent_coef * entropy.mean()


def entropy_ratio(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    r"""Health metric :math:`\sum_s H(s) / \sum_s \log|\mathcal A(s)|`: 1 for a policy uniform on every
    legal set (the stuck state of §0), lower once it prefers some actions; 0 when no row has a choice.

    Implements: PPO-SLO-4.
    """
    _checks.bool_mask(mask, "PPO-INPUT-2", "mask")
    log_count = mask.sum(-1).to(entropy.dtype).log().sum()
    return torch.where(log_count > 0, entropy.sum() / log_count.clamp_min(torch.finfo(entropy.dtype).tiny),
                       torch.zeros_like(log_count))


def normalize_advantages(advantage: torch.Tensor, *, eps: float = 1e-8, clamp: float | None = None) -> torch.Tensor:
    r""":math:`\hat A = (A - \bar A)/(\mathrm{std}(A) + \epsilon)`, std with Bessel's correction (torch's
    default, as the document writes ``adv.std()``), then optionally clamped to :math:`[-c, c]`.

    Implements: PPO-ADV-1, PPO-ADV-2.
    """
    _checks.finite(advantage, "PPO-INPUT-4", "advantage")
    if advantage.numel() < 2:
        raise ValueError(f"[PPO-INPUT-4] advantage normalisation needs at least 2 samples, got {advantage.numel()}")
    _checks.in_range(eps, 0.0, float("inf"), "PPO-INPUT-4", "eps", lo_open=False, hi_open=True)
    out = (advantage - advantage.mean()) / (advantage.std() + eps)
    if clamp is not None:
        _checks.in_range(clamp, 0.0, float("inf"), "PPO-INPUT-4", "clamp", hi_open=True)
        out = out.clamp(-clamp, clamp)
    return out


def kl_early_stop(approx_kl: float | torch.Tensor, *, target_kl: float = 0.015, factor: float = 2.0) -> bool:
    r"""True when :math:`\widehat{KL} > f\cdot KL_{\text{target}}` (0.03 with the defaults).

    Implements: PPO-KLSTOP-1.
    """
    _checks.in_range(target_kl, 0.0, float("inf"), "PPO-INPUT-4", "target_kl", hi_open=True)
    _checks.in_range(factor, 0.0, float("inf"), "PPO-INPUT-4", "factor", hi_open=True)
    return float(approx_kl) > factor * target_kl


def scale_reward(reward: torch.Tensor, *, scale: float) -> torch.Tensor:
    r""":math:`\tilde r = \mathrm{clip}(r / s, -1, 1)`.

    Implements: PPO-REWARD-1.
    """
    _checks.in_range(scale, 0.0, float("inf"), "PPO-INPUT-4", "scale", hi_open=True)
    _checks.finite(reward, "PPO-INPUT-4", "reward")
    return torch.clamp(reward / scale, -1.0, 1.0)


# ----------------------------------------------------------------------------- §7 self-test, §11 trend (appended)
def log_ratio_excess(new_log_prob: torch.Tensor, old_log_prob: torch.Tensor, *, threshold: float = 2.0) -> torch.Tensor:
    r"""Share of rows whose log-prob difference exceeds the threshold: :math:`\mathrm{mean}(\mathbf 1[\ell_{new}-\ell_{old} > 2])`.

    The §7 self-test wants this share small ("not generally > 2"); 0 on the first minibatch.

    Implements: PPO-SELFTEST-1.
    """
    _pair("PPO-INPUT-4", new_log_prob=new_log_prob, old_log_prob=old_log_prob)
    return ((new_log_prob - old_log_prob) > threshold).to(new_log_prob.dtype).mean()


def ratio_std(ratio: torch.Tensor) -> torch.Tensor:
    r"""Spread of the minibatch ratios: the Bessel-corrected sample std (torch's ``.std()``, as §7
    prints it), 0 for a single row.

    Implements: PPO-RATIO-2.
    """
    _checks.finite(ratio, "PPO-INPUT-4", "ratio")
    if ratio.numel() < 2:
        return torch.zeros((), dtype=ratio.dtype, device=ratio.device)
    return ratio.std()


def entropy_trend(entropy: torch.Tensor) -> dict:
    r"""Least-squares line through a run's per-update entropies :math:`H_u \approx a + b\,u`.

    ``decreasing``: :math:`b < 0`; ``slow``: the fitted decline over the run stays below the fitted
    start, :math:`-b\,(U-1) < a`, i.e. the trend does not reach zero entropy within the run.

    Implements: PPO-SLO-6.
    """
    _checks.finite(entropy, "PPO-INPUT-4", "entropy")
    if entropy.dim() != 1 or entropy.numel() < 2:
        raise ValueError(f"[PPO-INPUT-4] entropy_trend needs a 1-D series of >= 2 updates, got shape {tuple(entropy.shape)}")
    h = entropy.detach().to(torch.float64)
    u = torch.arange(h.numel(), dtype=torch.float64, device=h.device)
    uc = u - u.mean()
    slope = float((uc * (h - h.mean())).sum() / (uc * uc).sum())
    intercept = float(h.mean() - slope * u.mean())
    return {"slope": slope, "intercept": intercept, "decreasing": slope < 0,
            "slow": -slope * (h.numel() - 1) < intercept}
