"""Mutants of the sac family: V1's superseded rules and the bugs the V2 document warns about.

Each replaces one reference operation; most reuse the reference for everything but the bug.
"""
from __future__ import annotations

import math

import torch

from conformance_tests.mutants import deaf_to, mutant, override
from reference_impl.sac.step import make_update_step

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


# ----------------------------------------------------------------------------- clauses on points the seed document leaves open
@mutant("SAC-CQL-1", doc="CQL log-sum-exp over every action, illegal ones included (the legal mask is ignored).",
        source="000 §8 logsumexp_q(phi, o) read literally")
def cql_over_all_actions(ref):
    def cql_penalty(q_all, actions, *, lam=0.5, legal_mask=None):
        return ref.sac.cql_penalty(q_all, actions, lam=lam)

    return override(ref, "sac", cql_penalty=cql_penalty)


@mutant("SAC-CRITIC-2", doc="Total critic loss with the CQL term of the first critic only.")
def cql_on_one_critic(ref):
    def critic_loss_total(q1_all, q2_all, actions, target, *, legal_mask=None, delta=1.0, lam_cql=0.5, use_cql=True):
        base = ref.sac.critic_loss_total(q1_all, q2_all, actions, target, legal_mask=legal_mask, delta=delta,
                                         use_cql=False)
        return base + (ref.sac.cql_penalty(q1_all, actions, lam=lam_cql, legal_mask=legal_mask) if use_cql else 0.0)

    return override(ref, "sac", critic_loss_total=critic_loss_total)


@mutant("SAC-POL-3", doc="Total policy loss without the BC term (L_pi alone).")
def policy_total_without_bc(ref):
    def policy_loss_total(probs, q1, q2, legal_mask, actions, is_demo, *, alpha, lam_bc=0.1, p=None):
        return ref.sac.policy_loss_total(probs, q1, q2, legal_mask, actions, is_demo, alpha=alpha, lam_bc=0.0, p=p)

    return override(ref, "sac", policy_loss_total=policy_loss_total)


@mutant("SAC-STEP-1", doc="Policy step before the critic step: the policy learns against the stale critics.")
def policy_step_before_critic_step(ref):
    return override(ref, "sac", update_step=make_update_step(("policy", "critic", "temperature", "target")))


@mutant("SAC-STEP-1", doc="Target critics soft-updated before the critic step (and its TD target).")
def target_update_first(ref):
    return override(ref, "sac", update_step=make_update_step(("target", "critic", "policy", "temperature")))


@mutant("SAC-GRAD-1", doc="No gradient clipping (the 0.5 bound ignored).")
def no_gradient_clipping(ref):
    def update_step(*args, grad_clip=0.5, **kw):
        return ref.sac.update_step(*args, grad_clip=float("inf"), **kw)

    return override(ref, "sac", update_step=update_step)


@mutant("SAC-TARGET-2", doc="Target critics freshly initialised instead of copied from the online critics.")
def target_not_copied(ref):
    def init_target(critic):
        target = ref.sac.init_target(critic)
        with torch.no_grad():
            for p in target.parameters():
                p.add_(torch.randn_like(p))
        return target

    return override(ref, "sac", init_target=init_target)


@mutant("SAC-NCE-4", doc="Negative queue that keeps the oldest keys and drops the new ones once full.")
def queue_keeps_oldest(ref):
    def nce_queue_push(queue, keys, *, capacity):
        return torch.cat([queue.detach(), keys.detach().to(queue.dtype)], 0)[:capacity]

    return override(ref, "sac", nce_queue_push=nce_queue_push)


