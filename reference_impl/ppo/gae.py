r"""GAE(λ) for the PPO/MAPPO trainers: their time-major rollouts handed to the checked contract op.

The estimator itself is :func:`reference_impl.ppo.advantage.gae` (PPO-GAE-1, time on the last axis);
this module only adapts the trainers' layout ([T, *batch] plus the bootstrap value after the last step).
"""
from __future__ import annotations

import torch

from reference_impl.ppo import advantage


def gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, last_value: torch.Tensor, *,
        gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Advantages and λ-returns of a time-major rollout, without gradient.

    ``rewards``, ``values``, ``dones``: ``[T, *batch]``; ``dones[t]`` is 1 when the transition at
    ``t`` ended its episode, so neither the bootstrap value nor the next advantage crosses it.
    ``last_value``: ``[*batch]``, V of the state after the last transition (bootstrap for episodes
    still running when the rollout stops). Returns ``(advantages, returns)``, both ``[T, *batch]``.

    Implements: PPO-GAE-1 (through the contract op).
    """
    if last_value.shape != values.shape[1:]:
        raise ValueError(f"[PPO-GAE-1] gae: last_value {tuple(last_value.shape)} must be one value per column of "
                         f"values {tuple(values.shape)}")
    with torch.no_grad():
        next_values = torch.cat([values[1:], last_value.unsqueeze(0)], dim=0)
        adv, ret = advantage.gae(*(x.movedim(0, -1) for x in (rewards, values, next_values, dones)),
                                 gamma=gamma, lam=lam)
        return adv.movedim(-1, 0), ret.movedim(-1, 0)
