"""Tianshou 2.0 behind the sac and ppo contracts (``rlconform audit --impl
conformance_tests.adapters.tianshou:make``).

sac.losses: one ``DiscreteSAC.update`` (public) over a ``ReplayBuffer`` holding the batch, with
optimisers of learning rate 0 (nothing moves) and the suite's tables as actor and critics; the
n-step return (n = 1) that ``update`` computes is Tianshou's TD target. sac.td_target: the
algorithm's ``compute_nstep_return`` (n = 1) with the gamma its constructor validated. ppo.gae:
``Algorithm.compute_episodic_return``, one buffer per rollout row.

sac.cql_penalty, ppo.clipped_policy_loss, ppo.value_loss, ppo.normalize_advantages: Tianshou computes them
inline in ``DiscreteCQL._update_with_batch`` (imitation/discrete_cql.py:80-113) and ``PPO._update_with_batch``
(modelfree/ppo.py:164-223) and logs only ``.item()`` floats, so, as the sb3-contrib adapter does with sb3's
train(), the adapter runs that method and reads its locals (Tianshou's own tensors, with their graph) from its
frame when it calls ``self.optim.step(loss)``; the optimiser is a stand-in that stops it there, before any
backward. CQL goes through the public ``DiscreteCQL.update``; PPO's method is given the batch its
``_preprocess_batch`` (ppo.py:146-162) would build (obs, act, logp_old, adv, returns, v_s), since that step
recomputes the advantages and the old log-probs itself. Everything else Tianshou returns is numbers
(``DiscreteSACTrainingStats`` floats, numpy returns) and not differentiable. Paths in comments are under
``site-packages/tianshou/``.
"""
from __future__ import annotations

import math
import sys
import types

from conformance_tests.adapters import left_out, seed_only
from conformance_tests.adapters._tensordict import default_dtype
from conformance_tests.errors import NotApplicable
from conformance_tests.modules import TableModule

CAPABILITIES = {
    # no mask in any adapted op: discrete_sac.py:74 Categorical(logits=...), PPO's dist_fn(actor output)
    # (reinforce.py:183), and DiscreteCQL's penalty on compute_q_value(all_dist, None) (discrete_cql.py:102), although
    # the Q-learning policies can mask their argmax (dqn.py:145-151)
    "masks": False,
    "dtypes": ["float32", "float64"],  # numba kernels run in float64 (algorithm_base.py:1086, :1161), cast back
    "train_dtype": "float32",  # its batches and networks are float32
    # stats are .item() floats (discrete_sac.py:190-196), returns numpy (algorithm_base.py:719); the losses read
    # from the library's frame (ppo.py:196-208, discrete_cql.py:106) keep their graph
    "differentiable": ["ppo.clipped_policy_loss", "ppo.value_loss", "sac.cql_penalty"],
    # PPO normalises with `(adv - mean) / (std + self._eps)` (ppo.py:184-186), self._eps = 1e-8 (a2c.py:113), and
    # never clamps: the contract's defaults, hard-coded
    "pinned": {"ppo.normalize_advantages": {"eps": 1e-8, "clamp": None}},
    "terminated_truncated": True,  # algorithm_base.py:651 value_mask = ~terminated; :714 end = terminated | truncated
    "conventions": {
        "huber_delta": "mse",  # discrete_sac.py:165, :171 (td ** 2).mean(), no Huber, no 1/2
        "target_entropy": "scalar",  # modelfree/sac.py:179 AutoAlpha(target_entropy: float)
        "gamma_one": "accept",  # modelfree/ddpg.py:254 assert 0.0 <= gamma <= 1.0 (DiscreteSAC's base class)
        "gamma_zero": "accept",  # the same assertion: 0 is inside Tianshou's closed interval, by design
        "alpha_clamp": "none",  # sac.py AutoAlpha: log alpha is a free Parameter, never clamped
        "value_loss_factor": 1.0,  # ppo.py:208 vf_loss = (returns - value).pow(2).mean(): no 1/2
    },
}

