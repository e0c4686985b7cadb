"""SAPO as a policy loss (seed 003 §2.1, §8.1): the soft gate objective with sign-selected temperatures.

``objective.sapo_gate`` is the per-token SAPO objective for one temperature and
``weights.sapo_weight_signed`` the gradient weight of §8.1; this module is the masked token loss
whose gradient carries that weight, so a trainer can run SAPO as an objective arm.
"""
from __future__ import annotations

import torch

from reference_impl.isreshape._guards import check_tau, check_tokens, work_dtype
from reference_impl.isreshape.objective import sapo_gate
from reference_impl.isreshape.weights import importance_ratio


def sapo_policy_loss(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, advantages: torch.Tensor,
                     response_mask: torch.Tensor, *, tau_pos: float, tau_neg: float, log_ratio_clamp: float = 20.0,
                     mask_eps: float = 1e-8) -> torch.Tensor:
    r"""L = -\sum_t f_{SAPO}^{\tau_{A_t}}(r_t)\,A_t\,m_t / (\sum_t m_t + \epsilon), \tau_A = \tau_+ if A > 0 else \tau_-.

    f_SAPO^tau(r) = (4/tau) sigma(tau (r - 1)) and r is differentiable (unlike the detached weight of
    ISR-LOSS-1), so dL/dlog pi_t = -r f'(r) A_t m_t / n = -r sech^2(tau_A (r_t - 1)/2) A_t m_t / n:
    the signed SAPO weight of §8.1 times the policy-gradient term.
    Implements: ISR-SAPO-2, ISR-SAPO-3
    """
    check_tokens(log_prob=log_prob, ref_log_prob=ref_log_prob, advantages=advantages, response_mask=response_mask)
    check_tau(tau_pos, "tau_pos")
    check_tau(tau_neg, "tau_neg")
    wd = work_dtype(log_prob)
    r = importance_ratio(log_prob.to(wd), ref_log_prob.detach().to(wd), log_ratio_clamp=log_ratio_clamp)
    adv = advantages.detach().to(wd)
    gate = torch.where(adv > 0, sapo_gate(r, tau=tau_pos), sapo_gate(r, tau=tau_neg))  # A = 0 takes tau_neg (§8.1)
    m = response_mask.detach().to(wd)
    return (-(gate * adv * m).sum() / (m.sum() + mask_eps)).to(log_prob.dtype)
