"""TorchRL 0.14 behind the sac, ppo and ccapo contracts (``rlconform audit --impl
conformance_tests.adapters.torchrl:make``).

sac: ``DiscreteSACLoss`` over a ``ProbabilisticActor`` with ``MaskedCategorical`` (library defaults,
``neg_inf=-inf``) for ``losses`` and ``policy_loss_from_logits``; ``MaskedCategorical.entropy`` for
``entropy_from_logits``. ppo: ``ClipPPOLoss`` (``loss_critic_type="l2"``) for ``losses``;
``MaskedCategorical`` for the masked distribution ops (sampling under ``no_grad``); the functional ``generalized_advantage_estimate``
for ``gae``. ccapo: ``MCAdvantage(trajectory_return="sum")`` (GRPO group advantage) for
``macro_advantage``. Paths in comments are under ``site-packages/torchrl/``.
"""
from __future__ import annotations

import math
import types

from conformance_tests.adapters import distribution_ops, left_out, seed_only
from conformance_tests.adapters._tensordict import default_dtype, to_tensordict
from conformance_tests.errors import NotApplicable
from conformance_tests.modules import TableModule, TwinTable

CAPABILITIES = {
    "masks": True,  # modules/distributions/discrete.py:175 MaskedCategorical(logits, mask=...)
    "dtypes": ["float32", "float64"],  # float64 when built under that default dtype (buffers: torch.tensor(float))
    "train_dtype": "float32",  # what its collectors and losses run in: findings are also shown in it
    "terminated_truncated": True,  # objectives/value/functional.py:120 GAE(done, terminated); sac.py TD0 on terminated
    "conventions": {
        "mask_fill": "neg_inf",  # modules/distributions/discrete.py:240 neg_inf=-inf, :420 masked_fill; no eps-clip
        "huber_delta": "fixed_1",  # objectives/utils.py:332 distance_loss: F.smooth_l1_loss, no delta
        "target_entropy": "scalar",  # objectives/sac.py:1279-1287 one buffer, 0.98*log(A) or the number given
        "alpha_clamp": "on_read",  # objectives/sac.py _alpha: log_alpha.clamp(min_log_alpha, max_log_alpha) when read
        "value_loss_factor": 1.0,  # objectives/ppo.py:993 critic_coeff * distance_loss("l2"): MSE without 1/2
        "advantage_std": {"ddof": 1, "eps": 1e-6, "eps_mode": "clamp"},  # llm/grpo.py:1583 std().clamp_min(1e-6)
        "min_group_size": 2,  # llm/grpo.py:1166 trajectory_return requires grpo_size >= 2
    },
}

