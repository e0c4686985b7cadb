"""Meta-tests of the PPO family's reference environments, GAE and trainers (not clause tests).

They check our own fixtures: CoopGrid follows the PettingZoo ParallelEnv API and masks exactly the
moves that leave the grid or enter a wall, per agent; connect four against the random opponent
hands the learner legal masks and game rewards; GAE matches a brute-force sum; each trainer runs,
logs its metrics and resumes from its checkpoint to the same numbers as an uninterrupted run.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pettingzoo.test import parallel_api_test

from reference_impl.ppo.envs import ConnectFourVsRandom, CoopGridEnv
from reference_impl.ppo.envs.coop_grid import MOVES
from reference_impl.ppo.gae import gae

pytestmark = pytest.mark.meta


@pytest.mark.parametrize("n_agents", [2, 3])
def test_coop_grid_passes_the_parallel_api_test(n_agents):
    parallel_api_test(CoopGridEnv(n_agents=n_agents), num_cycles=60)


def _legal_moves(env: CoopGridEnv, pos) -> np.ndarray:
    """Brute force: a move is legal when its destination is on the grid and not a wall."""
    out = []
    for dr, dc in MOVES:
        r, c = pos[0] + dr, pos[1] + dc
        out.append(0 <= r < env.size and 0 <= c < env.size and (r, c) not in env.walls)
    return np.array(out)


def test_coop_grid_masks_are_per_agent_and_exact():
    env, rng = CoopGridEnv(n_agents=3), np.random.default_rng(0)
    differs = steps = 0
    for ep in range(20):
        obs, _ = env.reset(seed=ep)
        while env.agents:
            masks = {a: obs[a]["action_mask"] for a in env.agents}
            for i, a in enumerate(env.possible_agents):
                assert masks[a].dtype == np.int8 and masks[a][0] == 1  # stay is always legal
                np.testing.assert_array_equal(masks[a].astype(bool), _legal_moves(env, tuple(env.pos[i])))
                np.testing.assert_array_equal(obs[a]["observation"][2:7], masks[a])  # the actor sees its mask
            differs += any(not np.array_equal(masks["agent_0"], masks[a]) for a in env.agents[1:])
            steps += 1
            obs, *_ = env.step({a: int(rng.choice(np.flatnonzero(masks[a]))) for a in env.agents})
    assert differs > steps // 4, "agents' masks should often differ"
    env.reset(seed=0)
    illegal = int(np.flatnonzero(env.action_mask(0) == 0)[0]) if (env.action_mask(0) == 0).any() else None
    if illegal is not None:
        with pytest.raises(ValueError):
            env.step({a: (illegal if a == "agent_0" else 0) for a in env.agents})


def test_coop_grid_team_reward_and_cover_bonus():
    env = CoopGridEnv(n_agents=2)
    env.reset(seed=0)
    env.pos = env.targets.copy()  # stand on the targets: stay covers them all
    _, rew, term, trunc, _ = env.step({a: 0 for a in env.agents})
    assert rew == {"agent_0": 1.0, "agent_1": 1.0} and all(term.values()) and not any(trunc.values())
    assert env.agents == []


def test_connect_four_vs_random_masks_rewards_and_seats():
    env, rng = ConnectFourVsRandom(4), np.random.default_rng(0)
    obs, mask = env.reset(seed=3)
    seats, results = set(), []
    for _ in range(300):
        board = obs.reshape(-1, 6, 7, 2)
        np.testing.assert_array_equal(mask, board[:, 0].sum(-1) == 0)  # legal = top cell of the column empty
        lead = board[..., 1].sum((1, 2)) - board[..., 0].sum((1, 2))  # opponent pieces minus own
        assert set(lead.tolist()) <= {0, 1}  # the learner is always the one to move
        seats |= set(env.learner)
        obs, mask, rew, done, finished = env.step(np.array([rng.choice(np.flatnonzero(m)) for m in mask]))
        assert set(np.unique(rew)) <= {-1.0, 0.0, 1.0} and (rew[~done] == 0).all()
        results += finished
    assert seats == {"player_0", "player_1"} and len(results) > 20
    assert 0.3 < np.mean(np.array(results) > 0) < 0.7  # random vs random wins about half


def test_gae_matches_brute_force():
    rng = np.random.default_rng(1)
    T, N, gamma, lam = 7, 3, 0.9, 0.8
    r, v, last = rng.normal(size=(T, N)), rng.normal(size=(T, N)), rng.normal(size=N)
    d = (rng.random((T, N)) < 0.3).astype(float)
    adv, ret = gae(*(torch.tensor(x) for x in (r, v, d, last)), gamma=gamma, lam=lam)
    v_next = np.concatenate([v[1:], last[None]])
    delta = r + gamma * (1 - d) * v_next - v
    want = np.zeros((T, N))
    for t in range(T):  # A_t = sum_k (γλ)^k δ_{t+k}, stopping after the first done
        for n in range(N):
            w = 1.0
            for k in range(t, T):
                want[t, n] += w * delta[k, n]
                if d[k, n]:
                    break
                w *= gamma * lam
    np.testing.assert_allclose(adv.numpy(), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ret.numpy(), want + v, rtol=1e-12, atol=1e-12)


KEYS = {"update", "loss", "policy_loss", "value_loss", "entropy", "approx_kl", "k3_kl", "clip_fraction",
        "ratio_mean", "ratio_std", "entropy_ratio", "return"}


@pytest.mark.parametrize("name,extra", [("trainer", {"win_rate"}), ("mappo_trainer", {"cover_rate"})])
def test_trainer_logs_and_resumes_to_the_same_numbers(tmp_path, name, extra):
    import importlib

    cli = importlib.import_module(f"reference_impl.ppo.{name}").cli
    small = ["--smoke", "--n-envs", "2", "--rollout-steps", "10", "--minibatch-size", "10"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert cli(["--updates", "3", "--out", str(straight), *small]) == 0
    assert cli(["--updates", "2", "--out", str(split), *small]) == 0
    recs = [json.loads(x) for x in (split / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in recs] == [1, 2] and KEYS | extra <= set(recs[0])
    assert recs[0]["ratio_mean_first"] == 1.0  # the first minibatch replays the sampling policy exactly
    assert cli(["--updates", "3", "--out", str(split), "--resume", *small]) == 0
    resumed = [json.loads(x) for x in (split / "metrics.jsonl").read_text().splitlines()]
    full = [json.loads(x) for x in (straight / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in resumed] == [1, 2, 3]
    for key in ("loss", "approx_kl", "entropy_ratio", "return"):
        assert resumed[2][key] == full[2][key] or (np.isnan(resumed[2][key]) and np.isnan(full[2][key])), key
