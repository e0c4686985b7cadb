"""Token-level pieces the LM trainer needs around the reference ops: masked reductions and one baseline.

The reference's PPO ops (``clipped_policy_loss``, ``k3_kl``, ``clip_fraction``) reduce with a plain
mean over every entry. Over [B, T] response tokens the trainer neutralises the masked-out entries
(so they add exactly 0) and rescales that mean to the mean over response tokens with
:func:`as_token_mean`; the formula itself stays the reference's.
"""
from __future__ import annotations

import torch

from reference_impl.isreshape.weights import importance_ratio


def as_token_mean(mean_over_all: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Turn mean_{all B*T entries} x into sum_t x m_t / sum_t m_t, given x = 0 where m = 0."""
    return mean_over_all * (mask.numel() / mask.sum().clamp_min(1))


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp_min(1)


def importance_sampling_loss(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, advantages: torch.Tensor,
                             response_mask: torch.Tensor, *, log_ratio_clamp: float = 20.0) -> torch.Tensor:
    r"""Vanilla importance sampling, no clip and no trust region: L = -\sum_t r_t A_t m_t / \sum_t m_t.

    Its gradient in log pi is -r A m / n: the "noclip" arm of seed 003 §1.1 (GRPO's surrogate without
    the clip). A baseline, not a clause; the ratio is the clamped ISR-RATIO-1 ratio, kept differentiable.
    """
    r = importance_ratio(log_prob, ref_log_prob.detach(), log_ratio_clamp=log_ratio_clamp)  # ISR-RATIO-1
    return -masked_mean(r * advantages.detach(), response_mask)


def ratio_stats(ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Population std, min and max of r over the response tokens, as device tensors (no sync); the mean
    is ISR-METRIC-1's ``ratio_mean`` from ``loss_metrics``."""
    m = mask.bool()
    mean = masked_mean(ratio, m)
    var = masked_mean((ratio - mean) ** 2, m)
    inf = torch.full_like(ratio, float("inf"))
    return {"ratio_std": var.sqrt(), "ratio_min": torch.where(m, ratio, inf).amin(),
            "ratio_max": torch.where(m, ratio, -inf).amax()}
