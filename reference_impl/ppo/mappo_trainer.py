"""MAPPO with a centralised critic on CoopGrid, a cooperative ParallelEnv with per-agent masks.

Reads top to bottom: the config, then :func:`train`. One actor is shared by all agents (it sees
each agent's own observation and masks with that agent's own mask); the critic sees the global
state and the agent's id. Every sample carries its key ``(episode_id, timestep, agent_id)`` and the
batch is aligned by that key before the update, so actor observation, critic state, mask, action,
old log-prob, advantage and return of one (episode, step, agent) stay together.
``rlconform train mappo --updates N --out DIR``; metric ``return`` is the team return per episode.

A time-out ends an episode as a cover does: GAE neither bootstraps from nor carries past it. PPO-GAE-2's
truncation bootstrap is for limits outside the task; here ``max_cycles`` is part of it, and actor and critic
both observe the time left, so after a time-out there is no return left to estimate.
Data-parallel under ``torchrun --nproc_per_node N -m reference_impl.ppo.mappo_trainer ...`` as the
masked-PPO trainer is (see :mod:`reference_impl.ppo.trainer`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from reference_impl._checks import validation
from reference_impl.common import RunDir, progress, seed_everything
from reference_impl.common import distributed as ddp
from reference_impl.ppo.envs import CoopGridEnv
from reference_impl.ppo.gae import gae
from reference_impl.ppo.losses import normalize_advantages
from reference_impl.ppo.mappo import align_batch
from reference_impl.ppo.masking import sample_actions
from reference_impl.ppo.nets import Actor, Critic
from reference_impl.ppo.trainer import (PPOHyper, arg, checkpoint, config_from_args, config_parser, make_optimizer,
                                        mean_or_nan, restore, summarize, update_with)


@dataclass
class MAPPOConfig(PPOHyper):
    n_agents: int = arg(2, "agents (and targets) per grid")
    grid_size: int = arg(5, "side of the square grid")
    max_cycles: int = arg(25, "steps before an episode is truncated")
    n_envs: int = arg(16, "grids played in parallel (per process under torchrun)")
    rollout_steps: int = arg(50, "steps per grid per update (samples = n_envs * rollout_steps * n_agents)")
    hidden: int = arg(64, "width of the two hidden layers of actor and critic")
    minibatch_size: int = arg(320, "samples per gradient step (per process under torchrun)")


SMOKE = {"n_envs": 4, "rollout_steps": 25, "minibatch_size": 50, "epochs": 2}  # --smoke: a run of seconds


def train(cfg: MAPPOConfig, *, out: str, updates: int, resume: bool = False) -> RunDir:
    """Train until ``updates`` updates are done in total (a resumed run continues its count)."""
    d = ddp.setup(cfg.device)  # one process, or this rank of a torchrun job
    device, dtype = d.device, ddp.resolve_dtype(cfg.dtype)
    torch.set_num_threads(cfg.torch_threads)
    seed_everything(cfg.seed)  # network initialisation: the same on every rank
    seed = ddp.rank_seed(cfg.seed, d.rank)
    gen = torch.Generator(device).manual_seed(seed)  # every later draw: sampling and minibatch order
    envs = [CoopGridEnv(size=cfg.grid_size, n_agents=cfg.n_agents, max_cycles=cfg.max_cycles) for _ in range(cfg.n_envs)]
    agents, M, A = envs[0].possible_agents, cfg.n_agents, envs[0].action_space("agent_0").n
    obs_dim, critic_dim = envs[0].obs_dim, envs[0].state_dim + M  # critic: global state ‖ one-hot agent id
    actor = Actor(obs_dim, A, cfg.hidden).to(device, dtype)
    critic = Critic(critic_dim, cfg.hidden).to(device, dtype)
    optimizer = make_optimizer([*actor.parameters(), *critic.parameters()], lr=cfg.lr)
    run = RunDir(out, family="ppo", config=ddp.portable_config(cfg), resume=resume, writer=d.is_writer)
    ckpt = run.load() if resume else None
    start, env_steps = restore(ckpt, actor, critic, optimizer, gen, d, reseed=seed)
    ddp_actor, ddp_critic = ddp.wrap(actor, d), ddp.wrap(critic, d)  # the update's forwards: gradients averaged
    # episode ids stay unique across updates and ranks: rank r numbers its episodes r, r + W, r + 2W, ...
    next_episode = ckpt["next_episode"] if ckpt else 0
    agent_onehot = torch.eye(M, device=device, dtype=dtype)

    T, N = cfg.rollout_steps, cfg.n_envs
    for update in progress(range(start + 1, updates + 1), total=updates, initial=start, desc="mappo",
                           disable=None if d.is_writer else True):
        t0 = time.time()
        # --- rollout: per (step, grid, agent) the own obs, global state, own mask, action, old log-prob ---
        obs_buf = torch.zeros(T, N, M, obs_dim, device=device, dtype=dtype)
        cobs_buf = torch.zeros(T, N, M, critic_dim, device=device, dtype=dtype)
        mask_buf = torch.zeros(T, N, M, A, dtype=torch.bool, device=device)
        act_buf = torch.zeros(T, N, M, dtype=torch.long, device=device)
        logp_buf, val_buf, rew_buf, done_buf = (torch.zeros(T, N, M, device=device, dtype=dtype) for _ in range(4))
        key_buf = np.zeros((3, T, N, M), dtype=np.int64)  # episode_id, timestep, agent_id: host-side, one transfer
        seeds = np.random.SeedSequence([seed, update]).generate_state(N).tolist()  # fresh grids per update
        obs_d = [env.reset(seed=s)[0] for env, s in zip(envs, seeds)]
        episode, next_episode = episode_ids(next_episode, N, d)
        step_in_ep = np.zeros(N, dtype=np.int64)
        team_return, finished, covered = np.zeros(N), [], []
        for t in range(T):
            obs = torch.as_tensor(np.stack([[o[a]["observation"] for a in agents] for o in obs_d]), device=device,
                                  dtype=dtype)
            mask = torch.as_tensor(np.stack([[o[a]["action_mask"] for a in agents] for o in obs_d]),
                                   device=device).bool()  # each agent's own mask, never broadcast (PPO-MAPPO-4)
            cobs = critic_inputs(envs, agent_onehot)
            with torch.no_grad():
                action, old_logp = sample_actions(actor(obs.flatten(0, 1)), mask.flatten(0, 1),
                                                  generator=gen)  # PPO-MASK-1, PPO-MASK-2, PPO-OLD-1
                value = critic(cobs.flatten(0, 1))
            obs_buf[t], cobs_buf[t], mask_buf[t] = obs, cobs, mask
            act_buf[t], logp_buf[t], val_buf[t] = action.view(N, M), old_logp.view(N, M), value.view(N, M)
            key_buf[0, t], key_buf[1, t], key_buf[2, t] = episode[:, None], step_in_ep[:, None], np.arange(M)
            act_np = action.view(N, M).cpu().numpy()  # one transfer per step; the envs are Python objects
            rew, done = np.zeros(N, dtype=np.float32), np.zeros(N, dtype=np.float32)
            for i, env in enumerate(envs):
                obs_d[i], r, term, _, _ = env.step(dict(zip(agents, act_np[i].tolist())))
                rew[i] = r[agents[0]]  # the team reward, the same for every agent
                team_return[i] += rew[i]
                step_in_ep[i] += 1
                if not env.agents:  # episode over (covered or truncated): log it, start the next with a new id
                    done[i] = 1.0
                    finished.append(team_return[i])
                    covered.append(bool(term[agents[0]]))
                    (episode[i],), next_episode = episode_ids(next_episode, 1, d)
                    team_return[i], step_in_ep[i] = 0.0, 0
                    obs_d[i] = env.reset()[0]
            rew_buf[t] = torch.as_tensor(rew, device=device, dtype=dtype)[:, None]
            done_buf[t] = torch.as_tensor(done, device=device, dtype=dtype)[:, None]
        with torch.no_grad():
            last_value = critic(critic_inputs(envs, agent_onehot).flatten(0, 1)).view(N, M)
        advantage, returns = gae(rew_buf, val_buf, done_buf, last_value,
                                 gamma=cfg.gamma, lam=cfg.gae_lambda)  # standard GAE(λ) with (1 − done)
        advantage = ddp.on_global_batch(  # PPO-ADV-1, PPO-ADV-2, over the samples of all ranks
            lambda a: normalize_advantages(a, eps=cfg.adv_eps, clamp=cfg.adv_clamp), advantage, d)

        # --- update: samples keyed by (episode_id, timestep, agent_id), aligned, then the PPO update ---
        batch = align_batch({  # PPO-MAPPO-1, PPO-MAPPO-2, PPO-MAPPO-4
            "obs": obs_buf.flatten(0, 2), "critic_obs": cobs_buf.flatten(0, 2), "mask": mask_buf.flatten(0, 2),
            "action": act_buf.flatten(), "old_log_prob": logp_buf.flatten(), "advantage": advantage.flatten(),
            "return": returns.flatten(), **dict(zip(("episode_id", "timestep", "agent_id"),
                                                    torch.as_tensor(key_buf, device=device).flatten(1)))})
        with validation(update == start + 1):  # guards on the first batch only: the hot loop runs without syncs
            stats = update_with(cfg, ddp_actor, ddp_critic, optimizer, batch, gen, d)
        env_steps += T * N * d.world_size

        # --- metrics (over all ranks, written by rank 0) and checkpoint ---
        finished, covered = (sum(ddp.gather_objects(x, d), []) for x in (finished, covered))
        run.log(update=update, **summarize(stats, actor, batch, d), episodes=len(finished),
                **{"return": mean_or_nan(finished)}, cover_rate=mean_or_nan(covered),
                env_steps=env_steps, seconds=time.time() - t0)
        if update % cfg.checkpoint_every == 0 or update == updates:
            run.save(checkpoint(update, env_steps, actor, critic, optimizer, ddp.rng_states(d, gen),
                                next_episode=next_episode))
    return run


def episode_ids(next_id: int, n: int, d: ddp.Dist) -> tuple[np.ndarray, int]:
    """``n`` fresh episode ids for this rank and the next free one: rank r of W takes ids congruent to
    r mod W, so keys ``(episode_id, timestep, agent_id)`` never collide across ranks (PPO-MAPPO-1)."""
    ids = (next_id + np.arange(n)) * d.world_size + d.rank
    return ids, next_id + n


def critic_inputs(envs: list[CoopGridEnv], agent_onehot: torch.Tensor) -> torch.Tensor:
    """``[N, M, state_dim + M]``: each grid's global state, once per agent, with the agent's one-hot id."""
    state = torch.as_tensor(np.stack([env.state() for env in envs]), device=agent_onehot.device,
                            dtype=agent_onehot.dtype)
    n, m = state.shape[0], agent_onehot.shape[0]
    return torch.cat([state.unsqueeze(1).expand(n, m, -1), agent_onehot.expand(n, m, m)], dim=-1)


def cli(argv: list[str]) -> int:
    args = config_parser(MAPPOConfig, "rlconform train mappo", __doc__).parse_args(argv)
    run = train(config_from_args(MAPPOConfig, args, SMOKE), out=args.out, updates=args.updates, resume=args.resume)
    ddp.teardown()
    if not run.writer:
        return 0
    last = run.metrics()[-1] if run.metrics() else {}
    print(f"mappo: {last.get('update', 0)} updates, team return {last.get('return', float('nan')):.3f}, "
          f"approx_kl {last.get('approx_kl', float('nan')):.4f}; metrics in {run.metrics_path}")
    return 0


if __name__ == "__main__":  # torchrun --nproc_per_node N -m reference_impl.ppo.mappo_trainer --updates U --out DIR
    import sys

    ddp.exit_process(cli(sys.argv[1:]))
