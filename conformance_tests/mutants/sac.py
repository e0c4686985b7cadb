"""Mutants of the sac family: V1's superseded rules and the bugs the V2 document warns about.

Each replaces one reference operation; most reuse the reference for everything but the bug.
"""
from __future__ import annotations

import math

import torch

from conformance_tests.mutants import mutant, override

V1 = "001_1dec206837da3656.txt"


@mutant("SAC-MASK-2", doc="-inf mask with no epsilon-clip: illegal actions get probability 0 and log pi = -inf.",
        source=f"{V1} §2")
def inf_mask_without_clip(ref):
    def masked_softmax(logits, legal_mask, *, eps=1e-8):
        return torch.softmax(logits.masked_fill(~legal_mask, float("-inf")), dim=-1)

    return override(ref, "sac", masked_softmax=masked_softmax)


@mutant("SAC-TEMP-1", "SAC-TEMP-2", doc="V1's temperature rule: log alpha moves with H - H_tgt, lowering alpha on an "
        "entropy deficit.", source=f"{V1} §5, §7")
def v1_temperature_sign(ref):
    def temperature_update(log_alpha, entropy, target_entropy, *, lr, alpha_min=1e-4, alpha_max=2.0):
        new = log_alpha.detach() + lr * (entropy - target_entropy).mean()
        return new.clamp(math.log(alpha_min), math.log(alpha_max))

    def temperature_loss(log_alpha, entropy, target_entropy):
        return log_alpha * (target_entropy - entropy).detach().mean()

    return override(ref, "sac", temperature_update=temperature_update, temperature_loss=temperature_loss)


@mutant("SAC-TD-1", doc="V1's target y = r + gamma V: bootstraps through terminal steps.", source=f"{V1} §5")
def no_done_truncation(ref):
    def td_target(reward, done, next_value, *, gamma):
        return ref.sac.td_target(reward, torch.zeros_like(done), next_value, gamma=gamma)

    return override(ref, "sac", td_target=td_target)


@mutant("SAC-TOPP-1", doc="V1's fixed Top-K (K=64, here min(K, legal)) in place of coverage-driven Top-p.",
        source=f"{V1} §5, §9")
def top_k_for_top_p(ref):
    def top_p_select(probs, legal_mask, *, p):
        k = min(64, probs.shape[-1])
        pi = torch.where(legal_mask, probs.detach(), torch.full_like(probs, -1.0))
        idx = pi.topk(k, dim=-1).indices
        sel = torch.zeros_like(legal_mask).scatter(-1, idx, True)
        return sel & legal_mask

    return override(ref, "sac", top_p_select=top_p_select)


@mutant("SAC-TOPP-2", "SAC-TOPP-3", doc="Top-p probabilities left unnormalised (pi restricted to P, not rescaled).")
def top_p_without_renormalisation(ref):
    def top_p_probs(probs, selected):
        return torch.where(selected, probs, torch.zeros_like(probs))

    def top_p_soft_value(probs, q1, q2, legal_mask, *, alpha, p):
        sel = ref.sac.top_p_select(probs, legal_mask, p=p)
        return ref.sac.soft_value(probs, q1, q2, sel, alpha=alpha)

    return override(ref, "sac", top_p_probs=top_p_probs, top_p_soft_value=top_p_soft_value)


@mutant("SAC-TOPP-1", doc="Top-p chosen on the raw distribution before masking: illegal actions can enter P.")
def top_p_before_masking(ref):
    def top_p_select(probs, legal_mask, *, p):
        return ref.sac.top_p_select(probs, torch.ones_like(legal_mask), p=p)

    return override(ref, "sac", top_p_select=top_p_select)


@mutant("SAC-V-1", "SAC-POL-1", doc="max instead of min over the twin critics (optimistic backup and policy target).")
def max_over_twin_q(ref):
    def soft_value(probs, q1, q2, legal_mask, *, alpha):
        q = torch.maximum(q1, q2)
        return ref.sac.soft_value(probs, q, q, legal_mask, alpha=alpha)

    def policy_loss(probs, q1, q2, legal_mask, *, alpha):
        q = torch.maximum(q1, q2)
        return ref.sac.policy_loss(probs, q, q, legal_mask, alpha=alpha)

    return override(ref, "sac", soft_value=soft_value, policy_loss=policy_loss)


