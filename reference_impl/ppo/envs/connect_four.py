"""Connect four from one seat against a uniformly random legal opponent, over a batch of boards.

Each board is a PettingZoo ``connect_four_v3`` AEC environment. The learner's seat alternates
between episodes (first mover, then second mover, ...), so the policy learns both. The opponent
draws uniformly among the legal columns of its ``action_mask``. Rewards are the environment's,
seen from the learner: +1 win, -1 loss, 0 draw, 0 while the game runs. A finished board is reset
at once, so :meth:`step` always returns a board where the learner is to move.
"""
from __future__ import annotations

import numpy as np
from pettingzoo.classic.connect_four import connect_four  # = connect_four_v3, without 1.27's deprecation warning

OBS_DIM = 6 * 7 * 2  # the two 6x7 board planes (own pieces, opponent pieces), flattened
N_ACTIONS = 7


class ConnectFourVsRandom:
    """``n_envs`` boards; arrays are numpy, the trainer moves them to its device."""

    obs_dim = OBS_DIM
    n_actions = N_ACTIONS

    def __init__(self, n_envs: int):
        self.n_envs = n_envs
        self.envs = [connect_four.env() for _ in range(n_envs)]
        self.learner = [""] * n_envs
        self.episodes = [0] * n_envs

    def reset(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Fresh boards seeded from ``seed``; returns ``(obs [N, 84] float32, mask [N, 7] bool)``."""
        seqs = np.random.SeedSequence(seed).spawn(self.n_envs)
        self.rngs = [np.random.default_rng(s) for s in seqs]  # opponent moves
        self.episodes = [0] * self.n_envs
        for i in range(self.n_envs):
            self._new_game(i)
        return self._observe()

    def _new_game(self, i: int) -> None:
        env = self.envs[i]
        env.reset(seed=int(self.rngs[i].integers(2**31)))
        self.learner[i] = env.possible_agents[(self.episodes[i] + i) % 2]  # alternate seats
        if env.agent_selection != self.learner[i]:
            self._opponent_move(i)  # the opponent opens; a single move never ends a game

    def _opponent_move(self, i: int) -> None:
        env = self.envs[i]
        legal = np.flatnonzero(env.observe(env.agent_selection)["action_mask"])
        env.step(int(self.rngs[i].choice(legal)))

    def _finished(self, i: int) -> bool:
        env = self.envs[i]
        return any(env.terminations.values()) or any(env.truncations.values())

    def _observe(self) -> tuple[np.ndarray, np.ndarray]:
        obs = np.empty((self.n_envs, OBS_DIM), dtype=np.float32)
        mask = np.empty((self.n_envs, N_ACTIONS), dtype=bool)
        for i, env in enumerate(self.envs):
            o = env.observe(self.learner[i])  # planes are relative to the observer: own pieces first
            obs[i] = o["observation"].reshape(-1)
            mask[i] = o["action_mask"].astype(bool)
        return obs, mask

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[float]]:
        """Play the learner's ``actions [N]`` and the opponent's replies.

        Returns ``(obs, mask, reward [N] float32, done [N] bool, finished)`` where ``obs``/``mask``
        are of the next board to play (a new game where ``done``) and ``finished`` lists the
        learner's final reward of every game that ended in this step.
        """
        reward = np.zeros(self.n_envs, dtype=np.float32)
        done = np.zeros(self.n_envs, dtype=bool)
        finished: list[float] = []
        for i, env in enumerate(self.envs):
            me = self.learner[i]
            env.step(int(actions[i]))  # an illegal column ends the game with a loss (TerminateIllegalWrapper)
            if not self._finished(i):
                self._opponent_move(i)
            if self._finished(i):
                reward[i] = float(env.rewards[me])
                done[i] = True
                finished.append(float(reward[i]))
                self.episodes[i] += 1
                self._new_game(i)
        obs, mask = self._observe()
        return obs, mask, reward, done, finished