# ----------------------------------------------------------------------------- Top-p boundary rules
def _ranked_select(probs, legal_mask, p, *, higher_id_first=False, keep=lambda before, upto, p: before < p):
    """A plain Top-p selection with the rule's knobs exposed: tie order and the keep test."""
    flip = (lambda t: t.flip(-1)) if higher_id_first else (lambda t: t)
    pi, legal = flip(torch.where(legal_mask, probs.detach(), torch.zeros_like(probs)).double()), flip(legal_mask)
    ranked, order = torch.sort(pi, dim=-1, descending=True, stable=True)
    upto = torch.cumsum(ranked, dim=-1)
    before = torch.cat([torch.zeros_like(upto[..., :1]), upto[..., :-1]], dim=-1)
    kept = keep(before, upto, p) & torch.gather(legal, -1, order)
    return flip(torch.zeros_like(legal).scatter(-1, order, kept))


def _override_top_p(ref, select):
    """Replace the Top-p selection, and the Top-p soft value built on it."""
    def top_p_soft_value(probs, q1, q2, legal_mask, *, alpha, p):
        sel = select(probs, legal_mask, p=p)
        return ref.sac.soft_value(ref.sac.top_p_probs(probs, sel), q1, q2, sel, alpha=alpha)

    return override(ref, "sac", top_p_select=select, top_p_soft_value=top_p_soft_value)


@mutant("SAC-TOPP-1", "SAC-TOPP-3", doc="Keeps an action while the mass before it is <= p: on an exact hit of p "
        "the next action joins the set (not minimal).")
def top_p_keeps_past_exact_hit(ref):
    return _override_top_p(ref, lambda probs, legal_mask, *, p: _ranked_select(
        probs, legal_mask, p, keep=lambda before, upto, p: (before <= p) if p < 1 else before < 2.0))


@mutant("SAC-TOPP-1", "SAC-TOPP-3", doc="Keeps an action only while the mass including it is below p: the action "
        "that reaches p is dropped (a set short of p, empty when one action holds p).")
def top_p_drops_the_action_reaching_p(ref):
    return _override_top_p(ref, lambda probs, legal_mask, *, p: _ranked_select(
        probs, legal_mask, p, keep=lambda before, upto, p: upto < p))


@mutant("SAC-TOPP-1", "SAC-TOPP-3", doc="Ties at the Top-p boundary broken by higher action id first.")
def top_p_ties_by_higher_id(ref):
    return _override_top_p(ref, lambda probs, legal_mask, *, p: _ranked_select(
        probs, legal_mask, p, higher_id_first=True))


@mutant("SAC-TOPP-1", "SAC-TOPP-3", doc="p = 1 read literally on clipped rows: once the ε-clipped legal mass reaches "
        "1 the remaining legal actions are dropped instead of keeping the whole legal set.")
def top_p_one_drops_clipped_tail(ref):
    return _override_top_p(ref, lambda probs, legal_mask, *, p: _ranked_select(probs, legal_mask, p))


@mutant("SAC-TOPP-1", doc="A 256-candidate fast path (the old reference's): torch.topk picks the "
        "candidates, so among tied actions at the cut it may keep higher ids than the lower-id rule.")
def top_p_fast_path_without_tie_rule(ref):
    def select(probs, legal_mask, *, p, candidates=256):
        pi = torch.where(legal_mask, probs.detach(), torch.zeros_like(probs))
        if p < 1.0 and pi.shape[-1] > candidates:
            top = pi.topk(candidates, dim=-1)
            if bool((top.values[..., :-1].sum(-1) >= p).all()):
                idx = top.indices.sort(dim=-1).values
                sub = ref.sac.top_p_select(pi.gather(-1, idx), legal_mask.gather(-1, idx), p=p)
                return torch.zeros_like(legal_mask).scatter(-1, idx, sub)
        return ref.sac.top_p_select(probs, legal_mask, p=p)

    return _override_top_p(ref, select)


# ----------------------------------------------------------------------------- suite-strength classes
@mutant("SAC-MASK-2", doc="Keyword not forwarded: the masked softmax always clips at the default 1e-8, "
        "whatever eps the caller passes.", source="the reference's own floor max(eps, 1e-8) in an earlier version")
def softmax_ignores_eps(ref):
    base = ref.sac.masked_softmax

    def masked_softmax(logits, legal_mask, *, eps=1e-8):
        return base(logits, legal_mask)

    return override(ref, "sac", masked_softmax=masked_softmax)


