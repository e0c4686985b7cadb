"""CoopGrid: a cooperative PettingZoo ``ParallelEnv`` with per-agent action masks.

``n_agents`` agents walk on a ``size x size`` grid with fixed wall cells and must cover all
``n_targets`` targets at the same time (one agent per target). Actions: 0 stay, 1 up, 2 down,
3 left, 4 right; a move off the grid or into a wall is illegal, so each agent's ``action_mask``
depends on where it stands (stay is always legal). Agents may share a cell.

Team reward, the same for every agent, each step: ``-step_cost * mean_k min_i d(agent_i,
target_k) / d_max`` (Manhattan distances, so leaving a target uncovered costs the team) plus
``cover_bonus`` on the step where every target is covered, which ends the episode. Episodes are
truncated after ``max_cycles`` steps. Observations are PettingZoo-classic style dicts
``{"observation": float32 vector, "action_mask": int8 [5]}``; :meth:`state` is the global state
for a centralised critic (all positions and the time left).
"""
from __future__ import annotations

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.env import ParallelEnv

MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]])  # stay, up, down, left, right (row, col)
DEFAULT_WALLS = ((1, 1), (1, 3), (3, 1), (3, 3))


class CoopGridEnv(ParallelEnv):
    metadata = {"name": "coop_grid_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, *, size: int = 5, n_agents: int = 2, n_targets: int | None = None, max_cycles: int = 25,
                 walls=DEFAULT_WALLS, step_cost: float = 0.1, cover_bonus: float = 1.0):
        self.size = size
        self.n_targets = n_agents if n_targets is None else n_targets
        if self.n_targets > n_agents:
            raise ValueError("CoopGrid needs at least as many agents as targets")
        self.max_cycles = max_cycles
        self.walls = {tuple(w) for w in walls}
        self.free = [(r, c) for r in range(size) for c in range(size) if (r, c) not in self.walls]
        self.step_cost, self.cover_bonus = step_cost, cover_bonus
        self.possible_agents = [f"agent_{i}" for i in range(n_agents)]
        self.agents: list[str] = []
        # own position 2, own mask 5, targets 2k, other agents 2(n-1), time left 1
        self.obs_dim = 2 + len(MOVES) + 2 * self.n_targets + 2 * (n_agents - 1) + 1
        self.state_dim = 2 * n_agents + 2 * self.n_targets + 1
        self.state_space = spaces.Box(0.0, 1.0, (self.state_dim,), np.float32)
        self._rng = np.random.default_rng()
        self._t = 0

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent):
        return spaces.Dict({"observation": spaces.Box(-1.0, 1.0, (self.obs_dim,), np.float32),
                            "action_mask": spaces.Box(0, 1, (len(MOVES),), np.int8)})

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent):
        return spaces.Discrete(len(MOVES))

    # --- dynamics -------------------------------------------------------------------------
    def reset(self, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._t = 0
        cells = self._rng.choice(len(self.free), size=len(self.agents) + self.n_targets, replace=False)
        pos = np.array([self.free[k] for k in cells])
        self.pos, self.targets = pos[: len(self.agents)].copy(), pos[len(self.agents):].copy()
        return self._observations(), {a: {} for a in self.agents}

    def action_mask(self, i: int) -> np.ndarray:
        """int8 [5]: 1 where agent ``i``'s move stays on the grid and off the walls."""
        dest = self.pos[i] + MOVES
        inside = (dest >= 0).all(1) & (dest < self.size).all(1)
        return np.array([ok and (int(r), int(c)) not in self.walls for ok, (r, c) in zip(inside, dest)], np.int8)

    def step(self, actions):
        for i, agent in enumerate(self.possible_agents):
            a = int(actions[agent])
            if not self.action_mask(i)[a]:
                raise ValueError(f"CoopGrid: {agent} played illegal action {a} at {tuple(self.pos[i])}")
            self.pos[i] = self.pos[i] + MOVES[a]
        self._t += 1
        dist = np.abs(self.targets[:, None, :] - self.pos[None, :, :]).sum(-1).min(1)  # [targets]
        covered = bool((dist == 0).all())
        r = -self.step_cost * float(dist.mean()) / (2 * (self.size - 1)) + (self.cover_bonus if covered else 0.0)
        truncated = self._t >= self.max_cycles and not covered
        obs = self._observations()
        agents = self.agents
        if covered or truncated:
            self.agents = []
        return (obs, {a: r for a in agents}, {a: covered for a in agents}, {a: truncated for a in agents},
                {a: {} for a in agents})

    # --- views ----------------------------------------------------------------------------
    def _observations(self) -> dict:
        scale = self.size - 1
        out = {}
        for i, agent in enumerate(self.possible_agents):
            mask = self.action_mask(i)
            others = np.delete(self.pos, i, axis=0)
            vec = np.concatenate([self.pos[i] / scale, mask, ((self.targets - self.pos[i]) / scale).ravel(),
                                  ((others - self.pos[i]) / scale).ravel(), [1.0 - self._t / self.max_cycles]])
            out[agent] = {"observation": vec.astype(np.float32), "action_mask": mask}
        return out

    def state(self) -> np.ndarray:
        scale = self.size - 1
        return np.concatenate([self.pos.ravel() / scale, self.targets.ravel() / scale,
                               [1.0 - self._t / self.max_cycles]]).astype(np.float32)
