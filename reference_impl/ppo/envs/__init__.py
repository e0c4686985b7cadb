"""Environments of the PPO family's reference trainers.

- :class:`ConnectFourVsRandom`: PettingZoo classic connect four (AEC, ``action_mask`` in every
  observation) seen from one learner seat against a uniformly random legal opponent, batched over
  several boards; masked single-agent PPO trains on it.
- :class:`CoopGridEnv`: our cooperative grid, a PettingZoo ``ParallelEnv`` whose agents must cover
  every target together; walls make moves illegal per agent, so each agent has its own
  ``action_mask``. MAPPO trains on it.
"""
from reference_impl.ppo.envs.connect_four import ConnectFourVsRandom
from reference_impl.ppo.envs.coop_grid import CoopGridEnv

__all__ = ["ConnectFourVsRandom", "CoopGridEnv"]