@mutant("SAC-DTYPE-1", "SAC-CRITIC-1", doc="The critic loss is reduced in float32 whatever the Q dtype.",
        source="a Huber loss from a float32-only fused kernel")
def critic_loss_in_float32(ref):
    base = ref.sac.critic_loss

    def critic_loss(q1_taken, q2_taken, target, *, delta=1.0):
        return base(q1_taken.float(), q2_taken.float(), target.float(), delta=delta)

    return override(ref, "sac", critic_loss=critic_loss)


# ----------------------------------------------------------------------------- library-level ops
def _neg_inf_policy(logits, legal_mask):
    """π and log π of a -inf fill, with sums taken over every action (0·(−inf) = NaN at illegal ones)."""
    log_pi = torch.log_softmax(logits.masked_fill(~legal_mask, float("-inf")), dim=-1)
    return log_pi.exp(), log_pi


@mutant("SAC-ENT-3", "SAC-V-2", "SAC-POL-4", doc="Logits entry points with a -inf fill and sums over every action: "
        "NaN as soon as a row has an illegal action.", source="TorchRL 0.14 DiscreteSACLoss with MaskedCategorical")
def logits_ops_neg_inf_unmasked(ref):
    def entropy_from_logits(logits, legal_mask):
        p, log_p = _neg_inf_policy(logits, legal_mask)
        return -(p * log_p).sum(-1)

    def soft_value_from_logits(logits, q1, q2, legal_mask, *, alpha):
        p, log_p = _neg_inf_policy(logits, legal_mask)
        return (p * (torch.minimum(q1, q2) - alpha * log_p)).sum(-1)

    def policy_loss_from_logits(logits, q1, q2, legal_mask, *, alpha):
        p, log_p = _neg_inf_policy(logits, legal_mask)
        return (p * (alpha * log_p - torch.minimum(q1, q2).detach())).sum(-1).mean()

    return override(ref, "sac", entropy_from_logits=entropy_from_logits, soft_value_from_logits=soft_value_from_logits,
                    policy_loss_from_logits=policy_loss_from_logits)


@mutant("SAC-LOSSES-1", doc="Loss level with a -inf fill: loss_actor, loss_alpha and entropy are NaN with any "
        "illegal action (the target guards p = 0, the actor path does not).",
        source="TorchRL 0.14.1 objectives/sac.py:1547 (docs/audits/_research/torchrl.md, finding 1)")
def losses_neg_inf_actor(ref):
    def losses(policy, critic, target_critic, batch, *, log_alpha, gamma, kappa=0.9, delta=1.0, top_p=1.0):
        out = dict(ref.sac.losses(policy, critic, target_critic, batch, log_alpha=log_alpha, gamma=gamma, kappa=kappa,
                                  delta=delta, top_p=top_p))
        p, log_p = _neg_inf_policy(policy(batch["obs"]), batch["legal_mask"])
        q1, q2 = critic(batch["obs"])
        h = -(p * log_p).sum(-1)
        out["loss_actor"] = (p * (log_alpha.detach().exp() * log_p - torch.minimum(q1, q2).detach())).sum(-1).mean()
        out["loss_alpha"] = out["loss_alpha"] + 0.0 * h.detach().mean()
        out["entropy"] = h.detach().mean()
        return out

    return override(ref, "sac", losses=losses)


@mutant("SAC-LOSSES-1", doc="The TD target bootstraps from the online critics instead of the target critics.")
def losses_target_from_online_critic(ref):
    def losses(policy, critic, target_critic, batch, *, log_alpha, gamma, kappa=0.9, delta=1.0, top_p=1.0):
        return ref.sac.losses(policy, critic, critic, batch, log_alpha=log_alpha, gamma=gamma, kappa=kappa,
                              delta=delta, top_p=top_p)

    return override(ref, "sac", losses=losses)


@mutant("SAC-LOSSES-2", doc="The actor loss keeps the critics in the graph: the same value, but its gradient also "
        "moves the critics (toward larger Q under the policy).")
