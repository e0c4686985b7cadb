"""Mutants of the isreshape family: the document's own bugs and the misreadings it invites."""
from __future__ import annotations

import torch

from conformance_tests.mutants import mutant, override
from reference_impl.isreshape.losses import document_policy_loss


@mutant("ISR-LOSS-2", "ISR-LOSS-1",
        doc="The document's code: -(w.detach() * A * mask).sum() / (mask.sum() + 1e-8), with no log pi "
            "factor, so the loss is a constant and its gradient is zero.",
        source="seed 003 §9")
def zero_gradient_loss(ref):
    return override(ref, "isreshape", policy_loss=document_policy_loss)


@mutant("ISR-GAMMA-1", doc="gamma from the signed advantage, sigma(beta A): negative advantages get gamma < 1/2.",
        source="seed 003 §3.4 vs §8.1 (SAPO's use of sign(A))")
def signed_advantage_gamma(ref):
    def reward_gamma(advantages, *, beta=1.0, gamma_min=0.0, gamma_max=1.0):
        return gamma_min + (gamma_max - gamma_min) * torch.sigmoid(beta * advantages)

    return override(ref, "isreshape", reward_gamma=reward_gamma)


@mutant("ISR-SAPO-1", "ISR-W-1", doc="sech^2(tau (r - 1)) without the /2 in the SAPO weight (and so in w).",
        source="seed 003 §2.1")
def sech2_without_half(ref):
    def sapo_weight(ratio, *, tau=1.0):
        return ratio / torch.cosh(tau * (ratio - 1.0)) ** 2

    def reshape_weight(ratio, gamma, *, tau=1.0):
        return (1.0 - gamma) + gamma * sapo_weight(ratio, tau=tau)

    return override(ref, "isreshape", sapo_weight=sapo_weight, reshape_weight=reshape_weight)


@mutant("ISR-F-1", "ISR-F-2", doc="f without the 2/tau factor: (1 - gamma) log r + gamma tanh(tau (r - 1)/2).",
        source="seed 003 §4.1")
def f_without_two_over_tau(ref):
    def reshape_f(ratio, gamma, *, tau=1.0):
        return (1.0 - gamma) * torch.log(ratio) + gamma * torch.tanh(tau * (ratio - 1.0) / 2.0)

    return override(ref, "isreshape", reshape_f=reshape_f)


@mutant("ISR-F-2", doc="§4.1's reading w = r f'(r) + f(r): the weight gains f_gamma(r) (1 + log r at gamma = 0).",
        source="seed 003 §4.1")
def weight_is_rf_prime_plus_f(ref):
    def reshape_weight(ratio, gamma, *, tau=1.0):
        return ref.isreshape.reshape_weight(ratio, gamma, tau=tau) + ref.isreshape.reshape_f(ratio, gamma, tau=tau)

    return override(ref, "isreshape", reshape_weight=reshape_weight)


@mutant("ISR-LOSS-2", doc="The weight is not detached: the gradient picks up d w / d log pi through r.",
        source="seed 003 appendix C")
def undetached_weight(ref):
    def policy_loss(log_prob, ref_log_prob, advantages, response_mask, *, tau=1.0, beta=1.0, gamma_min=0.0,
                    gamma_max=1.0, log_ratio_clamp=20.0, mask_eps=1e-8):
        r = torch.exp((log_prob - ref_log_prob).clamp(-log_ratio_clamp, log_ratio_clamp))
        gamma = ref.isreshape.reward_gamma(advantages.detach(), beta=beta, gamma_min=gamma_min, gamma_max=gamma_max)
        weight = (1.0 - gamma) + gamma * r / torch.cosh(tau * (r - 1.0) / 2.0) ** 2
        return -(weight * advantages * log_prob * response_mask).sum() / (response_mask.sum() + mask_eps)

    return override(ref, "isreshape", policy_loss=policy_loss)


@mutant("ISR-RATIO-1", doc="No clamp on the log-ratio before exp.", source="seed 003 §9")
def unclamped_ratio(ref):
    def importance_ratio(log_prob, ref_log_prob, *, log_ratio_clamp=20.0):
        return torch.exp(log_prob - ref_log_prob)

    return override(ref, "isreshape", importance_ratio=importance_ratio)


