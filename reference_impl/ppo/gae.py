r"""Generalised advantage estimation, GAE(λ), for the PPO/MAPPO trainers.

Not a clause of the PPO document (it takes advantages and returns as given); this is the standard
estimator of Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage
Estimation" (2016), with the episode boundary handled by (1 − done).
"""
from __future__ import annotations

import torch


def gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, last_value: torch.Tensor, *,
        gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Advantages and λ-returns of a time-major rollout.

    .. math::
        \delta_t = r_t + \gamma (1 - d_t) V(s_{t+1}) - V(s_t), \qquad
        \hat A_t = \delta_t + \gamma \lambda (1 - d_t) \hat A_{t+1}, \qquad
        \hat R_t = \hat A_t + V(s_t)

    ``rewards``, ``values``, ``dones``: ``[T, *batch]``; ``dones[t]`` is 1 when the transition at
    ``t`` ended its episode, so neither the bootstrap value nor the next advantage crosses it.
    ``last_value``: ``[*batch]``, V of the state after the last transition (bootstrap for episodes
    still running when the rollout stops). Returns ``(advantages, returns)``, both ``[T, *batch]``,
    without gradient.

    Implements: standard GAE(λ) (not a seed clause).
    """
    if not (rewards.shape == values.shape == dones.shape) or last_value.shape != rewards.shape[1:]:
        raise ValueError(f"gae: shapes differ: rewards {tuple(rewards.shape)}, values {tuple(values.shape)}, "
                         f"dones {tuple(dones.shape)}, last_value {tuple(last_value.shape)}")
    if not 0.0 <= gamma <= 1.0 or not 0.0 <= lam <= 1.0:
        raise ValueError(f"gae: gamma={gamma} and lam={lam} must lie in [0, 1]")
    with torch.no_grad():
        not_done = 1.0 - dones.to(values.dtype)
        next_values = torch.cat([values[1:], last_value.unsqueeze(0)], dim=0)
        deltas = rewards.to(values.dtype) + gamma * not_done * next_values - values
        advantages = torch.empty_like(values)
        running = torch.zeros_like(last_value, dtype=values.dtype)
        for t in range(values.shape[0] - 1, -1, -1):  # backwards: each step needs the one after it
            running = deltas[t] + gamma * lam * not_done[t] * running
            advantages[t] = running
        return advantages, advantages + values
