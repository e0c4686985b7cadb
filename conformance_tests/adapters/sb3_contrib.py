"""sb3-contrib's MaskablePPO behind the ppo contract (``rlconform audit --impl
conformance_tests.adapters.sb3_contrib:make --family ppo``). Line numbers: sb3-contrib / SB3 2.9.2.

Masked distribution ops: ``MaskableCategorical`` (public; fill -1e8, ``common/maskable/distributions.py:59``).
``gae``: ``MaskableRolloutBuffer.add`` + ``compute_returns_and_advantage`` (public, SB3 ``buffers.py:403``).
``ppo_update``, ``normalize_advantages``: ``MaskablePPO.train()`` itself (``ppo_mask.py:309``) on a
``MaskableRolloutBuffer`` filled with the suite's rows, with the suite's actor/critic behind a policy
object (train() reads ``policy.evaluate_actions/optimizer/parameters``). sb3 exposes no per-minibatch
value (its logger only holds means over the whole update), so the adapter reads train()'s own locals
(``policy_loss``, ``ratio``, ``approx_kl_div``, ...) from its frame when train() calls
``optimizer.zero_grad()``: the numbers are sb3's, computed by its code. ``kl_early_stop`` is left out: the
rule lives inside train() on sb3's own k3 of the replayed log-probs, not on a given value.

``sac.temperature_loss``: stable_baselines3's ``SAC.train()`` (SB3 ``sac/sac.py:205``, continuous actions) with
``ent_coef="auto"``: its entropy-coefficient loss ``-(log_ent_coef * (log_prob + target_entropy).detach()).mean()``
(:240) is read from train()'s frame when it calls the coefficient optimiser's ``zero_grad`` (:250), before any
backward. The caller's log alpha is the ``log_ent_coef`` train() reads, and the actor's ``action_log_prob``
returns −H per state: SB3's log-prob of the sampled action is its one-sample estimate of −H, the only thing the
formula reads of the policy. ``temperature_update`` is left out: SB3 steps log alpha with Adam (:193), not the
contract's SGD rule.
"""
from __future__ import annotations

import sys
import types

from conformance_tests.adapters import distribution_ops, left_out, seed_only
from conformance_tests.errors import NotApplicable

# The contract ops of the covered families (ppo; sac through stable_baselines3's SAC) left out, and why.
LEFT_OUT = {
    **seed_only("ppo", "sac"),
    "ppo.masked_logits": "MaskableCategorical masks inside the distribution (fill -1e8, distributions.py:59): reached "
                         "through masked_distribution",
    **left_out("computed inline in MaskablePPO.train() (ppo_mask.py:352-394) on the policy's own log-probs: reached "
               "through ppo.losses and ppo.ppo_update", "ppo.ratio", "ppo.approx_kl", "ppo.k3_kl", "ppo.clip_fraction",
               "ppo.clipped_policy_loss", "ppo.value_loss", "ppo.total_loss", "ppo.clip_grad_norm"),
    "ppo.kl_early_stop": "the rule lives inside train() on sb3's own k3 of the replayed log-probs (ppo_mask.py:397), "
                         "not on a given value: reached through ppo.ppo_update",
    "ppo.scale_reward": "VecNormalize scales by a running std of returns, not by a fixed scale with a clip to [-1, 1]",
    **left_out("no MAPPO (episode, timestep, agent) batches in sb3", "ppo.align_batch", "ppo.check_alignment"),
    **left_out("SB3's SAC is continuous (a squashed Gaussian actor): no discrete masked policy, so the discrete "
               "soft value, entropy, Top-p backup and masked policy loss do not exist there",
               "sac.masked_softmax", "sac.target_entropy", "sac.entropy", "sac.soft_value", "sac.top_p_select",
               "sac.top_p_probs", "sac.top_p_soft_value", "sac.policy_loss", "sac.policy_loss_top_p",
               "sac.policy_loss_total", "sac.entropy_from_logits", "sac.soft_value_from_logits",
               "sac.policy_loss_from_logits", "sac.losses"),
    **left_out("computed inline in SAC.train() (sac.py:263-270) on its own critics' next Q-values: no function of "
               "given tensors", "sac.td_target", "sac.critic_loss", "sac.critic_loss_total"),
    "sac.temperature_update": "SB3 steps log alpha with Adam (sac.py:193), not the contract's SGD rule: its loss is "
                              "reached through sac.temperature_loss",
    "sac.clamp_log_alpha": "log alpha is never clamped in SB3's SAC",
    **left_out("no CQL or behaviour-cloning term in SB3's SAC", "sac.cql_penalty", "sac.bc_loss"),
    "sac.ema_update": "no EMA target encoder (the seed's InfoNCE encoder): SB3's target networks use soft_update",
    "sac.popart_step": "no PopArt reward normaliser in SB3",
    **left_out("SAC.train() runs on the continuous policy with its own Adam optimisers and replay sampling",
               "sac.init_target", "sac.update_step"),
}


