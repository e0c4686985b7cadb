"""Masked PPO on PettingZoo connect four against a uniformly random legal opponent.

Reads top to bottom: the config, then :func:`train` (rollout with the sampling mask cached per
sample, GAE, the PPO update on the same masks and actions, metrics, checkpoint). Every math step
calls the family's pure functions and names its clause. ``rlconform train ppo --updates N --out DIR``.

Each update starts from freshly reset boards seeded by ``(seed, update)`` and every random draw
comes from one saved ``torch.Generator``, so a run resumed from a checkpoint replays the same
updates it would have run without the interruption.

Data-parallel: ``torchrun --nproc_per_node N -m reference_impl.ppo.trainer ...`` runs N processes
(DDP; gloo on CPU, NCCL with ``--device cuda``). Each plays its own ``n_envs`` boards with its own
seed, advantages are normalised over all ranks' samples, DDP averages the gradients of each
minibatch (``minibatch_size`` samples per process) and rank 0 writes metrics and checkpoints.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import torch

from reference_impl.common import RunDir, add_config_flags, arg, config_overrides, progress, seed_everything
from reference_impl.common import distributed as ddp
from reference_impl.ppo.defaults import defaults
from reference_impl.ppo.envs import ConnectFourVsRandom
from reference_impl.ppo.fast import minibatch_loss_fused
from reference_impl.ppo.gae import gae
from reference_impl.ppo.losses import entropy_ratio, normalize_advantages
from reference_impl.ppo.masking import evaluate_actions, sample_actions
from reference_impl.ppo.nets import Actor, Critic
from reference_impl._checks import validation
from reference_impl.ppo.update import ppo_update

DEFAULTS = defaults()  # the document's numbers (PPO-DEFAULT-*)


@dataclass
class PPOHyper:
    """The update's hyper-parameters, shared by the masked-PPO and the MAPPO trainer."""

    seed: int = arg(1, "seed of torch, numpy and the environments")
    device: str = arg("cpu", "torch device of the networks and the update tensors (cuda: cuda:LOCAL_RANK per process)")
    dtype: str = arg("float32", "dtype of the networks, the rollout buffers and the update (float32, float64, bfloat16)")
    torch_threads: int = arg(1, "torch intra-op threads (small networks on a shared CPU run best on one)")
    lr: float = arg(5.0e-3, "Adam learning rate (actor and critic)")
    gamma: float = arg(0.99, "discount factor of GAE")
    gae_lambda: float = arg(0.95, "lambda of GAE")
    epochs: int = arg(4, "passes over the batch per update")
    minibatch_size: int = arg(128, "samples per gradient step (per process under torchrun)")
    clip_eps: float = arg(DEFAULTS["clip_eps"], "PPO clip range epsilon")
    vf_coef: float = arg(0.5, "weight of the value loss in the total loss")
    ent_coef: float = arg(0.01, "weight of the entropy bonus in the total loss")
    max_grad_norm: float = arg(0.5, "gradient-norm clip (actor and critic each)")
    target_kl: float = arg(DEFAULTS["target_kl"], "KL guard: the update stops once approx_kl exceeds twice this")
    adv_eps: float = arg(DEFAULTS["adv_eps"], "epsilon of the batch advantage normalisation")
    adv_clamp: float = arg(DEFAULTS["adv_clamp"], "normalised advantages are clamped to [-adv_clamp, adv_clamp]")
    checkpoint_every: int = arg(5, "updates between checkpoints (the last update always checkpoints)")


@dataclass
class PPOConfig(PPOHyper):
    n_envs: int = arg(16, "boards played in parallel (per process under torchrun)")
    rollout_steps: int = arg(32, "learner moves per board per update (batch = n_envs * rollout_steps)")
    hidden: int = arg(128, "width of the two hidden layers of actor and critic")
    ent_coef: float = arg(0.07, "weight of the entropy bonus (high enough to keep clip_fraction in its SLO range)")


SMOKE = {"n_envs": 4, "rollout_steps": 16, "minibatch_size": 32, "epochs": 2}  # --smoke: a run of seconds