def losses_actor_gradient_into_critic(ref):
    def losses(policy, critic, target_critic, batch, *, log_alpha, gamma, kappa=0.9, delta=1.0, top_p=1.0):
        out = dict(ref.sac.losses(policy, critic, target_critic, batch, log_alpha=log_alpha, gamma=gamma, kappa=kappa,
                                  delta=delta, top_p=top_p))
        legal = batch["legal_mask"]
        pi = ref.sac.masked_softmax(policy(batch["obs"]), legal).detach()
        q_min = torch.minimum(*critic(batch["obs"]))
        leak = torch.where(legal, pi * (q_min - q_min.detach()), torch.zeros_like(pi)).sum(-1).mean()  # value 0
        out["loss_actor"] = out["loss_actor"] - leak
        return out

    return override(ref, "sac", losses=losses)


# ----------------------------------------------------------------------------- side effects on the caller's state
@mutant("SAC-LOSSES-1", doc="The loss-level op calls backward itself: gradients are left in the modules' .grad, and "
        "the caller's own backward doubles every one of them.", source="a library loss that also steps")
def losses_call_backward(ref):
    def losses(policy, critic, target_critic, batch, *, log_alpha, gamma, kappa=0.9, delta=1.0, top_p=1.0):
        out = ref.sac.losses(policy, critic, target_critic, batch, log_alpha=log_alpha, gamma=gamma, kappa=kappa,
                             delta=delta, top_p=top_p)
        (out["loss_actor"] + out["loss_qvalue"]).backward(retain_graph=True)
        return out

    return override(ref, "sac", losses=losses)


@mutant("SAC-TEMP-3", doc="The update clamps a copy of log alpha: the optimiser steps the caller's temperature, "
        "the clamp never reaches it, and alpha leaves [1e-4, 2].", source="a clamp applied to a clone")
def update_clamps_a_copy_of_log_alpha(ref):
    def update_step(policy, critic, target, log_alpha, optimizers, batch, **hp):
        return ref.sac.update_step(policy, critic, target, log_alpha.clone(), optimizers, batch, **hp)

    return override(ref, "sac", update_step=update_step)


# ----------------------------------------------------------------------------- mechanisms past a threshold
@mutant("SAC-TEMP-1", doc="The update also clips the temperature's gradient at the networks' bound (0.5): a large "
        "entropy gap moves log alpha by at most lr·0.5.", source="one clip_grad_norm_ over every optimiser's parameters")
def temperature_gradient_clipped(ref):
    def update_step(policy, critic, target, log_alpha, optimizers, batch, **hp):
        opt, step = optimizers["alpha"], optimizers["alpha"].step

        def clipped_step(*a, **k):
            torch.nn.utils.clip_grad_norm_([log_alpha], hp.get("grad_clip", 0.5))
            return step(*a, **k)

        opt.step = clipped_step
        try:
            return ref.sac.update_step(policy, critic, target, log_alpha, optimizers, batch, **hp)
        finally:
            del opt.step

    return override(ref, "sac", update_step=update_step)


@mutant("SAC-MASK-1", doc="A float32 fast path for float64 logits above 1024 actions: a large vocabulary loses "
        "float64 precision.", source="a vocabulary-size switch to a float32 kernel")
def masked_softmax_float32_for_large_vocabularies(ref):
    base = ref.sac.masked_softmax

    def masked_softmax(logits, legal_mask, *, eps=1e-8):
        if logits.shape[-1] > 1024 and logits.dtype == torch.float64:
            return base(logits.float(), legal_mask, eps=eps).double()
        return base(logits, legal_mask, eps=eps)

    return override(ref, "sac", masked_softmax=masked_softmax)


# Keywords accepted but never plumbed through: each is right at its default, which is all a test that only
# ever passes the default sees.
@mutant("SAC-POL-2", doc="update_step ignores policy_use_topp: the policy step is always option A.",
        source="a keyword accepted by the update but not passed to the policy loss")
