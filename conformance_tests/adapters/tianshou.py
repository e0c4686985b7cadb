"""Tianshou 2.0 behind the sac and ppo contracts (``rlconform audit --impl
conformance_tests.adapters.tianshou:make``).

sac.losses: one ``DiscreteSAC.update`` (public) over a ``ReplayBuffer`` holding the batch, with
optimisers of learning rate 0 (nothing moves) and the suite's tables as actor and critics; the
n-step return (n = 1) that ``update`` computes is Tianshou's TD target. sac.td_target: the
algorithm's ``compute_nstep_return`` (n = 1) with the gamma its constructor validated. ppo.gae:
``Algorithm.compute_episodic_return``, one buffer per rollout row. Tianshou returns numbers
(``DiscreteSACTrainingStats`` floats, numpy returns): nothing is differentiable. Paths in comments are
under ``site-packages/tianshou/``.
"""
from __future__ import annotations

import math
import types

from conformance_tests.adapters import left_out, seed_only
from conformance_tests.adapters._tensordict import default_dtype
from conformance_tests.errors import NotApplicable
from conformance_tests.modules import TableModule

CAPABILITIES = {
    "masks": False,  # algorithm/modelfree/discrete_sac.py:74 Categorical(logits=...): no action mask anywhere
    "dtypes": ["float32", "float64"],  # numba kernels run in float64 (algorithm_base.py:1086, :1161), cast back
    "train_dtype": "float32",  # its batches and networks are float32
    "differentiable": False,  # stats are .item() floats (discrete_sac.py:190-196); returns numpy (:719)
    "terminated_truncated": True,  # algorithm_base.py:651 value_mask = ~terminated; :714 end = terminated | truncated
    "conventions": {
        "huber_delta": "mse",  # discrete_sac.py:165, :171 (td ** 2).mean(), no Huber, no 1/2
        "target_entropy": "scalar",  # modelfree/sac.py:179 AutoAlpha(target_entropy: float)
        "gamma_one": "accept",  # modelfree/ddpg.py:254 assert 0.0 <= gamma <= 1.0 (DiscreteSAC's base class)
        "gamma_zero": "accept",  # the same assertion: 0 is inside Tianshou's closed interval, by design
        "alpha_clamp": "none",  # sac.py AutoAlpha: log alpha is a free Parameter, never clamped
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
    "sac.cql_penalty": "not adapted yet: DiscreteCQL adds its penalty inside its own update, on its own Q-network",
    "sac.bc_loss": "no behaviour-cloning term in DiscreteSAC",
    **left_out("the lagged critics are soft-updated in place inside the algorithm (utils/lagged_network.py), not on "
               "given tensors", "sac.soft_update", "sac.ema_update", "sac.init_target"),
    "sac.popart_step": "no PopArt reward normaliser in Tianshou",
    "sac.update_step": "not adapted yet: DiscreteSAC.update runs with the algorithm's own optimisers and buffer "
                       "sampling; sac.losses reaches one update at learning rate 0",
    **left_out("no action masks in Tianshou's policies (the ppo family's masked distribution)",
               "ppo.masked_logits", "ppo.masked_distribution", "ppo.sample_actions", "ppo.evaluate_actions"),
    **left_out("not adapted yet: computed inside PPO._update_with_batch (algorithm/modelfree/ppo.py) from its own "
               "policy, and logged as floats", "ppo.ratio", "ppo.approx_kl", "ppo.k3_kl", "ppo.clip_fraction",
               "ppo.clipped_policy_loss", "ppo.value_loss", "ppo.total_loss", "ppo.normalize_advantages",
               "ppo.losses", "ppo.ppo_update"),
    "ppo.kl_early_stop": "no KL early stop in Tianshou's PPO",
    "ppo.scale_reward": "reward normalisation is a running-std scaling (no fixed scale, no clip to [-1, 1])",
    "ppo.clip_grad_norm": "torch's clip_grad_norm_ inside the update, not Tianshou code",
    **left_out("no MAPPO (episode, timestep, agent) batches", "ppo.align_batch", "ppo.check_alignment"),
}


def make() -> types.SimpleNamespace:
    import gymnasium as gym
    import numpy as np
    import tianshou
    import torch
    from tianshou.algorithm import DiscreteSAC
    from tianshou.algorithm.algorithm_base import Algorithm
    from tianshou.algorithm.modelfree.discrete_sac import DiscreteSACPolicy
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

    return types.SimpleNamespace(name="Tianshou", version=tianshou.__version__, capabilities=CAPABILITIES,
                                 sac=types.SimpleNamespace(losses=losses, td_target=td_target,
                                                           temperature_update=temperature_update),
                                 ppo=types.SimpleNamespace(gae=gae))