def train(cfg: PPOConfig, *, out: str, updates: int, resume: bool = False) -> RunDir:
    """Train until ``updates`` updates are done in total (a resumed run continues its count)."""
    d = ddp.setup(cfg.device)  # one process, or this rank of a torchrun job
    device, dtype = d.device, ddp.resolve_dtype(cfg.dtype)
    torch.set_num_threads(cfg.torch_threads)
    seed_everything(cfg.seed)  # network initialisation: the same on every rank
    seed = ddp.rank_seed(cfg.seed, d.rank)
    gen = torch.Generator(device).manual_seed(seed)  # every later draw: sampling and minibatch order
    env = ConnectFourVsRandom(cfg.n_envs)
    actor = Actor(env.obs_dim, env.n_actions, cfg.hidden).to(device, dtype)
    critic = Critic(env.obs_dim, cfg.hidden).to(device, dtype)
    optimizer = make_optimizer([*actor.parameters(), *critic.parameters()], lr=cfg.lr)
    run = RunDir(out, family="ppo", config=ddp.portable_config(cfg), resume=resume, writer=d.is_writer)
    start, env_steps = restore(run.load() if resume else None, actor, critic, optimizer, gen, d, reseed=seed)
    ddp_actor, ddp_critic = ddp.wrap(actor, d), ddp.wrap(critic, d)  # the update's forwards: gradients averaged

    T, N = cfg.rollout_steps, cfg.n_envs
    for update in progress(range(start + 1, updates + 1), total=updates, initial=start, desc="ppo",
                           disable=None if d.is_writer else True):
        t0 = time.time()
        # --- rollout: the mask, action and detached log-prob of each move are cached together ---
        obs_buf = torch.zeros(T, N, env.obs_dim, device=device, dtype=dtype)
        mask_buf = torch.zeros(T, N, env.n_actions, dtype=torch.bool, device=device)
        act_buf = torch.zeros(T, N, dtype=torch.long, device=device)
        logp_buf, val_buf, rew_buf, done_buf = (torch.zeros(T, N, device=device, dtype=dtype) for _ in range(4))
        results: list[float] = []
        obs_np, mask_np = env.reset(seed=[seed, update])
        for t in range(T):
            obs = torch.as_tensor(obs_np, device=device, dtype=dtype)
            mask = torch.as_tensor(mask_np, device=device)
            with torch.no_grad():
                action, old_logp = sample_actions(actor(obs), mask, generator=gen)  # PPO-MASK-1, PPO-MASK-2, PPO-OLD-1
                value = critic(obs)
            obs_buf[t], mask_buf[t], act_buf[t], logp_buf[t], val_buf[t] = obs, mask, action, old_logp, value
            obs_np, mask_np, rew, done, finished = env.step(action.cpu().numpy())  # one transfer per step
            rew_buf[t] = torch.as_tensor(rew, device=device, dtype=dtype)
            done_buf[t] = torch.as_tensor(done, device=device, dtype=dtype)
            results += finished
        with torch.no_grad():
            last_value = critic(torch.as_tensor(obs_np, device=device, dtype=dtype))
        advantage, returns = gae(rew_buf, val_buf, done_buf, last_value,
                                 gamma=cfg.gamma, lam=cfg.gae_lambda)  # standard GAE(λ) with (1 − done)
        advantage = ddp.on_global_batch(  # PPO-ADV-1, PPO-ADV-2, over the samples of all ranks
            lambda a: normalize_advantages(a, eps=cfg.adv_eps, clamp=cfg.adv_clamp), advantage.flatten(), d)

        # --- update: replay the same masks and actions against the cached old log-probs ---
        batch = {"obs": obs_buf.flatten(0, 1), "mask": mask_buf.flatten(0, 1), "action": act_buf.flatten(),
                 "old_log_prob": logp_buf.flatten(), "advantage": advantage, "return": returns.flatten()}
        with validation(update == start + 1):  # guards on the first batch only: the hot loop runs without syncs
            stats = update_with(cfg, ddp_actor, ddp_critic, optimizer, batch, gen, d)
        env_steps += T * N * d.world_size

        # --- metrics (over all ranks, written by rank 0) and checkpoint ---
        res = np.array(sum(ddp.gather_objects(results, d), []))
        run.log(update=update, **summarize(stats, actor, batch, d), episodes=len(res), **{"return": mean_or_nan(res)},
                win_rate=mean_or_nan(res > 0), loss_rate=mean_or_nan(res < 0), env_steps=env_steps,
                seconds=time.time() - t0)
        if update % cfg.checkpoint_every == 0 or update == updates:
            run.save(checkpoint(update, env_steps, actor, critic, optimizer, ddp.rng_states(d, gen)))
    return run


# --- shared with the MAPPO trainer ------------------------------------------------------------

def make_optimizer(params, *, lr: float) -> torch.optim.Optimizer:
    """Adam (eps 1e-5) for both trainers, fused where torch has the kernel (CPU and CUDA floats): one
    kernel per step instead of a dozen small ops per parameter, the same update rule."""
    params = list(params)
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.Adam(params, lr=lr, eps=1e-5, fused=fused or None)


MINIMA = ("log_prob_min",)  # metrics reduced by min over minibatches and ranks (a minimum stays a minimum)


def update_with(cfg: PPOHyper, actor, critic, optimizer, batch: dict, gen: torch.Generator, d: ddp.Dist) -> list[dict]:
    """The PPO update of both trainers, its hyper-parameters from the shared config (metrics synced over ranks)."""
    return ppo_update(actor, critic, optimizer, batch, epochs=cfg.epochs, minibatch_size=cfg.minibatch_size,
                      clip_eps=cfg.clip_eps, vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef,
                      max_grad_norm=cfg.max_grad_norm, target_kl=cfg.target_kl, generator=gen,
                      sync_metrics=ddp.metrics_sync(d, minimum=MINIMA), minibatch_loss=minibatch_loss_fused
                      )  # PPO-UPDATE-1..4, PPO-MASK-3, PPO-OLD-1, PPO-KLSTOP-1/2, PPO-GRAD-1


