"""TorchRL 0.14 behind the sac, ppo and ccapo contracts (``rlconform audit --impl
conformance_tests.adapters.torchrl:make``).

sac: ``DiscreteSACLoss`` over a ``ProbabilisticActor`` with ``MaskedCategorical`` (library defaults,
``neg_inf=-inf``) for ``losses`` and ``policy_loss_from_logits``; ``MaskedCategorical.entropy`` for
``entropy_from_logits``; ``SoftUpdate`` on a loss module's target parameters for ``soft_update``,
``ema_update`` and ``init_target``; ``DiscreteCQLLoss`` (its ``loss_cql``) for ``cql_penalty``.
ppo: ``ClipPPOLoss`` (``loss_critic_type="l2"``) for ``losses``; ``MaskedCategorical`` for the masked
distribution ops (sampling under ``no_grad``); the functional ``generalized_advantage_estimate`` for
``gae``; ``ClipPPOLoss(normalize_advantage=True)`` at ratio 1 for ``normalize_advantages``.
ccapo: ``MCAdvantage(trajectory_return="sum")`` (GRPO group advantage) for ``macro_advantage``;
``GRPOLoss`` (``aggregation="prompt_mean"``, KL to the reference) for ``policy_loss``.
Paths in comments are under ``site-packages/torchrl/``.
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
    "pinned": {
        # DiscreteCQLLoss takes no weight for its CQL term (objectives/cql.py:1131-1140): loss_cql is
        # logsumexp(Q) - Q(a), mean (:1346-1356), returned beside loss_qvalue for the user to add (:1317-1321),
        # a weight of 1 (the continuous CQLLoss has min_q_weight, :291; the discrete one none)
        "sac.cql_penalty": {"lam": 1.0},
        # ClipPPOLoss(normalize_advantage=True) standardises with _standardize's eps, torch.finfo(float).resolution
        # = 1e-6 (_utils.py:1247, clamp of the std :1263; declared advantage_std), which no argument sets, and
        # clamps nothing afterwards (objectives/ppo.py:1065-1085)
        "ppo.normalize_advantages": {"eps": 1e-6, "clamp": None},
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
    "sac.bc_loss": "no behaviour-cloning term in DiscreteSACLoss",
    "sac.popart_step": "PopArtValueNorm (modules/value_norm.py:120) is the PopArt paper's normaliser: EMAs of the "
                       "mean and of the mean of squares, debiased, var = E[x^2] - mean^2 clamped at epsilon "
                       "(:165-185), x normalised by sqrt(var) (:189). Its variance step is (1-b)var + b(1-b)(x-mu)^2, "
                       "not the seed's (1-b)var + b(x-mu_t)^2 (mu=0, var=1, b=0.5, x=2: 1.5 against 1.0), and no "
                       "convention declares that estimator",
    "sac.update_step": "no SAC update loop: a TorchRL user writes it (loss, optimisers, SoftUpdate)",
    "ppo.masked_logits": "MaskedCategorical masks inside the distribution (-inf fill, discrete.py:420): reached "
                         "through masked_distribution",
    **left_out("computed inside ClipPPOLoss.forward (objectives/ppo.py:1587) from the actor's log-probs: reached "
               "through ppo.losses (its clip_fraction and kl_approx keys) and ppo.clipped_policy_loss",
               "ppo.ratio", "ppo.approx_kl", "ppo.k3_kl", "ppo.clip_fraction", "ppo.value_loss", "ppo.total_loss"),
    "ppo.kl_early_stop": "no KL early stop: ClipPPOLoss computes losses, the user's loop decides when to stop",
    "ppo.scale_reward": "RewardScaling (envs/transforms) is an affine loc/scale without the seed's clip to [-1, 1]",
    "ppo.clip_grad_norm": "gradient clipping is torch.nn.utils.clip_grad_norm_ in the user's loop, not TorchRL code",
    **left_out("MAPPOLoss (objectives/multiagent/mappo.py:83) never sees agents as rows: TorchRL keeps them on their "
               "own tensor axis ([*B, T, n_agents, ...], mappo.py:142; MultiAgentGAE broadcasts along it, "
               "value/advantages.py:2483-2511), so there are no (episode, timestep, agent) rows to sort or check",
               "ppo.align_batch", "ppo.check_alignment"),
    "ppo.ppo_update": "no PPO update loop: a TorchRL user writes it around ClipPPOLoss",
    "ccapo.ccapo_update": "no CCAPO update loop in TorchRL",
}


def make() -> types.SimpleNamespace:
    import copy

    import tensordict
    import torch
    import torchrl
    from tensordict.nn import TensorDictModule as Module
    from tensordict.nn import TensorDictParams
    from torchrl.modules import MaskedCategorical, ProbabilisticActor, QValueActor
    from torchrl.objectives import ClipPPOLoss, DiscreteCQLLoss, DiscreteSACLoss, LossModule, SoftUpdate
    from torchrl.objectives.llm import GRPOLoss, MCAdvantage
    from torchrl.objectives.value import GAE, TD0Estimator
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
        TD0Estimator(gamma=gamma, value_network=None)  # the estimator's own argument checks (advantages.py:1151)
        with default_dtype(reward.dtype):  # :455 gamma * int tensor: the default dtype
            return td0_return_estimate(gamma, next_value, reward, done.bool())

    def gae(reward, value, next_value, done, *, gamma, lam, truncated=None):
        GAE(gamma=gamma, lmbda=lam, value_network=None)  # the estimator's own argument checks (advantages.py)
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

    class Targets(LossModule):
        """A loss module that holds one network and its target, built as every TorchRL loss builds them:
        convert_to_functional(create_target_params=True) (objectives/common.py:426, :579-594; DiscreteSACLoss does
        it for its critics at sac.py:1228-1234). It computes nothing: SoftUpdate only needs the two parameter sets."""
        value_network: torch.nn.Module
        value_network_params: TensorDictParams
        target_value_network_params: TensorDictParams

        def __init__(self, network):
            super().__init__()
            self.convert_to_functional(network, "value_network", create_target_params=True)

    def polyak(target, online, **decay):
        # SoftUpdate(loss, tau= or eps=) (objectives/utils.py:536-593): init_() copies online into the target
        # (:468), step() does target.lerp_(online, 1 - eps) (:592), eps = 1 - tau (:574). The target's current
        # value (what earlier updates left there) is written in after init_, as training finds it.
        holder = Targets(TableModule(online))
        updater = SoftUpdate(holder, **decay)
        holder.target_value_network_params["table"].data.copy_(target)
        updater.step()
        return holder.target_value_network_params["table"].detach().clone()

    def soft_update(target, online, *, tau):
        return polyak(target, online, tau=tau)

    def ema_update(target, online, *, m):
        return polyak(target, online, eps=m)  # eps is the weight kept on the target (utils.py:545-552)

    def init_target(critic):
        # the target parameters TorchRL creates: detached clones (common.py:579-587, _make_target_param :1015-1023),
        # filled from the online ones by the updater (utils.py:468). TorchRL runs the network on them functionally
        # (to_module); here they are installed in a copy of the critic, storage and requires_grad as TorchRL made them
        holder = Targets(critic)
        SoftUpdate(holder, tau=0.005)
        target = copy.deepcopy(critic)
        for key, t in holder.target_value_network_params.items(True, True):
            *path, leaf = key if isinstance(key, tuple) else (key,)
            owner = target.get_submodule(".".join(path))
            if leaf in owner._buffers:
                owner._buffers[leaf] = t
            else:
                setattr(owner, leaf, torch.nn.Parameter(t, requires_grad=t.requires_grad))
        return target

    def cql_penalty(q_all, actions, *, lam=0.5, legal_mask=None):
        # DiscreteCQLLoss around a Q-table: forward (cql.py:1303-1330) runs value_loss, which evaluates the value
        # network and stores its Q-values (:1251-1300), then cql_loss, mean of logsumexp over every action minus the
        # taken Q (:1336-1356); lam is pinned at its fixed weight 1 (see CAPABILITIES)
        if legal_mask is not None and not bool(legal_mask.all()):
            raise NotApplicable("DiscreteCQLLoss takes the log-sum-exp over every action (cql.py:1346): no legal mask")
        n = q_all.shape[0]
        with default_dtype(q_all.dtype):
            loss = DiscreteCQLLoss(QValueActor(TableModule(q_all), in_keys=["observation"], action_space="categorical"),
                                   action_space="categorical")
            loss.make_value_estimator(gamma=0.5)  # only loss_qvalue reads the estimator
        params = tensordict.TensorDict.from_module(loss).clone(False)
        params["value_network_params", "module", "0", "module", "table"] = q_all  # the caller's tensor, as above
        rows, stop = torch.arange(n), torch.ones(n, 1, dtype=torch.bool)
        td = tensordict.TensorDict({"observation": rows, "action": actions, ("next", "observation"): rows,
                                    ("next", "reward"): torch.zeros(n, 1, dtype=q_all.dtype), ("next", "done"): stop,
                                    ("next", "terminated"): stop}, batch_size=[n])
        with params.to_module(loss):
            return loss(td)["loss_cql"]

    def normalize_advantages(advantage, *, eps=1e-8, clamp=None):
        # ClipPPOLoss(normalize_advantage=True) standardises the stored advantage in forward (ppo.py:1600-1606,
        # :1065-1085: only when it has more than one element, :1074) before the surrogate. With the actor's log-prob
        # equal to the stored one (a one-action policy: log pi = 0 exactly) the ratio is exp(0) = 1 and, with
        # reduction="none", loss_objective = -min(1 * A_hat, clip(1) * A_hat) = -A_hat per row (:1616-1630).
        # eps and clamp are pinned (see CAPABILITIES).
        n = advantage.shape[0]
        with default_dtype(advantage.dtype):
            loss = ClipPPOLoss(actor(TableModule(torch.zeros(n, 1, dtype=advantage.dtype))), None,
                               normalize_advantage=True, entropy_bonus=False, reduction="none")
        batch = {"obs": torch.arange(n), "action": torch.zeros(n, dtype=torch.long),
                 "mask": torch.ones(n, 1, dtype=torch.bool), "advantage": advantage,
                 "old_log_prob": torch.zeros(n, dtype=advantage.dtype)}
        with torch.no_grad():
            out = loss(to_tensordict(batch, old_log_prob=loss.tensor_keys.sample_log_prob))
        return -out["loss_objective"].reshape(advantage.shape)

    class TokenLogProbs:
        """What GRPOLoss reads from its actor's distribution: .log_prob(tokens) and .mask (llm/grpo.py:636-654,
        :961). An LLM wrapper's LLMMaskedCategorical computes that log-prob from the model's logits
        (modules/distributions/discrete.py:708-858); the suite hands it over, so it is returned as given."""

        def __init__(self, log_prob, mask):
            self.log_prob_, self.mask = log_prob, mask

        def log_prob(self, tokens):
            return self.log_prob_

    class TokenPolicy(torch.nn.Module):
        """The actor GRPOLoss accepts: anything with get_dist (grpo.py:616, :636-640), the model being the suite's."""
        in_keys = ["logp_new", "step_mask"]

        def get_dist(self, td, **_):
            return TokenLogProbs(td.get("logp_new"), td.get("step_mask"))

    def grpo(logp_new, logp_old, logp_ref, advantages, mask, *, clip_eps, coeff):
        # Stored and reference log-probs and the advantages are data, as TorchRL's collectors and replay buffers
        # store them (GRPOLoss refuses a stored log-prob that requires grad, grpo.py:934-938).
        b, t = logp_new.shape
        with default_dtype(logp_new.dtype):  # clip_epsilon buffers: torch.tensor(float) (grpo.py:534-537)
            loss = GRPOLoss(TokenPolicy(), clip_epsilon=clip_eps, entropy_bonus=False, aggregation="prompt_mean",
                            kl_to_ref_coeff=coeff)
        td = tensordict.TensorDict({
            "logp_new": logp_new, "step_mask": mask.bool(), ("tokens", "full"): torch.zeros(b, t, dtype=torch.long),
            ("log_probs", "full"): logp_old.detach(), "advantage": advantages.detach().unsqueeze(-1),
            ("next", "ref_log_probs", "full"): logp_ref.detach()}, batch_size=[b])
        return loss(td)

    def policy_loss(logp_new, logp_old, logp_ref, advantages, mask, *, clip_eps=0.2, beta_kl=0.04):
        # GRPOLoss.forward (llm/grpo.py:664-767): log weight from the actor's log-prob and the stored one (:918-982),
        # -min(r A, clip(r) A) (:769-782), aggregation "prompt_mean" = per-sequence masked mean, then the batch mean
        # (:804-810); the k3 KL to the reference, (exp(D) - D - 1).mean() with D = ref - cur (:868-916), times
        # kl_to_ref_coeff, only when that coefficient is > 0 (:747-755). The total is the sum of the loss_* keys.
        args = (logp_new, logp_old, logp_ref, advantages, mask)
        out = grpo(*args, clip_eps=clip_eps, coeff=beta_kl if beta_kl > 0 else None)
        clip = out.loss_objective.reshape(())
        if beta_kl > 0:
            loss_kl, kl = out.loss_kl_to_ref.reshape(()), out.kl_to_ref.reshape(())
        else:  # no KL term at beta 0 (:747); its value read from a run with coefficient 1
            loss_kl, kl = torch.zeros_like(clip), grpo(*args, clip_eps=clip_eps, coeff=1.0).kl_to_ref.reshape(())
        return {"loss": clip + loss_kl, "loss_clip": clip, "loss_kl": loss_kl, "kl_ref": kl,
                "approx_kl": out.kl_approx.reshape(()), "clip_fraction": out.clip_fraction.reshape(())}

    sac = types.SimpleNamespace(losses=sac_losses, entropy_from_logits=entropy_from_logits,
                                policy_loss_from_logits=policy_loss_from_logits, temperature_loss=temperature_loss,
                                temperature_update=temperature_update, td_target=td_target, soft_update=soft_update,
                                ema_update=ema_update, init_target=init_target, cql_penalty=cql_penalty)
    ppo = types.SimpleNamespace(losses=ppo_losses, gae=gae, clipped_policy_loss=clipped_policy_loss,
                                normalize_advantages=normalize_advantages, **dist_ops)
    ccapo = types.SimpleNamespace(macro_advantage=macro_advantage, policy_loss=policy_loss)
    return types.SimpleNamespace(name="TorchRL", version=torchrl.__version__, capabilities=CAPABILITIES,
                                 sac=sac, ppo=ppo, ccapo=ccapo)
