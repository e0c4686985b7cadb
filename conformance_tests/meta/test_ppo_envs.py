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
    env = CoopGridEnv(n_agents=n_agents)
    parallel_api_test(env, num_cycles=60)
    assert env.metadata == {"name": "coop_grid_v0", "render_modes": [], "is_parallelizable": True}  # read by wrappers


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


def _placed(env: CoopGridEnv, pos, targets) -> None:
    env.reset(seed=0)
    env.pos, env.targets = np.array(pos), np.array(targets)


def test_coop_grid_reward_observation_and_state_by_hand():
    env = CoopGridEnv(n_agents=2, max_cycles=4)  # 5x5: positions scale by 1/4, d_max = 8
    _placed(env, [(0, 1), (4, 2)], [(0, 0), (4, 4)])
    obs, rew, term, trunc, _ = env.step({"agent_0": 0, "agent_1": 4})  # agent_1 steps right, onto (4, 3)
    # target (0, 0): nearest agent 1 away; target (4, 4): 1 away -> mean 1; r = -0.1 * 1 / 8
    assert rew == {"agent_0": pytest.approx(-0.1 / 8), "agent_1": pytest.approx(-0.1 / 8)}
    assert not any(term.values()) and not any(trunc.values())
    want0 = [0, 0.25, 1, 0, 0, 1, 1,  # own position, own mask (up leaves the grid, down is the wall (1, 1))
             0, -0.25, 1, 0.75,  # targets relative to it
             1, 0.5,  # the other agent relative to it
             0.75]  # time left: 1 - 1/4
    np.testing.assert_allclose(obs["agent_0"]["observation"], want0)
    assert obs["agent_0"]["observation"].dtype == np.float32
    want1 = [1, 0.75, 1, 0, 0, 1, 1, -1, -0.75, 0, 0.25, -1, -0.5, 0.75]  # up: the wall (3, 3); down: off the grid
    np.testing.assert_allclose(obs["agent_1"]["observation"], want1)
    np.testing.assert_allclose(env.state(), [0, 0.25, 1, 0.75, 0, 0, 1, 1, 0.75])
    assert env.state().dtype == np.float32


def test_coop_grid_masks_walls_and_edges_by_hand():
    env = CoopGridEnv(n_agents=2)
    _placed(env, [(1, 2), (4, 0)], [(0, 0), (0, 4)])
    np.testing.assert_array_equal(env.action_mask(0), [1, 1, 1, 0, 0])  # walls at (1, 1) and (1, 3)
    np.testing.assert_array_equal(env.action_mask(1), [1, 1, 0, 0, 1])  # bottom-left corner
    env.pos = np.array([(2, 1), (2, 3)])  # between two walls each: (1, 1) and (3, 1), (1, 3) and (3, 3)
    np.testing.assert_array_equal(env.action_mask(0), [1, 0, 0, 1, 1])
    np.testing.assert_array_equal(env.action_mask(1), [1, 0, 0, 1, 1])
    env.pos = np.array([(1, 2), (4, 0)])
    with pytest.raises(ValueError, match="illegal"):
        env.step({"agent_0": 3, "agent_1": 0})


def test_coop_grid_truncates_at_max_cycles_and_covering_terminates():
    env = CoopGridEnv(n_agents=2, max_cycles=3)
    _placed(env, [(0, 0), (4, 4)], [(2, 2), (2, 0)])
    for t in range(1, 4):
        _, rew, term, trunc, _ = env.step({a: 0 for a in env.agents})
        assert not any(term.values()) and all(trunc.values()) == (t == 3) and any(trunc.values()) == (t == 3)
    assert env.agents == []
    _placed(env, [(2, 2), (2, 1)], [(2, 2), (2, 0)])
    _, rew, term, trunc, _ = env.step({"agent_0": 0, "agent_1": 3})  # agent_1 steps left onto (2, 0)
    assert all(term.values()) and not any(trunc.values()) and rew["agent_0"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least as many agents"):
        CoopGridEnv(n_agents=2, n_targets=3)


def test_coop_grid_spaces_hold_what_it_emits():
    """Observations in [-1, 1] (relative offsets over the grid's span), masks 0/1 int8, the state in [0, 1]; a first
    reset without a seed works."""
    env, rng = CoopGridEnv(n_agents=3), np.random.default_rng(2)
    space = env.observation_space("agent_0")
    assert (space["observation"].low == -1).all() and (space["observation"].high == 1).all()
    assert space["observation"].shape == (env.obs_dim,) and space["action_mask"].shape == (5,)
    assert (space["action_mask"].low == 0).all() and (space["action_mask"].high == 1).all()
    assert (env.state_space.low == 0).all() and (env.state_space.high == 1).all()
    obs, _ = env.reset()
    for _ in range(40):
        assert all(space.contains(o) for o in obs.values()) and env.state_space.contains(env.state())
        if not env.agents:
            obs, _ = env.reset()
        obs, *_ = env.step({a: int(rng.choice(np.flatnonzero(obs[a]["action_mask"]))) for a in env.agents})


def test_coop_grid_reset_places_everyone_on_distinct_free_cells_by_its_seed():
    env = CoopGridEnv(n_agents=3)
    for seed in range(10):
        env.reset(seed=seed)
        cells = [tuple(p) for p in np.concatenate([env.pos, env.targets])]
        assert len(set(cells)) == 6 and not set(cells) & env.walls
        assert all(0 <= r < 5 and 0 <= c < 5 for r, c in cells) and env.agents == env.possible_agents
    first = (env.reset(seed=4), env.pos.copy(), env.targets.copy())
    env.reset(seed=9)
    again = (env.reset(seed=4), env.pos.copy(), env.targets.copy())
    np.testing.assert_array_equal(first[1], again[1])
    np.testing.assert_array_equal(first[2], again[2])


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


def test_connect_four_seats_alternate_per_board_and_per_game():
    """Board i opens a fresh reset in seat i mod 2 (first mover on even boards) and changes seat after every game
    it finishes, so the policy plays both seats in every batch and on every board."""
    env, rng = ConnectFourVsRandom(3), np.random.default_rng(1)
    obs, mask = env.reset(seed=5)
    want = [("player_0", "player_1")[i % 2] for i in range(3)]
    for _ in range(2):  # a second reset starts the alternation again
        assert env.learner == want
        games = [0, 0, 0]
        for _ in range(120):
            obs, mask, _, done, _ = env.step(np.array([rng.choice(np.flatnonzero(m)) for m in mask]))
            games = [g + int(d) for g, d in zip(games, done)]
            assert env.learner == [("player_0", "player_1")[(i + g) % 2] for i, g in enumerate(games)]
        assert min(games) >= 2
        obs, mask = env.reset(seed=6)


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
