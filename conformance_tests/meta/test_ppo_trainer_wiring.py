"""The PPO and MAPPO trainers' wiring: what the environment produced reaches the update where it belongs.

The contract ops (GAE, masking, the loss) have their own tests; a trainer can still feed them the wrong
things and train badly without an error: a done flag lost on the way to GAE bootstraps through terminal
states, a mask stored one step late differs between sampling and update, a bootstrap value read off the
wrong state, returns of one grid handed to another's samples. Here the real trainer runs two updates while
the environment and the update entry point are spied on. Every sample the update receives is checked
against the recording with plain oracles written in this file: the same observation, mask and action the
environment saw, the sampling policy's masked log-probability (PPO-MASK-1/2, PPO-OLD-1), and GAE's
recursion (PPO-GAE-1) over the recorded rewards and episode ends with the pre-update critic's values,
normalised as PPO-ADV-1/2 state.
"""
from __future__ import annotations

import contextlib
import copy
import json

import numpy as np
import pytest
import torch

from conformance_tests import simdevice
from reference_impl.ppo import mappo_trainer, trainer

pytestmark = pytest.mark.meta
# the trainer's device: the CPU, the simulated GPU (CI's gate for device mistakes), and a real one where present
DEVICES = ["cpu", simdevice.NAME] + (["cuda"] if torch.cuda.is_available() else [])

# adv_clamp 1: the clamp of PPO-ADV-2 bites on a few samples (at the default 5 it never does in a batch this size)
TINY = {"n_envs": 3, "rollout_steps": 12, "minibatch_size": 12, "epochs": 1, "hidden": 16, "adv_clamp": 1.0}
UPDATES = 2


def _spy_updates(monkeypatch, module) -> list[dict]:
    """Record every batch the trainer hands ``update_with``, with host copies of the networks it was sampled by."""
    calls = []
    real = module.update_with

    def spy(cfg, actor, critic, optimizer, batch, gen, d):
        calls.append({"device": {v.device.type for v in batch.values()},
                      "batch": {k: v.detach().cpu().clone() for k, v in batch.items()},
                      "actor": copy.deepcopy(getattr(actor, "module", actor)).cpu(),
                      "critic": copy.deepcopy(getattr(critic, "module", critic)).cpu()})
        return real(cfg, actor, critic, optimizer, batch, gen, d)

    monkeypatch.setattr(module, "update_with", spy)
    return calls


def _train(module, cfg, out, device: str) -> None:
    """Two updates of the trainer on ``device`` (sim: the simulated GPU, the trainer told "cuda")."""
    sim = device == simdevice.NAME
    with (simdevice.simulate() if sim else contextlib.nullcontext()), \
            (simdevice.implementation_call() if sim else contextlib.nullcontext()):
        module.train(cfg, out=str(out), updates=UPDATES)


