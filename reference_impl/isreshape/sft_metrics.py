"""Diagnostics of the SFT variant (seed 003, §9 ``is_reshape_v4_sft``)."""
from __future__ import annotations

import torch

from reference_impl import _checks
from reference_impl.isreshape.losses import sft_weights


def sft_metrics(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, response_mask: torch.Tensor, *,
                tau: float = 1.0, gamma_sft: float = 0.2, log_ratio_clamp: float = 20.0) -> dict[str, float]:
    r"""{gamma: :math:`\gamma_{sft}`, weight_mean: :math:`\sum w_{\gamma_{sft}}(r)\,m / \sum m`, ratio_mean:
    :math:`\sum r\,m / \sum m`}, r clamped as in the loss.

    Implements: ISR-METRIC-4
    """
    r, w, wd = sft_weights(log_prob, ref_log_prob, response_mask, tau=tau, gamma_sft=gamma_sft,
                           log_ratio_clamp=log_ratio_clamp)  # ISR-RATIO-1, ISR-W-1 with the fixed gamma
    with torch.no_grad():
        m = response_mask.to(wd)
        total = m.sum()
    if _checks._on() and float(total) <= 0:
        raise ValueError("[ISR-INPUT-1] response_mask selects no token: masked means are undefined")
    return {"gamma": float(gamma_sft), "weight_mean": float((w * m).sum() / total),
            "ratio_mean": float((r * m).sum() / total)}
