"""verl's core algorithm functions behind the contract (``rlconform audit --impl
conformance_tests.adapters.verl:make``). Every call is to a public module function of
``verl.trainer.ppo.core_algos`` (line numbers below: verl 0.9.1).

ccapo.macro_advantage: ``compute_grpo_outcome_advantage`` (:268, one token per response);
ccapo.policy_loss: policy loss ``vanilla`` (:1286) + k3 ``kl_penalty`` (:2188), summed as verl's actor does
(``verl/workers/utils/losses.py:103-140``); isreshape.aggregate_loss: ``agg_loss`` (:1140);
isreshape.sapo_weight(_signed): the per-token gradient of policy loss ``sapo`` (:1623) in log π;
ppo.value_loss: ``compute_value_loss`` (:2125); ppo.gae: ``compute_gae_advantage_return`` (:216);
ppo.normalize_advantages: ``verl.utils.torch_functional.masked_whiten`` (:329), which whitens GAE's advantages
(core_algos.py:262), over an all-ones int64 response mask.
"""
from __future__ import annotations

import types

from conformance_tests.adapters import left_out, seed_only
from conformance_tests.errors import NotApplicable

# The contract ops of the covered families (ccapo, isreshape, ppo) this adapter does not provide, and why.
LEFT_OUT = {
    **seed_only("ccapo", "isreshape", "ppo"),
    "ccapo.ccapo_update": "verl's update runs in its FSDP/Megatron actor workers on a model: no update of given "
                          "tensors",
    "isreshape.importance_ratio": "computed inline in each policy loss (core_algos.py:1286): reached through "
                                  "ccapo.policy_loss",
    **left_out("SAPO's gate is inside the sapo loss: its weight is reached through isreshape.sapo_weight(_signed)",
               "isreshape.sapo_gate"),
    **left_out("verl's policies are language models over a vocabulary: no action masks and no masked distribution",
               "ppo.masked_logits", "ppo.masked_distribution", "ppo.sample_actions", "ppo.evaluate_actions"),
    **left_out("computed inside compute_policy_loss_vanilla (core_algos.py:1286) on token log-probs: reached "
               "through ccapo.policy_loss", "ppo.ratio", "ppo.approx_kl", "ppo.k3_kl", "ppo.clip_fraction",
               "ppo.clipped_policy_loss"),
    "ppo.total_loss": "the actor and the critic are separate workers with separate losses (no combined total)",
    "ppo.kl_early_stop": "no KL early stop in verl's actor",
    "ppo.scale_reward": "rewards come from reward functions or models, with no scale-and-clip op",
    "ppo.clip_grad_norm": "torch's clip_grad_norm_ inside the FSDP actor, not a function of verl's core algorithms",
    **left_out("no MAPPO (episode, timestep, agent) batches in verl", "ppo.align_batch", "ppo.check_alignment"),
    **left_out("verl's PPO update and its losses run in actor/critic workers on models, not on given modules",
               "ppo.ppo_update", "ppo.losses"),
}