# The contract ops of the covered families (sac, ppo, ccapo) this adapter does not provide, and why.
LEFT_OUT = {
    **seed_only("sac", "ppo", "ccapo"),
    **left_out("computed inside DiscreteSACLoss.forward (objectives/sac.py) from its modules, not a function of "
               "its own: reached through sac.losses, sac.entropy_from_logits and sac.policy_loss_from_logits",
               "sac.masked_softmax", "sac.entropy", "sac.soft_value", "sac.soft_value_from_logits", "sac.critic_loss",
               "sac.policy_loss", "sac.critic_loss_total", "sac.policy_loss_total"),
    **left_out("no Top-p backup: DiscreteSACLoss takes the full expectation over actions",
               "sac.top_p_select", "sac.top_p_probs", "sac.top_p_soft_value", "sac.policy_loss_top_p"),
    "sac.target_entropy": "one number given to DiscreteSACLoss (sac.py:1279-1287), not a function of the legal mask",
    "sac.clamp_log_alpha": "alpha is clamped where it is read (sac.py _alpha; declared alpha_clamp on_read), never "
                           "log alpha itself",
    "sac.cql_penalty": "not adapted yet: DiscreteCQLLoss (objectives/cql.py:993) adds its penalty inside its own "
                       "Q-learning loss, not on given Q-values",
    "sac.bc_loss": "no behaviour-cloning term in DiscreteSACLoss",
    **left_out("not adapted yet: SoftUpdate (objectives/utils.py) steps a loss module's target parameters in place, "
               "not given tensors", "sac.soft_update", "sac.ema_update", "sac.init_target"),
    "sac.popart_step": "not adapted yet: PopArtValueNorm (modules/value_norm.py:120) normalises value targets, with "
                       "its own state, not the seed's reward statistics",
    "sac.update_step": "no SAC update loop: a TorchRL user writes it (loss, optimisers, SoftUpdate)",
    "ppo.masked_logits": "MaskedCategorical masks inside the distribution (-inf fill, discrete.py:420): reached through "
                         "masked_distribution",
    **left_out("computed inside ClipPPOLoss.forward (objectives/ppo.py:1587) from the actor's log-probs: reached "
               "through ppo.losses (its clip_fraction and kl_approx keys) and ppo.clipped_policy_loss",
               "ppo.ratio", "ppo.approx_kl", "ppo.k3_kl", "ppo.clip_fraction", "ppo.value_loss", "ppo.total_loss"),
    "ppo.normalize_advantages": "not adapted yet: ClipPPOLoss(normalize_advantage=True) standardises inside its "
                                "forward (ppo.py:1065), seen only through a loss value",
    "ppo.kl_early_stop": "no KL early stop: ClipPPOLoss computes losses, the user's loop decides when to stop",
    "ppo.scale_reward": "RewardScaling (envs/transforms) is an affine loc/scale without the seed's clip to [-1, 1]",
    "ppo.clip_grad_norm": "gradient clipping is torch.nn.utils.clip_grad_norm_ in the user's loop, not TorchRL code",
    **left_out("not adapted yet: MAPPOLoss (objectives/multiagent/mappo.py:83) has no (episode, timestep, agent) "
               "ordering of its own", "ppo.align_batch", "ppo.check_alignment"),
    "ppo.ppo_update": "no PPO update loop: a TorchRL user writes it around ClipPPOLoss",
    "ccapo.policy_loss": "not adapted yet: GRPOLoss (objectives/llm/grpo.py) needs an LLM wrapper as its actor",
    "ccapo.ccapo_update": "no CCAPO update loop in TorchRL",
}