def summarize(stats: list[dict], actor, batch: dict, d: ddp.Dist = ddp.Dist()) -> dict:
    """One update's record: minibatch means of ``ppo_update``'s metrics, plus ``entropy_ratio``,
    averaged over the ranks of a data-parallel run (``actor``: the bare module, not its DDP wrapper).

    ``entropy_ratio`` is that of the updated policy on the batch's states and legal sets: 1 while
    the policy is uniform on every legal set (the stuck state of the seed's §0), lower once it
    prefers some actions.
    """
    rec = {k: float(np.mean([s[k] for s in stats])) for k in stats[0] if k not in ("epoch", "minibatch", "early_stop")}
    if "log_prob_min" in stats[0]:  # a minimum stays a minimum (PPO-SLO-5)
        rec["log_prob_min"] = float(min(s["log_prob_min"] for s in stats))
    rec["ratio_mean_first"] = float(stats[0]["ratio_mean"])  # PPO-UPDATE-1: exactly 1 before the first step
    with torch.no_grad():
        _, entropy = evaluate_actions(actor(batch["obs"]), batch["mask"], batch["action"])  # PPO-ENT-1
        rec["entropy_ratio"] = float(entropy_ratio(entropy, batch["mask"]))  # PPO-SLO-4
    rec["early_stop"] = bool(stats[-1]["early_stop"])
    rec["epochs_run"] = int(stats[-1]["epoch"]) + 1
    rec["minibatches"] = len(stats)
    return ddp.reduce_metrics(rec, d, minimum=MINIMA)


def mean_or_nan(x) -> float:
    """Mean of a metric over the episodes that ended in this update (NaN when none did)."""
    return float(np.mean(x)) if len(x) else float("nan")


def checkpoint(update: int, env_steps: int, actor, critic, optimizer, rng: list[dict], **extra) -> dict:
    """Everything needed to continue the run as if it had not stopped (``rng``: every rank's random state)."""
    return {"update": update, "env_steps": env_steps, "actor": actor.state_dict(), "critic": critic.state_dict(),
            "optimizer": optimizer.state_dict(), "rng": rng, **extra}


def restore(ckpt: dict | None, actor, critic, optimizer, gen: torch.Generator, d: ddp.Dist, *,
            reseed: int) -> tuple[int, int]:
    """Load a :func:`checkpoint` (if any) onto this run's device; returns ``(updates done, env steps done)``."""
    if ckpt is None:
        return 0, 0
    actor.load_state_dict(ckpt["actor"])  # tensors were loaded on the CPU; load_state_dict copies them over
    critic.load_state_dict(ckpt["critic"])
    optimizer.load_state_dict(ckpt["optimizer"])  # Adam moments follow the parameters' device and dtype
    ddp.restore_rng(ckpt["rng"], d, gen, reseed=reseed)
    return int(ckpt["update"]), int(ckpt["env_steps"])


def config_parser(config_cls, prog: str, doc: str) -> argparse.ArgumentParser:
    """``--updates/--out/--resume/--smoke`` plus one flag per config field (help = its description)."""
    p = argparse.ArgumentParser(prog=prog, description=doc.strip().splitlines()[0])
    p.add_argument("--updates", type=int, required=True, help="total number of updates (a resumed run counts on)")
    p.add_argument("--out", required=True, help="run directory (config.json, metrics.jsonl, checkpoint.pt)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--smoke", action="store_true", help="tiny rollouts and batches: a run of a few seconds")
    add_config_flags(p, config_cls)
    return p


def config_from_args(config_cls, args, smoke: dict):
    overrides = dict(smoke) if args.smoke else {}
    overrides.update(config_overrides(args, config_cls))
    return config_cls(**overrides)


def cli(argv: list[str]) -> int:
    args = config_parser(PPOConfig, "rlconform train ppo", __doc__).parse_args(argv)
    run = train(config_from_args(PPOConfig, args, SMOKE), out=args.out, updates=args.updates, resume=args.resume)
    ddp.teardown()
    if not run.writer:
        return 0
    last = run.metrics()[-1] if run.metrics() else {}
    print(f"ppo: {last.get('update', 0)} updates, win_rate {last.get('win_rate', float('nan')):.3f}, "
          f"approx_kl {last.get('approx_kl', float('nan')):.4f}; metrics in {run.metrics_path}")
    return 0


if __name__ == "__main__":  # torchrun --nproc_per_node N -m reference_impl.ppo.trainer --updates U --out DIR
    import sys

    ddp.exit_process(cli(sys.argv[1:]))