# The contract ops of the covered families (sac, ppo) this adapter does not provide, and why.
LEFT_OUT = {
    **seed_only("sac", "ppo"),
    **left_out("computed inside DiscreteSAC._update_with_batch (discrete_sac.py:140-196) and returned as floats: "
               "reached through sac.losses",
               "sac.entropy", "sac.soft_value", "sac.critic_loss", "sac.policy_loss", "sac.critic_loss_total",
               "sac.policy_loss_total"),
    **left_out("no action masks: DiscreteSACPolicy builds Categorical(logits=...) (discrete_sac.py:74), so a "
               "masked op has no Tianshou counterpart", "sac.masked_softmax", "sac.entropy_from_logits",
               "sac.soft_value_from_logits", "sac.policy_loss_from_logits"),
    **left_out("no Top-p backup: the soft value is the full expectation (discrete_sac.py:147)",
               "sac.top_p_select", "sac.top_p_probs", "sac.top_p_soft_value", "sac.policy_loss_top_p"),
    "sac.target_entropy": "one float given to AutoAlpha (sac.py:179), not a function of the legal mask",
    "sac.temperature_loss": "AutoAlpha.update (sac.py:203-209) builds the loss, calls backward and steps: only .item() "
                            "comes back; the step is reached through sac.temperature_update",
    "sac.clamp_log_alpha": "log alpha is never clamped (declared alpha_clamp none)",
    "sac.bc_loss": "no behaviour-cloning term in DiscreteSAC; Tianshou's imitation learners train on demonstrations "
                   "alone, an unweighted NLL over every row (imitation/imitation_base.py:120-122), not a weighted term "
                   "over the demo rows of a mixed batch",
    **left_out("the lagged critics are soft-updated in place inside the algorithm (utils/lagged_network.py), not on "
               "given tensors", "sac.soft_update", "sac.ema_update", "sac.init_target"),
    "sac.popart_step": "no PopArt reward normaliser in Tianshou",
    "sac.update_step": "not adapted yet: DiscreteSAC.update runs with the algorithm's own optimisers and buffer "
                       "sampling; sac.losses reaches one update at learning rate 0",
    **left_out("no action masks in Tianshou's actor policies: ProbabilisticActorPolicy.forward builds "
               "dist_fn(actor output) with no mask (modelfree/reinforce.py:178-183)",
               "ppo.masked_logits", "ppo.masked_distribution", "ppo.sample_actions", "ppo.evaluate_actions"),
    "ppo.ratio": "computed inline, exp(log_prob - logp_old).float() (ppo.py:187): reached through "
                 "ppo.clipped_policy_loss",
    **left_out("Tianshou's PPO computes no KL estimate and no clip fraction: PPO._update_with_batch (ppo.py:164-223) "
               "builds and logs only the clip, value and entropy losses and their total (A2CTrainingStats, "
               "a2c.py:23-29)", "ppo.approx_kl", "ppo.k3_kl", "ppo.clip_fraction"),
    "ppo.total_loss": "computed inline from the minibatch's own three losses, clip_loss + vf_coef * vf_loss - "
                      "ent_coef * ent_loss (ppo.py:211): no function of given losses",
    "ppo.losses": "the contract's result needs clip_fraction and kl_approx, which Tianshou's PPO never computes "
                  "(ppo.py:164-223): its loss terms are reached through ppo.clipped_policy_loss and ppo.value_loss",
    "ppo.ppo_update": "each minibatch record needs approx_kl, k3_kl and clip_fraction, and the loop a KL early stop; "
                      "Tianshou's PPO has none of them (ppo.py:164-223)",
    "ppo.kl_early_stop": "no KL early stop in Tianshou's PPO",
    "ppo.scale_reward": "reward normalisation is a running-std scaling (no fixed scale, no clip to [-1, 1])",
    "ppo.clip_grad_norm": "torch's clip_grad_norm_ inside Algorithm.Optimizer.step (algorithm_base.py:499), not "
                          "Tianshou code",
    **left_out("no MAPPO (episode, timestep, agent) batches", "ppo.align_batch", "ppo.check_alignment"),
}


