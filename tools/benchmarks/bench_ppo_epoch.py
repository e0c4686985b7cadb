"""Masked PPO epoch: the reference ``ppo_update`` against sb3-contrib ``MaskablePPO.train()``.

Workload: one epoch over N 4096 stored rows in minibatches of 128: observation 64 floats, 64
actions (about half legal per row), clip 0.2, value coefficient 0.5, no entropy bonus, gradient
clip 0.5, Adam 3e-4 (sb3's own; the reference's trainers use fused Adam), no KL stop, advantages given (sb3's per-minibatch normalisation off). Same
network on both sides: sb3's default ``MlpPolicy`` (separate 64-64 tanh actor and critic MLPs, linear
heads) and the reference ``Actor``/``Critic`` of the same shapes. sb3 gets its rows in its own
``MaskableRolloutBuffer``; the reference gets the same rows as tensors, guards off after one
validated update, as the trainers run.

One process, one torch thread, the two sides interleaved round by round; samples/s from the median
thread CPU time of an epoch (wall time around a synchronised stream on a GPU).

Run: ``python -m tools.benchmarks.bench_ppo_epoch [--device cpu] [--rounds 7]``
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from reference_impl import _checks
from reference_impl.ppo.fast import minibatch_loss_fused
from reference_impl.ppo.nets import Actor, Critic
from reference_impl.ppo.trainer import make_optimizer
from reference_impl.ppo.update import ppo_update
from tools.benchmarks import _common as C

N, MB, OBS, A = 4096, 128, 64, 64
HP = dict(clip_eps=0.2, vf_coef=0.5, ent_coef=0.0, max_grad_norm=0.5, target_kl=None)
LR = 3e-4


def rows(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(N, A, generator=g) < 0.5
    mask[:, 0] = True
    logits = torch.randn(N, A, generator=g) * 0.1
    logp_all = torch.log_softmax(logits.masked_fill(~mask, -1e9), -1)
    action = torch.multinomial(logp_all.exp(), 1, generator=g).squeeze(1)
    return {"obs": torch.randn(N, OBS, generator=g), "action": action, "mask": mask,
            "old_log_prob": logp_all.gather(1, action[:, None]).squeeze(1),
            "advantage": torch.randn(N, generator=g), "return": torch.randn(N, generator=g)}


def reference_epoch(device, **overrides):
    """One epoch of the reference update (``overrides``: hyper-parameters, e.g. a target_kl)."""
    hp = {**HP, **overrides}
    torch.manual_seed(0)
    actor, critic = Actor(OBS, A).to(device), Critic(OBS).to(device)
    opt = make_optimizer([*actor.parameters(), *critic.parameters()], lr=LR)  # as the trainers build it
    batch = {k: v.to(device) for k, v in rows().items()}
    gen = torch.Generator(device=device).manual_seed(0)
    with _checks.validation(True):  # the first update validated, as the trainers do
        ppo_update(actor, critic, opt, batch, epochs=1, minibatch_size=MB, generator=gen,
                   minibatch_loss=minibatch_loss_fused, **hp)

    def epoch():  # the fused loss and guards off after the first batch, as the trainers run
        with _checks.validation(False):
            return ppo_update(actor, critic, opt, batch, epochs=1, minibatch_size=MB, generator=gen,
                              minibatch_loss=minibatch_loss_fused, **hp)
    return epoch


def sb3_epoch(device):
    import gymnasium as gym
    from sb3_contrib import MaskablePPO

    class Spaces(gym.Env):  # MaskablePPO sizes its buffer from an env's spaces; nothing is stepped
        observation_space = gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32)
        action_space = gym.spaces.Discrete(A)

    torch.manual_seed(0)
    model = MaskablePPO("MlpPolicy", Spaces(), n_steps=N, batch_size=MB, n_epochs=1, learning_rate=LR,
                        clip_range=HP["clip_eps"], vf_coef=HP["vf_coef"], ent_coef=HP["ent_coef"],
                        max_grad_norm=HP["max_grad_norm"], target_kl=None, normalize_advantage=False,
                        device=device, policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}})
    model.set_logger(_NullLogger())
    r = rows()
    buf = model.rollout_buffer
    buf.observations[:, 0] = r["obs"].numpy()
    buf.actions[:, 0, 0] = r["action"].numpy()
    buf.log_probs[:, 0] = r["old_log_prob"].numpy()
    buf.action_masks[:, 0] = r["mask"].numpy()
    buf.advantages[:, 0], buf.returns[:, 0] = r["advantage"].numpy(), r["return"].numpy()
    buf.values[:, 0] = 0.0
    buf.pos, buf.full = N, True
    return model.train


class _NullLogger:
    def record(self, *a, **k):
        pass


SIDES = {"reference": reference_epoch, "sb3_contrib": sb3_epoch}


def main(argv=None) -> dict:
    ap = C.parser(__doc__)
    ap.set_defaults(rounds=7)
    args = ap.parse_args(argv)
    C.one_thread()
    dev = torch.device(args.device)
    epochs = {name: make(dev) for name, make in SIDES.items()}
    times = C.interleave(epochs, args.rounds, dev)
    med = {n: C.median(t) for n, t in times.items()}
    rate = {n: N / med[n] for n in med}
    res = {"benchmark": "ppo_epoch", "device": str(dev), "rounds": args.rounds,
           "shape": {"N": N, "minibatch": MB, "obs": OBS, "actions": A}, "median_s": med, "times_s": times,
           "samples_per_s": rate, "ratio": rate["reference"] / rate["sb3_contrib"],
           "packages": ["sb3_contrib", "stable_baselines3"]}
    path = C.write(f"ppo_epoch_{dev.type}", res, args.json)
    print(f"masked PPO epoch [N {N}, minibatch {MB}]: reference {rate['reference']:,.0f} samples/s, "
          f"sb3-contrib {rate['sb3_contrib']:,.0f} samples/s; reference/sb3 = {res['ratio']:.2f}x\nwrote {path}")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