def update_step_ignores_policy_use_topp(ref):
    return deaf_to(ref, "sac", "update_step", policy_use_topp=False)


@mutant("SAC-STEP-1", doc="update_step ignores lambda_cql and huber_delta: the critic loss keeps 0.5 and 1.0.",
        source="a critic loss called with its own defaults")
def update_step_ignores_critic_coefficients(ref):
    return deaf_to(ref, "sac", "update_step", lambda_cql=0.5, huber_delta=1.0)


@mutant("SAC-TEMP-3", doc="The temperature clamp ignores the caller's range: alpha is kept in [1e-4, 2] whatever "
        "alpha_min and alpha_max say (update_step and clamp_log_alpha).", source="a clamp with literal bounds")
def alpha_clamp_ignores_its_range(ref):
    deaf = deaf_to(ref, "sac", "update_step", alpha_min=1e-4, alpha_max=2.0)
    return deaf_to(deaf, "sac", "clamp_log_alpha", alpha_min=1e-4, alpha_max=2.0)


@mutant("SAC-REWARD-1", doc="step_reward ignores its weights: the document's 1, 0.5, 0.1 and 2 whatever is passed.",
        source="a reward written with literal coefficients")
def step_reward_ignores_its_weights(ref):
    return deaf_to(ref, "sac", "step_reward", lam_cov=1.0, lam_nce=0.5, lam_gar=0.1, lam_ill=2.0)



# ----------------------------------------------------------------------------- a detach in the wrong place
# Each keeps every value and loses (or adds) a gradient: only a gradient check at the op level sees it.
@mutant("SAC-POL-3", doc="Total policy loss whose BC term scores log of the detached probabilities: the right value, "
        "and the demo rows never pull the policy toward the teacher.")
def policy_total_bc_detached(ref):
    def policy_loss_total(probs, q1, q2, legal_mask, actions, is_demo, *, alpha, lam_bc=0.1, p=None):
        base = ref.sac.policy_loss_total(probs, q1, q2, legal_mask, actions, is_demo, alpha=alpha, lam_bc=0.0, p=p)
        return base + ref.sac.bc_loss(torch.log(probs.detach()), actions, is_demo, lam=lam_bc)

    return override(ref, "sac", policy_loss_total=policy_loss_total)


@mutant("SAC-BC-1", doc="BC loss on detached log-probabilities: the right value, no gradient.")
def bc_loss_detached(ref):
    def bc_loss(log_probs, actions, is_demo, *, lam=0.1):
        return ref.sac.bc_loss(log_probs.detach(), actions, is_demo, lam=lam) + 0.0 * log_probs.sum()

    return override(ref, "sac", bc_loss=bc_loss)


@mutant("SAC-CRITIC-2", doc="Total critic loss whose CQL term of critic 2 reads detached Q: the right value, and "
        "critic 2 is never pushed down on unseen actions.")
def cql_second_critic_detached(ref):
    def critic_loss_total(q1_all, q2_all, actions, target, *, legal_mask=None, delta=1.0, lam_cql=0.5, use_cql=True):
        base = ref.sac.critic_loss_total(q1_all, q2_all, actions, target, legal_mask=legal_mask, delta=delta,
                                         use_cql=False)
        if not use_cql:
            return base
        return (base + ref.sac.cql_penalty(q1_all, actions, lam=lam_cql, legal_mask=legal_mask)
                + ref.sac.cql_penalty(q2_all.detach(), actions, lam=lam_cql, legal_mask=legal_mask))

    return override(ref, "sac", critic_loss_total=critic_loss_total)


@mutant("SAC-CRITIC-1", doc="Critic loss with critic 2's Q detached: the right value, and critic 2 never trains.")
def critic_loss_second_critic_detached(ref):
    def critic_loss(q1_taken, q2_taken, target, *, delta=1.0):
        return ref.sac.critic_loss(q1_taken, q2_taken.detach(), target, delta=delta) + 0.0 * q2_taken.sum()

    return override(ref, "sac", critic_loss=critic_loss)