def make() -> types.SimpleNamespace:
    import numpy as np
    import torch
    import verl
    from verl.trainer.ppo import core_algos as ca
    from verl.utils import torch_functional as verl_F
    from verl.workers.config import ActorConfig

    def config(**kw):  # rollout_n is required (ActorConfig.__post_init__); the rest are verl's defaults
        return ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, ppo_mini_batch_size=2,
                           use_dynamic_bsz=False, rollout_n=1, **kw)

    def macro_advantage(returns, *, eps=1e-8):  # eps: verl's own epsilon=1e-6 is the declared convention
        flat = returns.reshape(-1, returns.shape[-1])
        index = np.repeat(np.arange(flat.shape[0]), flat.shape[1])  # one group (uid) per row
        adv, _ = ca.compute_grpo_outcome_advantage(flat.reshape(-1, 1), torch.ones_like(flat.reshape(-1, 1)), index)
        return adv.reshape(returns.shape)

    def policy_loss(logp_new, logp_old, logp_ref, advantages, mask, *, clip_eps=0.2, beta_kl=0.04):
        # clip_ratio_low/high default to 0.2 (not None), so set all three; CCAPO: per trajectory, then batch
        cfg = config(clip_ratio=clip_eps, clip_ratio_low=clip_eps, clip_ratio_high=clip_eps)
        agg, m = "seq-mean-token-mean", mask.to(logp_new.dtype)
        # old/ref log-probs and advantages reach verl's losses as data: computed under torch.no_grad()
        # (workers/engine/base.py:147, core_algos.py:310) and shipped between workers as TensorDicts
        logp_old, logp_ref, advantages = logp_old.detach(), logp_ref.detach(), advantages.detach()
        pg, metrics = ca.get_policy_loss_fn("vanilla")(logp_old, logp_new, advantages, m, loss_agg_mode=agg,
                                                       config=cfg)
        kl = ca.agg_loss(ca.kl_penalty(logp_new, logp_ref, "low_var_kl"), m, agg)
        return {"loss": pg + beta_kl * kl, "loss_clip": pg, "loss_kl": beta_kl * kl, "kl_ref": kl,
                "approx_kl": torch.tensor(metrics["actor/ppo_kl"], dtype=logp_new.dtype),
                "clip_fraction": torch.tensor(metrics["actor/pg_clipfrac"], dtype=logp_new.dtype)}

    def aggregate_loss(loss_mat, mask, *, mode="token-mean"):
        return ca.agg_loss(loss_mat, mask.to(loss_mat.dtype), mode)

    def sapo_weight_signed(ratio, advantages, *, tau_pos, tau_neg):
        # SAPO's weight is, by definition, the factor on each token's log-prob gradient (ISR-SAPO-1); verl
        # exposes the loss only, so read the weight off its autograd gradient at A = ±1 (the sign picks τ).
        r = ratio.reshape(1, -1).detach()
        log_prob = torch.log(r).requires_grad_(True)
        sign = torch.where(advantages.reshape(1, -1) > 0, 1.0, -1.0).to(r.dtype)
        loss, _ = ca.get_policy_loss_fn("sapo")(torch.zeros_like(r), log_prob, sign, torch.ones_like(r),
                                                config=config(tau_pos=tau_pos, tau_neg=tau_neg))
        (grad,) = torch.autograd.grad(loss, log_prob)
        return (-grad * sign * (r.numel() + 1e-8)).reshape(ratio.shape)  # undo agg_loss's 1/(n + 1e-8), :1195

    def sapo_weight(ratio, *, tau=1.0):
        return sapo_weight_signed(ratio, torch.ones_like(ratio), tau_pos=tau, tau_neg=tau)

    def gae(reward, value, next_value, done, *, gamma, lam, truncated=None):
        r, v, nv, d = (x.reshape(-1, x.shape[-1]) for x in (reward, value, next_value, done))
        d, T = d.bool(), r.shape[-1]
        # verl reads V(s_{t+1}) from the next token and ends every row as a terminal (:244-262): one row per
        # episode segment, the last step's bootstrap folded into its reward (as SB3's collector does for
        # truncations, ppo_mask.py:251-260); rows whose next_value disagrees with the next value can't be told
        if not torch.equal(nv[:, :-1][~d[:, :-1]], v[:, 1:][~d[:, :-1]]):
            raise NotApplicable("verl takes V(s_{t+1}) from the next token: next_value must equal value[t+1]")
        ends = [(b, t) for b in range(r.shape[0]) for t in range(T) if d[b, t] or t == T - 1]
        segs = [(b, 0 if i == 0 or ends[i - 1][0] != b else ends[i - 1][1] + 1, t + 1) for i, (b, t) in enumerate(ends)]
        R, V, M = (torch.zeros(len(segs) + 1, T, dtype=r.dtype) for _ in range(3))
        M[-1, 0] = 1  # a spare token: masked_whiten (torch_functional.py:316-323) rejects a one-token batch
        for i, (b, s, e) in enumerate(segs):
            R[i, :e - s], V[i, :e - s], M[i, :e - s] = r[b, s:e], v[b, s:e], 1
            R[i, e - s - 1] += 0 if d[b, e - 1] else gamma * nv[b, e - 1]
        _, ret = ca.compute_gae_advantage_return(R, V, M, gamma, lam)
        # advantages come back whitened (:262); returns = raw advantages + values (:261), so A = returns - V
        out = torch.cat([ret[i, :e - s] for i, (b, s, e) in enumerate(segs)]).reshape(reward.shape)
        return out - value, out

    def normalize_advantages(advantage, *, eps=1e-8, clamp=None):
        # eps and clamp are pinned (capabilities): masked_whiten hard-codes (A - mean) * rsqrt(var + 1e-8), the
        # 1e-8 inside the square root (utils/torch_functional.py:343), and never clamps. Its var is Bessel-corrected
        # (masked_var unbiased=True, :311-325) and it raises on a one-element mask (:322-323). verl's response masks
        # are int64 (get_response_mask(..., dtype=torch.int64), :349; attention masks): the same mask dtype here.
        return verl_F.masked_whiten(advantage, torch.ones_like(advantage, dtype=torch.int64))

    def value_loss(values, returns):
        # old values = the predictions themselves, so verl's always-on value clipping (:2171) is inactive
        loss, _ = ca.compute_value_loss(values, returns, values.detach(), torch.ones_like(values),
                                        cliprange_value=0.5)
        return loss

    capabilities = {
        "masks": True, "dtypes": ["float32", "float64"], "terminated_truncated": False,
        "train_dtype": "float32",  # its actor computes log-probs and losses in float32 (bf16 weights)
        # advantages are computed under torch.no_grad() (:244, :310); losses are differentiable
        "differentiable": ["ccapo.policy_loss", "isreshape.aggregate_loss", "ppo.value_loss"],
        # masked_whiten: 1e-8 inside the sqrt, no clamp (torch_functional.py:343); the contract's defaults are
        # eps=1e-8 (added to the std) and clamp=None, so only the place of the eps can show, as a PPO-ADV-1 difference:
        # no eps_mode of the advantage_std convention (add, clamp) takes the eps inside the sqrt
        "pinned": {"ppo.normalize_advantages": {"eps": 1e-8, "clamp": None}},
        "conventions": {
            "advantage_std": {"ddof": 1, "eps": 1e-6, "eps_mode": "add"},  # GRPO's torch.std + epsilon (:321, :326)
            "clip_fraction": "active_clips",  # pg_clipfrac = mean(pg_losses2 > pg_losses1), :1353
            "min_group_size": "raw",  # a one-member group gets mean 0, std 1 (:315-317): its raw score
            "kl_clamp": {"log_ratio": 20, "value": 10},  # low_var_kl clamps (:2242-2245)
        },
        # masked_whiten (ppo.normalize_advantages) follows another std than GRPO: Bessel-corrected, eps 1e-8
        # (torch_functional.py:311-325, :343), the seed's choice for these clauses apart from where the eps sits
        "conventions_by_clause": {c: {"advantage_std": {"ddof": 1, "eps": 1e-8, "eps_mode": "add"}}
                                  for c in ("PPO-ADV-1", "PPO-ADV-2", "PPO-DEFAULT-3")},
    }
    return types.SimpleNamespace(
        name="verl core_algos", version=verl.__version__, capabilities=capabilities,
        ccapo=types.SimpleNamespace(macro_advantage=macro_advantage, policy_loss=policy_loss),
        isreshape=types.SimpleNamespace(aggregate_loss=aggregate_loss, sapo_weight=sapo_weight,
                                        sapo_weight_signed=sapo_weight_signed),
        ppo=types.SimpleNamespace(gae=gae, value_loss=value_loss, normalize_advantages=normalize_advantages))