# ----------------------------------------------------------------------------- clauses on points the seed document leaves open
@mutant("ISR-METRIC-4", doc="SFT weight_mean averaged over every token, padding included (mask ignored).")
def sft_metrics_ignore_mask(ref):
    def sft_metrics(log_prob, ref_log_prob, response_mask, *, tau=1.0, gamma_sft=0.2, log_ratio_clamp=20.0):
        return ref.isreshape.sft_metrics(log_prob, ref_log_prob, torch.ones_like(response_mask), tau=tau,
                                         gamma_sft=gamma_sft, log_ratio_clamp=log_ratio_clamp)

    return override(ref, "isreshape", sft_metrics=sft_metrics)


# ----------------------------------------------------------------------------- suite-strength classes
@mutant("ISR-LOSS-1", "ISR-LOSS-2", doc="Keyword not forwarded: the policy loss drops log_ratio_clamp and "
        "mask_eps on the way down and always uses the defaults 20 and 1e-8.",
        source="a wrapper that forwards **only** the keywords it knows")
def loss_ignores_clamp_and_mask_eps(ref):
    base = ref.isreshape.policy_loss

    def policy_loss(log_prob, ref_log_prob, advantages, response_mask, *, log_ratio_clamp=20.0, mask_eps=1e-8, **kw):
        return base(log_prob, ref_log_prob, advantages, response_mask, **kw)

    return override(ref, "isreshape", policy_loss=policy_loss)


@mutant("ISR-DTYPE-1", "ISR-W-1", doc="The weight is computed and returned in float32 whatever the input dtype.",
        source="a hard-coded .float() in a mixed-precision code path")
def weight_downcast_to_float32(ref):
    base = ref.isreshape.reshape_weight

    def reshape_weight(ratio, gamma, *, tau=1.0):
        g = gamma.float() if isinstance(gamma, torch.Tensor) else gamma
        return base(ratio.float(), g, tau=tau)

    return override(ref, "isreshape", reshape_weight=reshape_weight)


@mutant("ISR-STAB-1", doc="In half precision the loss falls back to the document's constant: finite, but with "
        "zero gradient (and the wrong value).", source="seed 003 §9 under a low-precision autocast")
def half_precision_constant_loss(ref):
    base = ref.isreshape.policy_loss

    def policy_loss(log_prob, *args, **kw):
        if log_prob.dtype in (torch.float16, torch.bfloat16):
            return document_policy_loss(log_prob, *args, **kw)
        return base(log_prob, *args, **kw)

    return override(ref, "isreshape", policy_loss=policy_loss)


# ----------------------------------------------------------------------------- loss aggregation
@mutant("ISR-AGG-1", doc="The aggregation mode argument is ignored: always seq-mean-token-mean.",
        source="verl 0.9.1 compute_policy_loss_sapo, core_algos.py:1689 (docs/audits/_research/verl.md, finding 1)")
def aggregate_ignores_mode(ref):
    def aggregate_loss(loss_mat, mask, *, mode="token-mean"):
        return ref.isreshape.aggregate_loss(loss_mat, mask, mode="seq-mean-token-mean")

    return override(ref, "isreshape", aggregate_loss=aggregate_loss)


@mutant("ISR-AGG-1", doc="Sequence means divide by every row, padding-only rows included.")
def aggregate_seq_mean_counts_empty_rows(ref):
    def aggregate_loss(loss_mat, mask, *, mode="token-mean"):
        out = ref.isreshape.aggregate_loss(loss_mat, mask, mode=mode)
        if mode.startswith("seq-mean"):
            live = (mask != 0).any(-1).sum()
            out = out * live / mask.shape[0]
        return out

    return override(ref, "isreshape", aggregate_loss=aggregate_loss)


@mutant("ISR-LOSS-1", doc="The policy loss masks with 1 - response_mask, which a bool mask (the contract allows "
        "bool or 0/1 float) cannot do.", source="(1 - mask) written for float masks")
def policy_loss_float_masks_only(ref):
    base = ref.isreshape.policy_loss

    def policy_loss(log_prob, ref_log_prob, advantages, response_mask, **kw):
        padding = 1 - response_mask  # a bool tensor has no subtraction
        return base(log_prob, ref_log_prob, advantages, 1 - padding, **kw)

    return override(ref, "isreshape", policy_loss=policy_loss)