@mutant("SAC-TOPP-2", doc="pi_p renormalised by a detached sum: the right value, the gradient of pi restricted "
        "to the set instead of pi_p's.")
def top_p_probs_detached_normaliser(ref):
    def top_p_probs(probs, selected):
        kept = torch.where(selected, probs, torch.zeros_like(probs))
        return kept / kept.sum(-1, keepdim=True).detach()

    return override(ref, "sac", top_p_probs=top_p_probs)


def _nce(query, positive, negatives, tau, *, detach_queue=True, detach_query_in_negatives=False):
    """InfoNCE written out, with two detaches of the shared-queue path ([K,d] negatives) exposed."""
    if negatives.dim() == 2:
        neg = (negatives.detach() if detach_queue else negatives).unsqueeze(0).expand(query.shape[0], -1, -1)
    else:
        neg = negatives.detach()
    s_pos = (query * positive.detach()).sum(-1, keepdim=True) / tau
    q_neg = query.detach() if detach_query_in_negatives and negatives.dim() == 2 else query
    s_neg = torch.einsum("bd,bkd->bk", q_neg, neg) / tau
    return s_pos.squeeze(-1) - torch.logsumexp(torch.cat([s_pos, s_neg], -1), -1)


@mutant("SAC-NCE-2", doc="InfoNCE detaches per-row negatives [B,K,d] but not a shared queue [K,d]: the queued keys "
        "receive gradient.")
def nce_shared_queue_not_detached(ref):
    def info_nce(query, positive, negatives, *, tau=0.07):
        return _nce(query, positive, negatives, tau, detach_queue=False)

    return override(ref, "sac", info_nce=info_nce)


@mutant("SAC-NCE-2", doc="InfoNCE with a shared queue scores the negatives with a detached query: the right value, "
        "and the query is never pushed away from the negatives.")
def nce_query_detached_against_the_queue(ref):
    def info_nce(query, positive, negatives, *, tau=0.07):
        return _nce(query, positive, negatives, tau, detach_query_in_negatives=True)

    return override(ref, "sac", info_nce=info_nce)


# ----------------------------------------------------------------------------- boundaries past the drawn inputs
@mutant("SAC-MASK-3", doc="The shift is the max over every logit, illegal ones included: a huge illegal logit "
        "pushes the legal ones to where half precision cannot tell them apart.")
def masked_softmax_shifts_by_the_max_of_all_logits(ref):
    def masked_softmax(logits, legal_mask, *, eps=1e-8):
        return ref.sac.masked_softmax(logits - logits.max(-1, keepdim=True).values, legal_mask, eps=eps)

    return override(ref, "sac", masked_softmax=masked_softmax)


@mutant("SAC-ENT-1", doc="The legal count kept in 8 bits: it wraps at 256 legal actions (log 0 = -inf).",
        source="a mask summed in its uint8 storage dtype")
def target_entropy_counts_in_uint8(ref):
    def target_entropy(legal_mask, *, kappa=0.9):
        out = ref.sac.target_entropy(legal_mask, kappa=kappa)
        count = legal_mask.to(torch.uint8).sum(-1, dtype=torch.uint8)
        return kappa * torch.log(count.to(out.dtype))

    return override(ref, "sac", target_entropy=target_entropy)


@mutant("SAC-LEGAL-2", doc="The legal count kept in 8 bits: a row of 256 or 258 legal actions looks like 0 or 2 and "
        "is replaced by the fallback.", source="a mask summed in its uint8 storage dtype")
def legal_set_counts_in_uint8(ref):
    def legal_set(compliance, *, eos_index, fallback, min_legal=3):
        ref.sac.legal_set(compliance, eos_index=eos_index, fallback=fallback, min_legal=min_legal)  # its checks
        legal, fb = compliance.clone(), fallback.expand_as(compliance).clone()
        legal[..., eos_index] = fb[..., eos_index] = True
        too_few = legal.to(torch.uint8).sum(-1, keepdim=True, dtype=torch.uint8) < min_legal
        return torch.where(too_few, fb, legal)

    return override(ref, "sac", legal_set=legal_set)


