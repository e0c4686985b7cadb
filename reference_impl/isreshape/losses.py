"""The IS Reshape v4 policy loss, its SFT variant and the diagnostics (seed 003 §5.2, §9, appendix C)."""
from __future__ import annotations

import torch

from reference_impl import _checks
from reference_impl.isreshape._guards import check_gamma, check_tau, check_tokens, work_dtype
from reference_impl.isreshape.weights import importance_ratio, reshape_weight, reward_gamma, sapo_weight


def _token_weights(log_prob, ref_log_prob, advantages, *, tau, beta, gamma_min, gamma_max, log_ratio_clamp):
    """(r, gamma, w_SAPO, w) per token in the working dtype, all detached (appendix C: w carries no gradient)."""
    wd = work_dtype(log_prob)
    with torch.no_grad():
        r = importance_ratio(log_prob.to(wd), ref_log_prob.to(wd), log_ratio_clamp=log_ratio_clamp)  # ISR-RATIO-1
        gamma = reward_gamma(advantages.to(wd), beta=beta, gamma_min=gamma_min, gamma_max=gamma_max)  # ISR-GAMMA-1
        w_sapo = sapo_weight(r, tau=tau)  # ISR-SAPO-1
        w = reshape_weight(r, gamma, tau=tau)  # ISR-W-1
    return r, gamma, w_sapo, w


def policy_loss(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, *, tau: float = 1.0, beta: float = 1.0, gamma_min: float = 0.0,
                gamma_max: float = 1.0, log_ratio_clamp: float = 20.0, mask_eps: float = 1e-8) -> torch.Tensor:
    r""":math:`L = -\sum_t \bar w_t A_t \log\pi_t m_t / (\sum_t m_t + \epsilon)`,
    :math:`\bar w = \mathrm{sg}[w_{\gamma(|A|)}(r)]`.

    The gradient in log pi is -w A m / (sum m + eps). The document's code leaves out the log pi factor,
    which makes the loss a constant with zero gradient; this is the corrected surrogate.
    Implements: ISR-LOSS-1, ISR-LOSS-2
    """
    check_tokens(log_prob=log_prob, ref_log_prob=ref_log_prob, advantages=advantages, response_mask=response_mask)
    check_tau(tau)
    *_, w = _token_weights(log_prob, ref_log_prob, advantages, tau=tau, beta=beta, gamma_min=gamma_min,
                           gamma_max=gamma_max, log_ratio_clamp=log_ratio_clamp)
    wd = work_dtype(log_prob)
    m = response_mask.detach().to(wd)
    loss = -(w * advantages.detach().to(wd) * log_prob.to(wd) * m).sum() / (m.sum() + mask_eps)
    return loss.to(log_prob.dtype)


def sft_loss(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, response_mask: torch.Tensor, *,
             tau: float = 1.0, gamma_sft: float = 0.2, log_ratio_clamp: float = 20.0,
             mask_eps: float = 1e-8) -> torch.Tensor:
    r""":math:`L_{SFT} = -\sum_t \bar w_t \log\pi_t m_t / (\sum_t m_t + \epsilon)`,
    :math:`\bar w = \mathrm{sg}[w_{\gamma_{sft}}(r)]`.

    Implements: ISR-SFT-1
    """
    r, w, wd = sft_weights(log_prob, ref_log_prob, response_mask, tau=tau, gamma_sft=gamma_sft,
                           log_ratio_clamp=log_ratio_clamp)
    m = response_mask.detach().to(wd)
    return (-(w * log_prob.to(wd) * m).sum() / (m.sum() + mask_eps)).to(log_prob.dtype)


def sft_weights(log_prob, ref_log_prob, response_mask, *, tau: float, gamma_sft: float, log_ratio_clamp: float):
    """(r, w_{γ_sft}(r), work dtype) of the SFT variant, detached, after the inputs are checked."""
    check_tokens(log_prob=log_prob, ref_log_prob=ref_log_prob, response_mask=response_mask)
    check_tau(tau)
    check_gamma(gamma_sft, "gamma_sft")
    wd = work_dtype(log_prob)
    with torch.no_grad():
        r = importance_ratio(log_prob.to(wd), ref_log_prob.to(wd), log_ratio_clamp=log_ratio_clamp)  # ISR-RATIO-1
        w = reshape_weight(r, gamma_sft, tau=tau)  # ISR-W-1 with a fixed gamma
    return r, w, wd


def loss_metrics(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, advantages: torch.Tensor,
                 response_mask: torch.Tensor, *, tau: float = 1.0, beta: float = 1.0, gamma_min: float = 0.0,
                 gamma_max: float = 1.0, log_ratio_clamp: float = 20.0) -> dict[str, float]:
    r"""Masked diagnostics: :math:`\bar x = \sum_t x_t m_t / \sum_t m_t` for gamma, w, w_SAPO, r, |A|; kl =
    mean of :math:`-\log r` (clamped); gamma_std is the Bessel-corrected std over masked tokens (0 for <= 1 token);
    weight_max the max over masked tokens.

    Implements: ISR-METRIC-1, ISR-METRIC-2, ISR-METRIC-3
    """
    check_tokens(log_prob=log_prob, ref_log_prob=ref_log_prob, advantages=advantages, response_mask=response_mask)
    check_tau(tau)
    r, gamma, w_sapo, w = _token_weights(log_prob, ref_log_prob, advantages, tau=tau, beta=beta,
                                         gamma_min=gamma_min, gamma_max=gamma_max,
                                         log_ratio_clamp=log_ratio_clamp)
    m = response_mask.to(r.dtype).detach()
    total = m.sum()
    if _checks._on() and float(total) <= 0:
        raise ValueError("[ISR-INPUT-1] response_mask selects no token: masked means are undefined")
    sel = response_mask.bool()

    def mean(x):
        return float((x * m).sum() / total)

    wd = r.dtype
    log_r = (log_prob.detach().to(wd) - ref_log_prob.detach().to(wd)).clamp(-log_ratio_clamp, log_ratio_clamp)
    n = int(sel.sum())
    return {
        "gamma_mean": mean(gamma),
        "gamma_std": float(gamma[sel].std()) if n > 1 else 0.0,
        "weight_mean": mean(w),
        "weight_max": float(w[sel].max()),
        "sapo_weight_mean": mean(w_sapo),
        "ratio_mean": mean(r),
        "abs_adv_mean": mean(advantages.detach().to(r.dtype).abs()),
        "kl": mean(-log_r),
    }


def document_policy_loss(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, advantages: torch.Tensor,
                         response_mask: torch.Tensor, *, tau: float = 1.0, beta: float = 1.0, gamma_min: float = 0.0,
                         gamma_max: float = 1.0, log_ratio_clamp: float = 20.0, mask_eps: float = 1e-8) -> torch.Tensor:
    r"""The loss exactly as the document's §9 code builds it: -\sum \bar w A m / (\sum m + \epsilon).

    NOT conformant: no factor depends on the parameters, so the gradient is zero (ISR-LOSS-1 errata).
    Kept only so the trainer can show that it does not learn, and as the ``zero_gradient_loss`` mutant.
    """
    check_tokens(log_prob=log_prob, ref_log_prob=ref_log_prob, advantages=advantages, response_mask=response_mask)
    *_, w = _token_weights(log_prob, ref_log_prob, advantages, tau=tau, beta=beta, gamma_min=gamma_min,
                           gamma_max=gamma_max, log_ratio_clamp=log_ratio_clamp)
    m = response_mask.to(w.dtype)
    return (-(w.detach() * advantages.to(w.dtype) * m).sum() / (m.sum() + mask_eps)).to(log_prob.dtype)