def make() -> types.SimpleNamespace:
    import gymnasium as gym
    import numpy as np
    import tianshou
    import torch
    from tianshou.algorithm import PPO, DiscreteCQL, DiscreteSAC
    from tianshou.algorithm.algorithm_base import Algorithm
    from tianshou.algorithm.modelfree.discrete_sac import DiscreteSACPolicy
    from tianshou.algorithm.modelfree.qrdqn import QRDQNPolicy
    from tianshou.algorithm.modelfree.reinforce import ProbabilisticActorPolicy
    from tianshou.algorithm.modelfree.sac import AutoAlpha
    from tianshou.algorithm.optim import TorchOptimizerFactory
    from tianshou.data import Batch, ReplayBuffer
    from tianshou.utils.torch_utils import policy_within_training_step

    frozen = TorchOptimizerFactory(torch.optim.SGD, lr=0.0)  # update() steps; lr 0 keeps every table as given

    class Net(torch.nn.Module):  # Tianshou calls nets with numpy obs (and the actor with state=, info=)
        def __init__(self, table, actor=False):
            super().__init__()
            self.table, self.actor = table, actor

        def forward(self, obs, state=None, info=None):
            out = self.table(torch.as_tensor(obs))
            return (out, state) if self.actor else out

    def buffer(obs, next_obs, action, reward, done, truncated):
        n = lambda x: np.asarray(x.detach().cpu())  # noqa: E731
        term, trunc = n(done).astype(bool), n(truncated if truncated is not None else done * 0).astype(bool)
        return ReplayBuffer.from_data(obs=n(obs), act=n(action), rew=n(reward), terminated=term, truncated=trunc,
                                      done=term | trunc, obs_next=n(next_obs))

    def algorithm(policy, q1, q2, n_act, gamma, alpha):  # DiscreteSAC checks 0 <= gamma <= 1 (ddpg.py:254)
        pol = DiscreteSACPolicy(actor=Net(policy, actor=True), action_space=gym.spaces.Discrete(n_act))
        return DiscreteSAC(policy=pol, policy_optim=frozen, critic=Net(q1), critic_optim=frozen, critic2=Net(q2),
                           critic2_optim=frozen, gamma=gamma, alpha=alpha)

    def losses(policy, critic, target_critic, batch, *, log_alpha, gamma, kappa=0.9, delta=1.0, top_p=1.0):
        if top_p < 1.0:
            raise NotApplicable("the backup is the full expectation (discrete_sac.py:147)")
        n_act = batch["legal_mask"].shape[-1]
        with default_dtype(log_alpha.dtype):  # AutoAlpha: torch.tensor(log_alpha) (sac.py:192)
            alpha = AutoAlpha(kappa * math.log(n_act), float(log_alpha), frozen)
        algo = algorithm(policy, critic.q1, critic.q2, n_act, gamma, alpha)
        # the lagged critics are deep copies of the online ones (utils/lagged_network.py:67): load the
        # suite's target tables into them, as restoring a checkpoint would
        algo.critic_old.module.table.load_state_dict(target_critic.q1.state_dict())
        algo.critic2_old.module.table.load_state_dict(target_critic.q2.state_dict())
        buf = buffer(batch["obs"], batch["next_obs"], batch["action"], batch["reward"], batch["done"],
                     batch.get("truncated"))
        grads = {p: p.grad for m in (policy, critic) for p in m.parameters()}
        with policy_within_training_step(algo.policy):
            stats = algo.update(buf, sample_size=0)  # 0: the whole buffer, in order
        for p, g in grads.items():  # update() calls backward (and steps at lr 0): the caller's gradients, as given
            p.grad = g
        with policy_within_training_step(algo.policy):
            obs = Batch(obs=np.asarray(batch["obs"]), info={})
            entropy = algo.policy(obs).dist.entropy()  # the entropy update() uses (discrete_sac.py:178)
        as_tensor = lambda x: torch.tensor(float(x), dtype=log_alpha.dtype)  # noqa: E731
        return {"loss_actor": as_tensor(stats.actor_loss), "loss_alpha": as_tensor(stats.alpha_loss),
                "loss_qvalue": as_tensor(stats.critic1_loss + stats.critic2_loss),
                "entropy": as_tensor(entropy.mean()), "alpha": as_tensor(stats.alpha)}

    def td_target(reward, done, next_value, *, gamma, truncated=None):
        rows = torch.arange(reward.shape[0])
        zeros = TableModule(torch.zeros(len(rows), 1))
        algo = algorithm(zeros, zeros, zeros, 1, gamma, 0.0)  # validates gamma as every Tianshou algorithm does
        buf, idx = buffer(rows, rows, rows, reward, done, truncated), np.arange(len(rows))
        out = algo.compute_nstep_return(buf[idx], buf, idx, lambda _, i: next_value[i].reshape(-1, 1),
                                        gamma=algo.gamma, n_step=algo.n_step_return_horizon)
        return out.returns.reshape(reward.shape).to(reward.dtype)

    def gae(reward, value, next_value, done, *, gamma, lam, truncated=None):
        out = [episodic_return(reward[i], value[i], next_value[i], done[i],
                               None if truncated is None else truncated[i], gamma, lam)
               for i in np.ndindex(*reward.shape[:-1])]  # one buffer per rollout row (time is the last axis)
        ret, adv = (torch.as_tensor(np.stack(x), dtype=value.dtype).reshape(value.shape) for x in zip(*out))
        return adv, ret

    def episodic_return(reward, value, next_value, done, truncated, gamma, lam):
        steps = torch.arange(reward.shape[0])
        buf = buffer(steps, steps, steps, reward, done, truncated)
        idx = np.arange(len(buf))
        return Algorithm.compute_episodic_return(buf[idx], buf, idx, v_s_=next_value.detach(), v_s=value.detach(),
                                                 gamma=gamma, gae_lambda=lam)

    def temperature_update(log_alpha, entropy, target_entropy, *, lr):
        # AutoAlpha.update(entropy): -(log_alpha * (target - entropy)).mean(), one step of its optimiser
        # (sac.py AutoAlpha); SGD at lr is SAC-TEMP-1's rule. Its target entropy is one float for every state.
        tgt = target_entropy.reshape(-1)
        if tgt.numel() and not bool((tgt == tgt[0]).all()):
            raise NotApplicable("Tianshou's target entropy is one float for every state (sac.py AutoAlpha)")
        with default_dtype(log_alpha.dtype):  # AutoAlpha: torch.tensor(log_alpha)
            alpha = AutoAlpha(float(tgt[0]) if tgt.numel() else 0.0, float(log_alpha),
                              TorchOptimizerFactory(torch.optim.SGD, lr=lr))
        alpha.update(entropy)
        return alpha._log_alpha.detach().to(log_alpha.device)  # no accessor for the tuned log alpha

    # ------------------------------------------------------------ losses Tianshou computes inline, read from its frame
    class Stop(Exception):
        pass

    def stop_at_step(method, got):
        """An optimiser stand-in for ``algo.optim`` (public attribute, a2c.py:103, dqn.py:231): when ``method``
        calls ``self.optim.step(loss)`` (ppo.py:212, discrete_cql.py:107), keep its locals and stop it there, before
        Tianshou's own step would call backward (algorithm_base.py:496-497)."""
        def step(loss, *args, **kwargs):
            f = sys._getframe(1)  # private: the method publishes no tensor, only .item() floats
            while f.f_code is not method.__code__:
                f = f.f_back
            got.update(f.f_locals)
            raise Stop
        return types.SimpleNamespace(step=step)

    class Rows(torch.nn.Module):  # obs = row indices into the suite's tensor (an actor also returns the state)
        def __init__(self, values, actor=False):
            super().__init__()
            self.values, self.actor = values, actor
            self.unused = torch.nn.Parameter(torch.zeros(1))  # Tianshou builds an optimiser over the modules

        def forward(self, obs, state=None, info=None):
            out = self.values[torch.as_tensor(obs, device=self.values.device).long()]
            return (out, state) if self.actor else out

    def ppo_minibatch(ratio, advantage, values, returns, *, clip_eps=0.2, normalize=False):
        """The locals of one minibatch of ``PPO._update_with_batch`` (ppo.py:164-212). The policy's log-prob of
        the stored action (0) under Exponential(rate = ratio) is log ratio and the cached logp_old is 0, so
        Tianshou's own ratio exp(log_prob - logp_old) (ppo.py:187) is the given one; the critic returns the given
        values. adv, returns and v_s are data, as _preprocess_batch leaves them (to_torch_as of numpy,
        a2c.py:151-152)."""
        def dist_fn(rate):
            return torch.distributions.Exponential(rate, validate_args=False)  # log_prob(0) = log rate

        policy = ProbabilisticActorPolicy(actor=Rows(ratio, actor=True), dist_fn=dist_fn, action_scaling=False,
                                          action_space=gym.spaces.Box(0.0, np.inf, (1,)), action_bound_method=None)
        algo = PPO(policy=policy, critic=Rows(values), optim=frozen, eps_clip=clip_eps,
                   advantage_normalization=normalize)
        got = {}
        algo.optim = stop_at_step(PPO._update_with_batch, got)
        zeros = torch.zeros_like(ratio.detach())
        batch = Batch(obs=torch.arange(ratio.shape[0]), info=Batch(), act=zeros, logp_old=zeros,
                      adv=advantage.detach(), returns=returns.detach(), v_s=values.detach())
        np_state = np.random.get_state()  # Batch.split shuffles with np.random (data/batch.py:1209)
        try:  # the policy samples an action (reinforce.py:188): torch's RNG is forked, numpy's restored
            with policy_within_training_step(policy), torch.random.fork_rng():
                algo._update_with_batch(batch, batch_size=None, repeat=1)  # one minibatch: the whole batch
        except Stop:
            pass
        finally:
            np.random.set_state(np_state)
        return got

    def clipped_policy_loss(ratio, advantage, *, clip_eps):
        # clip_loss = -min(r A, clamp(r, 1 - eps, 1 + eps) A).mean() (ppo.py:189-196); dual clip off (its default)
        zero = torch.zeros_like(ratio)
        return ppo_minibatch(ratio, advantage, zero, zero, clip_eps=clip_eps)["clip_loss"]

    def value_loss(values, returns):
        # vf_loss = (returns - value).pow(2).mean() (ppo.py:208); value clipping off (its default)
        return ppo_minibatch(torch.ones_like(values), torch.zeros_like(values), values, returns)["vf_loss"]

    def normalize_advantages(advantage, *, eps=1e-8, clamp=None):  # eps, clamp: pinned (CAPABILITIES)
        # the minibatch's advantages after `(adv - mean) / (std + self._eps)` (ppo.py:184-186), put back in row order
        got = ppo_minibatch(torch.ones_like(advantage), advantage, torch.zeros_like(advantage),
                            torch.zeros_like(advantage), normalize=True)
        rows = torch.as_tensor(got["minibatch"].obs, device=advantage.device).long()  # Batch.split's shuffle
        return torch.empty_like(got["advantages"]).index_copy_(0, rows, got["advantages"])

    class Quantiles(torch.nn.Module):  # QRDQN's model: obs -> ([B, A, N] quantiles, state)
        def __init__(self, q):
            super().__init__()
            self.q = q
            self.unused = torch.nn.Parameter(torch.zeros(1))

        def forward(self, obs, state=None, info=None):
            q = self.q[torch.as_tensor(obs, device=self.q.device).long()]
            return q.unsqueeze(-1).expand(*q.shape, 2), state  # 2 equal quantiles (qrdqn.py:78 needs > 1)

    def cql_penalty(q_all, actions, *, lam=0.5, legal_mask=None):
        # lam is DiscreteCQL's min_q_weight, a constructor argument; its own default is 10.0 (discrete_cql.py:31),
        # a configuration, so the contract's default stands here as in the other adapters
        if legal_mask is not None and not bool(legal_mask.all()):  # masks: False (the harness sends none)
            raise NotApplicable("DiscreteCQL's logsumexp runs over every action (compute_q_value(all_dist, None), "
                                "discrete_cql.py:102)")
        n, n_act = q_all.shape
        policy = QRDQNPolicy(model=Quantiles(q_all), action_space=gym.spaces.Discrete(n_act))
        algo = DiscreteCQL(policy=policy, optim=frozen, min_q_weight=lam, num_quantiles=2)
        got = {}
        algo.optim = stop_at_step(DiscreteCQL._update_with_batch, got)
        # every row terminal with reward Q(s, a): the n-step return is Q(s, a) itself (the target is masked by
        # ~terminated, algorithm_base.py:651, :798), so the quantile-regression term is exactly 0, as is its gradient
        rows, taken = torch.arange(n), q_all.detach().gather(1, actions.reshape(-1, 1).long()).reshape(-1)
        ones = torch.ones(n, dtype=torch.bool)
        buf = buffer(rows, rows, actions, taken, ones, ~ones)
        try:
            with policy_within_training_step(policy):
                algo.update(buf, sample_size=0)  # 0: the whole buffer, in order
        except Stop:
            pass
        # loss = qr_loss + min_q_loss * min_q_weight (discrete_cql.py:102-106): the CQL term alone, with q the mean
        # of the quantiles (qrdqn.py:20), i.e. the given Q
        return got["loss"]

    return types.SimpleNamespace(name="Tianshou", version=tianshou.__version__, capabilities=CAPABILITIES,
                                 sac=types.SimpleNamespace(losses=losses, td_target=td_target,
                                                           temperature_update=temperature_update,
                                                           cql_penalty=cql_penalty),
                                 ppo=types.SimpleNamespace(gae=gae, clipped_policy_loss=clipped_policy_loss,
                                                           value_loss=value_loss,
                                                           normalize_advantages=normalize_advantages))