@mutant("SAC-BC-1", doc="BC applied to every sample of the batch, agent samples included.")
def bc_on_agent_samples(ref):
    def bc_loss(log_probs, actions, is_demo, *, lam=0.1):
        return ref.sac.bc_loss(log_probs, actions, torch.ones_like(is_demo), lam=lam)

    return override(ref, "sac", bc_loss=bc_loss)


@mutant("SAC-DAGGER-1", doc="DAgger schedule reversed: teacher ratio rises from 0.1 to 1.0.")
def dagger_reversed(ref):
    def dagger_teacher_ratio(step, *, start=1.0, end=0.1, horizon=200_000):
        return ref.sac.dagger_teacher_ratio(step, start=end, end=start, horizon=horizon)

    return override(ref, "sac", dagger_teacher_ratio=dagger_teacher_ratio)


@mutant("SAC-POPART-1", doc="PopArt variance updated with the old mean mu_{t-1} instead of mu_t.")
def popart_old_mean(ref):
    def popart_step(mu, var, x, *, beta=1e-3, eps=1e-8):
        mu_t = (1.0 - beta) * mu + beta * x
        var_t = (1.0 - beta) * var + beta * (x - mu) ** 2
        return (x - mu_t) / (torch.sqrt(var_t) + eps), mu_t, var_t

    return override(ref, "sac", popart_step=popart_step)


@mutant("SAC-NCE-2", doc="InfoNCE without detaching the target encoder's positive and the queued negatives.",
        source=f"{V1} §4")
def nce_gradient_into_targets(ref):
    def info_nce(query, positive, negatives, *, tau=0.07):
        neg = negatives if negatives.dim() == 3 else negatives.unsqueeze(0).expand(query.shape[0], -1, -1)
        s_pos = (query * positive).sum(-1, keepdim=True) / tau
        s_neg = torch.einsum("bd,bkd->bk", query, neg) / tau
        return s_pos.squeeze(-1) - torch.logsumexp(torch.cat([s_pos, s_neg], -1), -1)

    return override(ref, "sac", info_nce=info_nce)


@mutant("SAC-CRITIC-1", doc="V1's squared-error critic loss in place of Huber.", source=f"{V1} §5")
def critic_mse(ref):
    def critic_loss(q1_taken, q2_taken, target, *, delta=1.0):
        y = target.detach()
        return ((q1_taken - y) ** 2 + (q2_taken - y) ** 2).mean()

    return override(ref, "sac", critic_loss=critic_loss)


@mutant("SAC-TEMP-3", doc="No clamp on alpha: the update may leave [1e-4, 2].")
def alpha_unclamped(ref):
    def temperature_update(log_alpha, entropy, target_entropy, *, lr, alpha_min=1e-4, alpha_max=2.0):
        return log_alpha.detach() + lr * (target_entropy - entropy).mean()

    return override(ref, "sac", temperature_update=temperature_update)


@mutant("SAC-LEGAL-1", doc="Legal set without the end-of-sequence token.")
def legal_set_without_eos(ref):
    def legal_set(compliance, *, eos_index, fallback, min_legal=3):
        out = ref.sac.legal_set(compliance, eos_index=eos_index, fallback=fallback, min_legal=min_legal)
        out[..., eos_index] = compliance[..., eos_index]
        return out

    return override(ref, "sac", legal_set=legal_set)


@mutant("SAC-SHAPE-1", doc="Shaping term Phi(s') - Phi(s) without the discount: not potential-based for gamma < 1.")
def shaping_without_gamma(ref):
    def shaped_reward(reward, phi_s, phi_next, done, *, gamma):
        return reward + (1.0 - done.to(reward.dtype)) * phi_next - phi_s

    return override(ref, "sac", shaped_reward=shaped_reward)