def make() -> types.SimpleNamespace:
    import gymnasium as gym
    import numpy as np
    import sb3_contrib
    import torch
    from sb3_contrib import MaskablePPO
    from sb3_contrib.common.maskable.buffers import MaskableRolloutBuffer
    from sb3_contrib.common.maskable.distributions import MaskableCategorical
    from stable_baselines3 import SAC
    from stable_baselines3.common.utils import polyak_update

    class Spaces(gym.Env):  # MaskablePPO builds its buffer from an env's spaces; nothing is ever stepped
        def __init__(self, n, a):
            self.observation_space, self.action_space = gym.spaces.Discrete(n), gym.spaces.Discrete(a)

    class Policy(torch.nn.Module):  # the four things train() uses of model.policy
        def __init__(self, actor, critic, optimizer, obs, hook):
            super().__init__()
            self.actor, self.critic, self.obs = actor, critic, obs
            # no param_groups: train()'s learning-rate schedule (base_class.py:287) leaves the suite's lr alone
            self.optimizer = types.SimpleNamespace(zero_grad=hook, step=optimizer.step, param_groups=[])

        def set_training_mode(self, mode):
            self.train(mode)

        def evaluate_actions(self, obs, actions, action_masks):  # obs = row indices (Discrete obs space)
            rows = self.obs[obs.long().flatten()]
            dist = MaskableCategorical(logits=self.actor(rows), masks=action_masks)
            return self.critic(rows), dist.log_prob(actions), dist.entropy()

    class Stop(Exception):
        pass

    def run_train(actor, critic, optimizer, batch, hook, *, epochs, minibatch_size, normalize, clip_eps=0.2,
                  vf_coef=0.5, ent_coef=0.0, max_grad_norm=0.5, target_kl=None):
        n, a = batch["mask"].shape
        model = MaskablePPO("MlpPolicy", Spaces(n, a), n_steps=n,
                            batch_size=minibatch_size, n_epochs=epochs, clip_range=clip_eps, vf_coef=vf_coef,
                            ent_coef=ent_coef, max_grad_norm=max_grad_norm, target_kl=target_kl,
                            normalize_advantage=normalize, device="cpu")
        model.set_logger(types.SimpleNamespace(record=lambda key, *a, **k: hook(key)))  # public setter
        buf = model.rollout_buffer  # public attribute; rows added with its public add()
        for i in range(n):
            buf.add(np.array([i]), batch["action"][i:i + 1].numpy(), np.zeros(1), np.zeros(1),
                    torch.zeros(1), batch["old_log_prob"][i:i + 1].detach(),
                    action_masks=batch["mask"][i:i + 1].numpy())
        # the given advantages/returns go where compute_returns_and_advantage writes them (buffers.py:435, :438)
        buf.advantages[:, 0], buf.returns[:, 0] = batch["advantage"].detach().numpy(), batch["return"].detach().numpy()
        # an sb3 policy cannot wrap given modules: replace the attribute train() reads (ppo_mask.py:339, :404-408)
        model.policy = Policy(actor, critic, optimizer or torch.optim.SGD([torch.zeros(1)]), batch["obs"], hook)
        model.train()

    def train_locals(code=MaskablePPO.train.__code__):
        # private: MaskablePPO.train() (and SAC.train()) publish no per-minibatch values, so read its locals (sb3's
        # own numbers) from its frame, which is on the stack whenever it calls our optimizer/logger stand-in
        f = sys._getframe(1)
        while f.f_code is not code:
            f = f.f_back
        return f.f_locals

    def ppo_update(actor, critic, optimizer, batch, *, epochs, minibatch_size, clip_eps, vf_coef, ent_coef,
                   max_grad_norm, target_kl, generator=None):  # shuffling: np.random (buffers.py:90)
        recs, seen = [], {"epoch": -1, "k": 0}

        def record(early_stop):
            f = train_locals()
            seen["k"] = seen["k"] + 1 if f["epoch"] == seen["epoch"] else 0
            seen["epoch"] = f["epoch"]
            kl = float(f["approx_kl_div"])  # k3 (ppo_mask.py:394), sb3's only KL estimate
            recs.append({"loss": f["loss"].item(), "policy_loss": f["policy_loss"].item(),
                         "value_loss": f["value_loss"].item(), "entropy": -f["entropy_loss"].item(),
                         "approx_kl": kl, "k3_kl": kl, "clip_fraction": f["clip_fraction"],
                         "ratio_mean": f["ratio"].mean().item(),
                         "ratio_std": f["ratio"].std().item() if f["ratio"].numel() > 1 else 0.0,
                         "log_prob_min": f["log_prob"].min().item(), "epoch": f["epoch"],
                         "minibatch": seen["k"], "early_stop": early_stop})

        def hook(key=None):  # zero_grad (every stepped minibatch) or the first log after the loop
            if key is None:
                record(False)
                optimizer.zero_grad()
            elif key == "train/entropy_loss" and train_locals()["continue_training"] is False:
                record(True)  # the minibatch that tripped 1.5·target_kl (ppo_mask.py:397) took no step

        run_train(actor, critic, optimizer, batch, hook, epochs=epochs, minibatch_size=minibatch_size,
                  normalize=False, clip_eps=clip_eps, vf_coef=vf_coef, ent_coef=ent_coef,
                  max_grad_norm=max_grad_norm, target_kl=target_kl)
        return recs

    def normalize_advantages(advantage, *, eps=1e-8, clamp=None):
        if eps != 1e-8 or clamp is not None:  # hard-coded `std() + 1e-8`, no clamp (ppo_mask.py:349)
            raise NotApplicable("MaskablePPO normalises with eps 1e-8 and no clamp")
        n, got = advantage.shape[0], {}

        def hook(key=None):  # stop train() at its first zero_grad: nothing is stepped
            if key is None:
                f = train_locals()
                rows = f["rollout_data"].observations.long().flatten()  # the buffer's shuffled row order
                got["adv"] = torch.empty_like(f["advantages"]).index_copy_(0, rows, f["advantages"])
                raise Stop

        batch = {"obs": torch.zeros(n, 1), "action": torch.zeros(n, dtype=torch.long), "old_log_prob": torch.zeros(n),
                 "mask": torch.ones(n, 1, dtype=torch.bool), "advantage": advantage, "return": torch.zeros(n)}
        try:
            run_train(lambda x: torch.zeros(len(x), 1), lambda x: torch.zeros(len(x)), None, batch, hook,
                      epochs=1, minibatch_size=n, normalize=True)
        except Stop:
            pass
        return got["adv"]

    def losses(actor, critic, batch, *, clip_eps=0.2, vf_coef=0.5, ent_coef=0.01):
        got = {}

        def hook(key=None):  # train() builds every loss term before its zero_grad: keep them, stop it there
            if key is None:
                got.update(train_locals())
                raise Stop

        n = batch["action"].shape[0]
        try:
            run_train(actor, critic, None, batch, hook, epochs=1, minibatch_size=n, normalize=False,
                      clip_eps=clip_eps, vf_coef=vf_coef, ent_coef=ent_coef)
        except Stop:
            pass
        dt = got["policy_loss"].dtype
        return {"loss_objective": got["policy_loss"], "loss_critic": vf_coef * got["value_loss"],
                "loss_entropy": ent_coef * got["entropy_loss"], "entropy": -got["entropy_loss"].detach(),
                "clip_fraction": torch.tensor(got["clip_fraction"], dtype=dt),
                "kl_approx": torch.tensor(float(got["approx_kl_div"]), dtype=dt)}  # the terms of ppo_mask.py:386

    def gae(reward, value, next_value, done, *, gamma, lam, truncated=None):
        r, v, nv, d = (x.reshape(-1, x.shape[-1]).T.detach() for x in (reward, value, next_value, done))
        d = d.bool()  # [T, envs], the buffer's layout
        # the buffer takes V(s_{t+1}) from the next row (buffers.py:432): only consistent rollouts are representable
        if not torch.equal(nv[:-1][~d[:-1]], v[1:][~d[:-1]]):
            raise NotApplicable("SB3's buffer takes V(s_{t+1}) from the next row: next_value must equal value[t+1]")
        T, envs = r.shape
        buf = MaskableRolloutBuffer(T, gym.spaces.Discrete(1), gym.spaces.Discrete(1), gamma=gamma,
                                    gae_lambda=lam, n_envs=envs)
        for t in range(T):  # episode_start[t + 1] = done[t] is how the buffer learns of an episode end
            buf.add(np.zeros((envs, 1)), np.zeros((envs, 1)), r[t].numpy(),
                    d[t - 1].numpy() if t else np.zeros(envs), v[t], torch.zeros(envs))
        buf.compute_returns_and_advantage(nv[-1], d[-1].numpy())
        back = lambda a: torch.as_tensor(a).T.reshape(reward.shape)  # noqa: E731
        return back(buf.advantages), back(buf.returns)

    dist_ops = distribution_ops(lambda logits, mask: MaskableCategorical(logits=logits, masks=mask))

    class Box(gym.Env):  # SAC builds its policy and buffer from an env's (continuous) spaces; nothing is stepped
        observation_space = action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def temperature_loss(log_alpha, entropy, target_entropy):
        tgt = target_entropy.reshape(-1)
        if tgt.numel() and not bool((tgt == tgt[0]).all()):
            raise NotApplicable("SB3's target entropy is one float for every state (sac.py:172-178)")
        model = SAC("MlpPolicy", Box(), ent_coef="auto", target_entropy=float(tgt[0]) if tgt.numel() else 0.0,
                    buffer_size=1, learning_starts=0, device="cpu")
        model.set_logger(types.SimpleNamespace(record=lambda *a, **k: None))  # public setter
        model.log_ent_coef = log_alpha  # the tensor train() differentiates (sac.py:192, :240)
        # :231, see the module docstring; in SB3 the log-prob and log_ent_coef share the policy's dtype, never mixed
        log_prob = -entropy.to(log_alpha.dtype)
        model.actor.action_log_prob = lambda obs: (torch.zeros(entropy.shape[0], 1), log_prob)
        got = {}

        def zero_grad():  # the coefficient optimiser's zero_grad (:250): the loss is built, nothing stepped
            got["loss"] = train_locals(SAC.train.__code__)["ent_coef_loss"]
            raise Stop

        model.ent_coef_optimizer = types.SimpleNamespace(zero_grad=zero_grad, param_groups=[])  # no lr schedule
        z = np.zeros((1, 1), np.float32)
        model.replay_buffer.add(z, z, z, np.zeros(1), np.zeros(1), [{}])  # train() samples one (unused) row
        try:
            model.train(gradient_steps=1, batch_size=1)
        except Stop:
            pass
        return got["loss"]

    def soft_update(target, online, *, tau):
        # common/utils.py polyak_update: target.mul_(1 - tau), then add tau * online in place, under no_grad; what
        # SAC.train() runs on its critic's parameters (sac.py:294). On a copy: the caller's target is left as given
        out = target.detach().clone()
        polyak_update([online.detach()], [out], tau)
        return out

    capabilities = {
        "dtypes": ["float32"],  # rollout buffers are float32 numpy arrays (SB3 buffers.py:391-399)
        # losses: train()'s own tensors; ppo_update's numbers are logged floats; GAE runs in numpy (buffers.py:403)
        "differentiable": ["ppo.masked_distribution", "ppo.evaluate_actions", "ppo.losses", "sac.temperature_loss"],
        "terminated_truncated": False,  # one done flag; truncation is folded into the reward (ppo_mask.py:251)
        "conventions": {
            "mask_fill": "finite",  # -1e8 (distributions.py:59)
            "approx_kl": "k3",  # mean((r - 1) - log r), ppo_mask.py:394
            "value_loss_factor": 1.0,  # F.mse_loss, the 1/2 is vf_coef=0.5 (ppo_mask.py:374)
            "grad_clip_scope": "global",  # one clip_grad_norm_ over policy.parameters() (ppo_mask.py:407)
            "kl_stop_factor": 1.5,  # approx_kl_div > 1.5 * target_kl (ppo_mask.py:397)
            "neg_inf_logits": "accept",  # torch Categorical semantics: a -inf logit is probability 0
            "target_entropy": "scalar",  # SAC: one float, -dim(A) or the number given (sac.py:172-178)
        },
    }
    ppo = types.SimpleNamespace(**dist_ops, ppo_update=ppo_update, losses=losses,
                                normalize_advantages=normalize_advantages, gae=gae)
    return types.SimpleNamespace(name="sb3-contrib MaskablePPO, SB3 SAC", version=sb3_contrib.__version__,
                                 capabilities=capabilities, ppo=ppo,
                                 sac=types.SimpleNamespace(temperature_loss=temperature_loss, soft_update=soft_update))