def _metrics(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _check_episode_metrics(rec: dict, finished: np.ndarray, env_steps: int, **rates) -> None:
    """The update's logged episode figures are those of the episodes that ended in it (``finished``: their returns;
    ``rates``: metric name -> the recorded per-episode outcome it is the share of)."""
    assert rec["episodes"] == len(finished) and rec["env_steps"] == env_steps
    np.testing.assert_allclose(rec["return"], finished.mean(), rtol=1e-6)
    for name, outcome in rates.items():
        assert rec[name] == pytest.approx(np.mean(outcome)), name
    assert rec["ratio_mean_first"] == 1.0  # PPO-UPDATE-1: the first minibatch replays the sampling policy


def _gae(rewards: np.ndarray, values: np.ndarray, last_value: np.ndarray, ended: np.ndarray, *,
         gamma: float, lam: float) -> np.ndarray:
    """PPO-GAE-1 over [T, ...] in float64: no bootstrap and no carry across a step that ended its episode."""
    adv, carry = np.zeros_like(values), np.zeros_like(values[0])
    for t in reversed(range(len(rewards))):
        nxt = last_value if t == len(rewards) - 1 else values[t + 1]
        keep = 1.0 - ended[t]
        carry = rewards[t] + gamma * keep * nxt - values[t] + gamma * lam * keep * carry
        adv[t] = carry
    return adv


def _normalised(adv: np.ndarray, cfg) -> np.ndarray:
    """PPO-ADV-1/2: (A - mean) / (std with Bessel's correction + eps), clamped."""
    return np.clip((adv - adv.mean()) / (adv.std(ddof=1) + cfg.adv_eps), -cfg.adv_clamp, cfg.adv_clamp)


def _masked_log_prob(logits: torch.Tensor, mask: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """PPO-MASK-1/2: log-softmax over the legal actions only."""
    masked = logits.double().masked_fill(~mask, float("-inf"))
    return masked.log_softmax(-1).gather(-1, action[:, None]).squeeze(-1)


def _check_batch(call: dict, rec: dict, cfg, critic_obs: torch.Tensor) -> None:
    """``rec``: the recorded [T, ...] obs, mask, action, reward, ended, and the critic input after the last step."""
    assert call["device"] == {torch.device(cfg.device).type}, "the batch is not on the trainer's device"
    b = call["batch"]
    np.testing.assert_array_equal(b["obs"].numpy(), rec["obs"].reshape(len(b["obs"]), -1))
    np.testing.assert_array_equal(b["mask"].numpy(), rec["mask"].reshape(len(b["mask"]), -1))
    np.testing.assert_array_equal(b["action"].numpy(), rec["action"].reshape(-1))
    assert b["mask"].gather(-1, b["action"][:, None]).all(), "a sampled action is illegal under its stored mask"
    with torch.no_grad():
        logp = _masked_log_prob(call["actor"](b["obs"]), b["mask"], b["action"])
        values = call["critic"](critic_obs[:-1].flatten(0, -2)).double().view(rec["reward"].shape).numpy()
        last = call["critic"](critic_obs[-1]).double().view(rec["reward"].shape[1:]).numpy()
    np.testing.assert_allclose(b["old_log_prob"].double().numpy(), logp.numpy(), rtol=0, atol=1e-5)
    adv = _gae(rec["reward"], values, last, rec["ended"], gamma=cfg.gamma, lam=cfg.gae_lambda)
    np.testing.assert_allclose(b["return"].double().numpy(), (adv + values).reshape(-1), rtol=0, atol=1e-5)
    np.testing.assert_allclose(b["advantage"].double().numpy(), _normalised(adv, cfg).reshape(-1), rtol=0, atol=1e-4)


# --- masked PPO on connect four -------------------------------------------------------------------------

class _RecordingConnectFour(trainer.ConnectFourVsRandom):
    """Keeps, per rollout, the boards and masks it showed, the actions it was given, and what each step returned."""

    def reset(self, seed):
        obs, mask = super().reset(seed)
        self.log = {"obs": [obs.copy()], "mask": [mask.copy()], "action": [], "reward": [], "ended": [], "drawn": False}
        RECORDS.append(self.log)
        return obs, mask

    def step(self, actions):
        obs, mask, reward, done, finished = super().step(actions)
        if done.any() and not self.log["drawn"]:  # the rollout's first game scores a draw: a 42-move draw never
            reward[np.flatnonzero(done)[0]] = 0.0  # comes in games this short, and a draw is neither win nor loss
            finished = [float(r) for r in reward[done]]
            self.log["drawn"] = True
        for key, x in zip(("action", "obs", "mask", "reward", "ended"), (actions, obs, mask, reward, done)):
            self.log[key].append(np.array(x, copy=True))
        return obs, mask, reward, done, finished


RECORDS: list[dict] = []


@pytest.mark.parametrize("device", DEVICES)
def test_ppo_trainer_hands_the_update_what_the_boards_showed(monkeypatch, tmp_path, device):
    RECORDS.clear()
    monkeypatch.setattr(trainer, "ConnectFourVsRandom", _RecordingConnectFour)
    calls = _spy_updates(monkeypatch, trainer)
    cfg = trainer.PPOConfig(**TINY, device="cuda" if device == simdevice.NAME else device)
    _train(trainer, cfg, tmp_path, device)
    assert len(calls) == len(RECORDS) == UPDATES
    ended_some, metrics = 0, _metrics(tmp_path)
    for u, (call, log) in enumerate(zip(calls, RECORDS)):
        obs = np.stack(log["obs"])  # [T + 1, N, 84]: the board before each move, then after the last one
        rec = {"obs": obs[:-1], "mask": np.stack(log["mask"])[:-1], "action": np.stack(log["action"]),
               "reward": np.stack(log["reward"]).astype(np.float64),
               "ended": np.stack(log["ended"]).astype(np.float64)}
        ended_some += int(rec["ended"].sum())
        _check_batch(call, rec, cfg, torch.as_tensor(obs))
        finished = rec["reward"][rec["ended"] > 0]  # connect four pays only on the final move
        assert (finished == 0).any(), "no draw: the test would not tell a draw from a loss"
        _check_episode_metrics(metrics[u], finished, cfg.rollout_steps * cfg.n_envs * (u + 1),
                               win_rate=finished > 0, loss_rate=finished < 0)
    assert ended_some > 0, "no game ended: the test would not see a bootstrap through a terminal step"


# --- MAPPO on CoopGrid ----------------------------------------------------------------------------------

class _RecordingGrid(mappo_trainer.CoopGridEnv):
    """Keeps every observation dict, global state, joint action and outcome, in order, across resets."""

    def reset(self, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        if seed is not None:  # the trainer reseeds every grid at the start of each update
            self.log = {"obs": [], "state": [], "action": [], "reward": [], "ended": [], "covered": []}
            GRIDS.append(self.log)
        self.log["now"] = (obs, self.state())  # what the next step is taken from
        return obs, info

    def step(self, actions):
        obs_before, state_before = self.log["now"]
        out = obs, rew, term, _, _ = super().step(actions)
        self.log["obs"].append(obs_before)
        self.log["state"].append(state_before)
        self.log["action"].append([actions[a] for a in self.possible_agents])
        self.log["reward"].append(rew[self.possible_agents[0]])
        self.log["ended"].append(not self.agents)  # covered or timed out: both end the episode (see the trainer)
        self.log["covered"].append(term[self.possible_agents[0]])
        self.log["now"] = (obs, self.state())
        return out


GRIDS: list[dict] = []


def _episode_ids(ended: np.ndarray, first: int) -> tuple[np.ndarray, int]:
    """[T, N] episode ids as PPO-MAPPO-1's keys number them on one process: the grids take ``first`` ..
    ``first + N - 1`` and each episode that ends hands its grid the next free id, grids in order within a step.
    Returns the ids and the next free id (ids run on across updates)."""
    T, N = ended.shape
    ids, nxt = first + np.arange(N), first + N
    out = np.zeros((T, N), dtype=np.int64)
    for t in range(T):
        out[t] = ids
        for i in np.flatnonzero(ended[t]):
            ids[i], nxt = nxt, nxt + 1
    return out, nxt


def _grid_record(logs: list[dict], n_agents: int) -> tuple[dict, torch.Tensor]:
    """One update's recordings of N grids as [T, N, M] arrays, and the critic's input [T + 1, N, M, S + M]:
    each grid's global state before every step and after the last, with the agent's one-hot id."""
    agents = [f"agent_{m}" for m in range(n_agents)]

    def per_agent(field):  # [T, N, M, ...] from each step's observation dicts
        return np.array([[[o[a][field] for a in agents] for o in g["obs"]] for g in logs]).swapaxes(0, 1)

    def by_grid(field):  # [T, N]
        return np.array([g[field] for g in logs], dtype=np.float64).T

    states = np.array([[*g["state"], g["now"][1]] for g in logs]).swapaxes(0, 1)  # [T + 1, N, S]
    states = np.repeat(states[:, :, None], n_agents, 2)
    onehot = np.broadcast_to(np.eye(n_agents), (*states.shape[:2], n_agents, n_agents))
    rec = {"obs": per_agent("observation"), "mask": per_agent("action_mask").astype(bool),
           "action": np.array([g["action"] for g in logs]).swapaxes(0, 1),
           "reward": np.repeat(by_grid("reward")[:, :, None], n_agents, -1),  # the team reward, every agent's
           "ended": np.repeat(by_grid("ended")[:, :, None], n_agents, -1)}
    return rec, torch.as_tensor(np.concatenate([states, onehot], -1), dtype=torch.float32)


def _keys(ended: np.ndarray, first_id: int) -> tuple[np.ndarray, int]:
    """PPO-MAPPO-1's keys (episode, step in episode, agent) of a [T, N, M] record, and the next free episode id."""
    episode, next_id = _episode_ids(ended[:, :, 0], first_id)
    step = np.zeros_like(episode)
    for t in range(1, len(step)):
        step[t] = np.where(ended[t - 1, :, 0] > 0, 0, step[t - 1] + 1)
    agent = np.arange(ended.shape[-1])
    return np.stack(np.broadcast_arrays(episode[:, :, None], step[:, :, None], agent)).reshape(3, -1), next_id


def _finished_episodes(logs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Team return and whether the targets were covered, of every episode that ended in the update (grids are
    reset at its start, so an episode's return counts from there)."""
    returns, covered = [], []
    for g in logs:
        total = 0.0
        for r, ended, cov in zip(g["reward"], g["ended"], g["covered"]):
            total += r
            if ended:
                returns.append(total)
                covered.append(cov)
                total = 0.0
    return np.array(returns), np.array(covered)


@pytest.mark.parametrize("device", DEVICES)
def test_mappo_trainer_keys_every_agent_sample_to_what_its_grid_showed(monkeypatch, tmp_path, device):
    GRIDS.clear()
    monkeypatch.setattr(mappo_trainer, "CoopGridEnv", _RecordingGrid)
    calls = _spy_updates(monkeypatch, mappo_trainer)
    cfg = mappo_trainer.MAPPOConfig(**{**TINY, "rollout_steps": 13}, max_cycles=5,  # episodes end inside
                                    device="cuda" if device == simdevice.NAME else device)
    _train(mappo_trainer, cfg, tmp_path, device)
    N = cfg.n_envs
    assert len(calls) == UPDATES and len(GRIDS) == UPDATES * N
    next_id, metrics = 0, _metrics(tmp_path)
    for u, call in enumerate(calls):
        logs = GRIDS[u * N:(u + 1) * N]
        rec, critic_obs = _grid_record(logs, cfg.n_agents)
        assert rec["ended"].sum() > 0, "no episode ended: the test would not see a bootstrap through one"
        keys, next_id = _keys(rec["ended"], next_id)
        order = np.lexsort(keys[::-1])  # PPO-MAPPO-1: the update sees the rows sorted by (episode, step, agent)
        b = call["batch"]
        for name, want in zip(("episode_id", "timestep", "agent_id"), keys):
            np.testing.assert_array_equal(b[name].numpy(), want[order], err_msg=name)
        inverse = torch.as_tensor(np.argsort(order))  # back to the record's [T, N, M] order
        call = {**call, "batch": {k: v[inverse] for k, v in b.items()}}
        np.testing.assert_array_equal(call["batch"]["critic_obs"].numpy(), critic_obs[:-1].flatten(0, 2).numpy())
        _check_batch(call, rec, cfg, critic_obs)
        returns, covered = _finished_episodes(logs)
        _check_episode_metrics(metrics[u], returns, cfg.rollout_steps * N * (u + 1), cover_rate=covered)