def make() -> types.SimpleNamespace:
    import tensordict
    import torch
    import torchrl
    from tensordict.nn import TensorDictModule as Module
    from torchrl.modules import MaskedCategorical, ProbabilisticActor
    from torchrl.objectives import ClipPPOLoss, DiscreteSACLoss
    from torchrl.objectives.llm import MCAdvantage
    from torchrl.objectives.value.functional import generalized_advantage_estimate, td0_return_estimate

    class Rows(torch.nn.Module):  # row i of a live tensor for observation i (gradients reach the caller's tensor)
        def __init__(self, rows):
            super().__init__()
            self.rows = rows

        def forward(self, index):
            return self.rows[index.long()]

    def actor(policy):
        return ProbabilisticActor(Module(policy, ["observation"], ["logits"]), distribution_class=MaskedCategorical,
                                  in_keys={"logits": "logits", "mask": "action_mask"}, return_log_prob=True)

    def sac_losses(policy, critic, target_critic, batch, *, log_alpha, gamma, kappa=0.9, delta=1.0, top_p=1.0,
                   logits=None):
        if delta != 1.0 or top_p < 1.0:
            raise NotApplicable("smooth_l1 has no delta (utils.py:332); the backup is the full expectation")
        n_act = batch["legal_mask"].shape[-1]
        with default_dtype(log_alpha.dtype):  # buffers via torch.tensor(float): sac.py:1243, :1287
            critics = [Module(q, ["observation"], ["action_value"]) for q in critic.children()]
            loss = DiscreteSACLoss(actor(policy), critics, action_space="categorical", num_actions=n_act,
                                   target_entropy=kappa * math.log(n_act))
            loss.make_value_estimator(gamma=gamma)
        # DiscreteSACLoss keeps its own stacked copy of the twin critics and of their target
        # (common.py:503 convert_to_functional); tensordict's to_module (the library's functional call)
        # swaps in the suite's tables and log alpha for this call, so gradients reach them.
        params = tensordict.TensorDict.from_module(loss).clone(False)
        params["log_alpha"] = log_alpha
        params["qvalue_network_params", "module", "table"] = torch.stack([q.table for q in critic.children()])
        params["target_qvalue_network_params", "module", "table"] = torch.stack(
            [q.table for q in target_critic.children()]).detach()
        if logits is not None:  # the logits entry point: the caller's tensor is the policy's table
            params["actor_network_params", "module", "0", "module", "table"] = logits
        with params.to_module(loss):
            out = loss(to_tensordict(batch))
        return {k: out[k] for k in ("loss_actor", "loss_qvalue", "loss_alpha", "entropy", "alpha")}

    def policy_loss_from_logits(logits, q1, q2, legal_mask, *, alpha):
        rows = torch.arange(logits.shape[0])
        batch = {"obs": rows, "next_obs": rows, "action": torch.zeros_like(rows), "legal_mask": legal_mask,
                 "reward": torch.zeros(len(rows), dtype=logits.dtype), "done": torch.zeros(len(rows), dtype=torch.bool),
                 "next_legal_mask": legal_mask}  # only loss_actor is read: the rest is any valid batch
        twin = TwinTable(q1, q2)
        return sac_losses(TableModule(logits), twin, twin, batch, log_alpha=torch.tensor(math.log(alpha),
                          dtype=logits.dtype), gamma=0.5, logits=logits)["loss_actor"]

    def entropy_from_logits(logits, legal_mask):
        return MaskedCategorical(logits=logits, mask=legal_mask).entropy()

    def ppo_losses(actor_module, critic, batch, *, clip_eps=0.2, vf_coef=0.5, ent_coef=0.01):
        with default_dtype(batch["old_log_prob"].dtype):  # torch.tensor(clip_epsilon): ppo.py:1523
            loss = ClipPPOLoss(actor(actor_module), Module(critic, ["observation"], ["state_value"]),
                               clip_epsilon=clip_eps, entropy_coeff=ent_coef, critic_coeff=vf_coef,
                               loss_critic_type="l2")
        out = loss(to_tensordict(batch, old_log_prob=loss.tensor_keys.sample_log_prob))
        return {k: out[k] for k in ("loss_objective", "loss_critic", "loss_entropy", "entropy", "clip_fraction",
                                    "kl_approx")}

    def clipped_policy_loss(ratio, advantage, *, clip_eps):
        # ClipPPOLoss.forward (ppo.py:1587-1640): log_weight = log pi(a) - stored log-prob, clamped to
        # _clip_bounds = (log1p(-eps), log1p(eps)) (:1557-1565), loss -min(r A, clip(r) A), mean. A float clip_epsilon
        # is stored unvalidated (:1519-1524, "deliberately not validated"; only a tuple goes through
        # _validate_clip_epsilon, utils.py:1082). The ratio enters as the actor's log-prob: logits
        # [log r, log(K - r)] give log pi(0) = log r - log K with gradient 1/r; the stored log-prob is -log K.
        k = 2.0 * float(ratio.detach().abs().max()) + 1.0 if ratio.numel() else 1.0
        logits = torch.stack([torch.log(ratio), torch.log(k - ratio)], -1)
        with default_dtype(ratio.dtype):  # torch.tensor(clip_epsilon): ppo.py:1523
            loss = ClipPPOLoss(actor(Rows(logits)), None, clip_epsilon=clip_eps, entropy_bonus=False)
        n = ratio.shape[0] if ratio.dim() else 1
        batch = {"obs": torch.arange(n), "action": torch.zeros(n, dtype=torch.long),
                 "mask": torch.ones(n, 2, dtype=torch.bool), "advantage": advantage,
                 "old_log_prob": torch.full((n,), -math.log(k), dtype=ratio.dtype)}
        return loss(to_tensordict(batch, old_log_prob=loss.tensor_keys.sample_log_prob))["loss_objective"]

    def td_target(reward, done, next_value, *, gamma):
        # value/functional.py:418-456 td0_return_estimate, what TD0Estimator (DiscreteSACLoss's default estimator,
        # sac.py:1161) calls (advantages.py:1300): reward + gamma * (~terminated) * V', no check of gamma
        with default_dtype(reward.dtype):  # :455 gamma * int tensor: the default dtype
            return td0_return_estimate(gamma, next_value, reward, done.bool())

    def gae(reward, value, next_value, done, *, gamma, lam, truncated=None):
        done = done.bool()
        stop = done | (truncated.bool() if truncated is not None else torch.zeros_like(done))
        with default_dtype(value.dtype):  # functional.py:170 gamma * int tensor: default dtype
            adv, ret = generalized_advantage_estimate(gamma, lam, value.unsqueeze(-1), next_value.unsqueeze(-1),
                                                      reward.unsqueeze(-1), stop.unsqueeze(-1), done.unsqueeze(-1))
        return adv.squeeze(-1), ret.squeeze(-1)

    dist_ops = distribution_ops(lambda logits, mask: MaskedCategorical(logits=logits, mask=mask))

    def macro_advantage(returns, *, eps=1e-8):  # eps: TorchRL's clamp at 1e-6 is fixed (declared advantage_std)
        groups = returns.reshape(-1, returns.shape[-1])
        return torch.stack([group_advantage(row) for row in groups]).reshape(returns.shape)

    def group_advantage(returns):  # one 1-step trajectory per member: its reward is its return
        transform = MCAdvantage(grpo_size=len(returns), prompt_key="group", trajectory_return="sum")
        for r in returns:
            out = transform.inv(tensordict.TensorDict(group=torch.zeros(1), next=tensordict.TensorDict(
                reward=r.reshape(1, 1), done=torch.ones(1, 1, dtype=torch.bool), batch_size=[1]), batch_size=[1]))
        return out["advantage"].reshape(len(returns))

    def alpha_loss_module(log_alpha, target_entropy):
        """A DiscreteSACLoss whose log alpha is the caller's tensor (the same functional swap as above)."""
        tgt = target_entropy.reshape(-1)
        if tgt.numel() and not bool((tgt == tgt[0]).all()):
            raise NotApplicable("TorchRL's target entropy is one number for every state (sac.py:1279-1287)")
        with default_dtype(log_alpha.dtype):
            loss = DiscreteSACLoss(actor(TableModule(torch.zeros(1, 2))), [Module(TableModule(torch.zeros(1, 2)),
                                   ["observation"], ["action_value"])] * 2, action_space="categorical", num_actions=2,
                                   target_entropy=float(tgt[0]) if tgt.numel() else 0.0)
        params = tensordict.TensorDict.from_module(loss).clone(False)
        params["log_alpha"] = log_alpha
        return loss, params

    def temperature_loss(log_alpha, entropy, target_entropy):
        # DiscreteSACLoss.alpha_loss(log_prob) = -log_alpha * (log_prob + target_entropy), log_prob = -H per
        # state (sac.py:1500-1510); forward() takes its mean
        loss, params = alpha_loss_module(log_alpha, target_entropy)
        with params.to_module(loss):
            return loss.alpha_loss(-entropy).mean()

    def temperature_update(log_alpha, entropy, target_entropy, *, lr):
        # what a TorchRL user runs: an optimiser on the loss's log_alpha (SGD at lr, as SAC-TEMP-1 reads it);
        # TorchRL bounds alpha when it is read (min_alpha/max_alpha, sac.py _alpha), not log alpha itself
        la = log_alpha.detach().clone().requires_grad_(True)
        opt = torch.optim.SGD([la], lr=lr)
        opt.zero_grad()
        temperature_loss(la, entropy, target_entropy).backward()
        opt.step()
        return la.detach()

    sac = types.SimpleNamespace(losses=sac_losses, entropy_from_logits=entropy_from_logits,
                                policy_loss_from_logits=policy_loss_from_logits, temperature_loss=temperature_loss,
                                temperature_update=temperature_update, td_target=td_target)
    ppo = types.SimpleNamespace(losses=ppo_losses, gae=gae, clipped_policy_loss=clipped_policy_loss, **dist_ops)
    ccapo = types.SimpleNamespace(macro_advantage=macro_advantage)
    return types.SimpleNamespace(name="TorchRL", version=torchrl.__version__, capabilities=CAPABILITIES,
                                 sac=sac, ppo=ppo, ccapo=ccapo)