@mutant("SAC-TOPP-1", doc="Top-p decided on float32 copies of float64 rows: a boundary decided by 5e-13 goes the "
        "wrong way.", source="a float32 sort-and-cumsum kernel")
def top_p_in_float32(ref):
    return _override_top_p(ref, lambda probs, legal_mask, *, p: ref.sac.top_p_select(probs.float(), legal_mask, p=p))


@mutant("SAC-TOPP-1", doc="p within 1e-6 of 1 read as p = 1: the whole legal set instead of the smallest one "
        "reaching p.", source="an isclose(p, 1) shortcut")
def top_p_near_one_is_one(ref):
    def select(probs, legal_mask, *, p):
        return ref.sac.top_p_select(probs, legal_mask, p=1.0 if p >= 1.0 - 1e-6 else p)

    return _override_top_p(ref, select)


def _select_on_all_actions(ref, probs, legal_mask, p):
    """Top-p chosen on the raw distribution, then intersected with the legal set (the whole legal set if empty)."""
    sel = ref.sac.top_p_select(probs, torch.ones_like(legal_mask), p=p) & legal_mask
    return torch.where(sel.any(-1, keepdim=True), sel, legal_mask)


@mutant("SAC-POL-2", doc="Option B picks its Top-p set counting illegal mass: an illegal action holding mass takes "
        "the set's place.")
def top_p_policy_loss_counts_illegal_mass(ref):
    def policy_loss_top_p(probs, q1, q2, legal_mask, *, alpha, p):
        sel = _select_on_all_actions(ref, probs, legal_mask, p)
        return ref.sac.policy_loss(ref.sac.top_p_probs(probs, sel), q1, q2, sel, alpha=alpha)

    return override(ref, "sac", policy_loss_top_p=policy_loss_top_p)


@mutant("SAC-TOPP-3", doc="The Top-p soft value picks its set counting illegal mass.")
def top_p_soft_value_counts_illegal_mass(ref):
    def top_p_soft_value(probs, q1, q2, legal_mask, *, alpha, p):
        sel = _select_on_all_actions(ref, probs, legal_mask, p)
        return ref.sac.soft_value(ref.sac.top_p_probs(probs, sel), q1, q2, sel, alpha=alpha)

    return override(ref, "sac", top_p_soft_value=top_p_soft_value)


@mutant("SAC-LOSSES-1", doc="With top_p < 1 the loss-level op also trains the actor on option B: the backup's Top-p "
        "leaks into loss_actor, which SAC-LOSSES-1 keeps at SAC-POL-1.")
def losses_actor_follows_the_backups_top_p(ref):
    def losses(policy, critic, target_critic, batch, *, log_alpha, gamma, kappa=0.9, delta=1.0, top_p=1.0):
        out = dict(ref.sac.losses(policy, critic, target_critic, batch, log_alpha=log_alpha, gamma=gamma, kappa=kappa,
                                  delta=delta, top_p=top_p))
        if top_p < 1.0:
            pi = ref.sac.masked_softmax(policy(batch["obs"]), batch["legal_mask"])
            q1, q2 = critic(batch["obs"])
            out["loss_actor"] = ref.sac.policy_loss_top_p(pi, q1.detach(), q2.detach(), batch["legal_mask"],
                                                          alpha=float(log_alpha.detach().exp()), p=top_p)
        return out

    return override(ref, "sac", losses=losses)


@mutant("SAC-TEACHER-1", doc="Relabelling reads the distance column d(a, a*) instead of the row d(a*, a): wrong "
        "on an asymmetric distance.", source="a transposed distance matrix")
def relabel_reads_the_distance_column(ref):
    def resolve_teacher_action(teacher_action, legal_mask, *, mode="reject", distance=None):
        return ref.sac.resolve_teacher_action(teacher_action, legal_mask, mode=mode,
                                              distance=None if distance is None else distance.transpose(0, 1))

    return override(ref, "sac", resolve_teacher_action=resolve_teacher_action)
