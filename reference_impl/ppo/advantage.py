r"""GAE(λ) over the last (time) axis with terminated and truncated steps apart.

The contract form of the estimator that ``gae.py`` computes for the trainers (time-major, one
``done``): here every step carries the value of the state it reached, so a truncated step can
bootstrap from the true next state while the recursion still stops at the episode boundary.
"""
from __future__ import annotations

import torch

from reference_impl import _checks


def _flag(x: torch.Tensor | None, like: torch.Tensor, clause: str, name: str) -> torch.Tensor:
    """A 0/1 float copy of a bool or 0/1 flag tensor of ``like``'s shape (zeros when absent)."""
    if x is None:
        return torch.zeros_like(like)
    _checks.same_shape(clause, **{name: x, "value": like})
    return x.to(like.dtype)


def gae(reward: torch.Tensor, value: torch.Tensor, next_value: torch.Tensor, done: torch.Tensor, *,
        gamma: float, lam: float, truncated: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    r"""(advantage, returns) of a rollout, time on the last axis.

    .. math::
        \delta_t = r_t + \gamma (1 - d_t) V'_t - V_t,\qquad
        \hat A_t = \delta_t + \gamma\lambda (1 - d_t)(1 - u_t)\,\hat A_{t+1},\qquad
        \hat R_t = \hat A_t + V_t

    with d the terminations and u the truncations: a termination cuts the bootstrap and the
    recursion; a truncation cuts only the recursion (V'_t is the value of the state it was cut at).

    Implements: PPO-GAE-1, PPO-GAE-2.
    """
    _checks.same_shape("PPO-GAE-1", reward=reward, value=value, next_value=next_value, done=done)
    if value.dim() == 0:
        raise ValueError("[PPO-GAE-1] gae needs a time axis (the last one), got a 0-d value")
    for name, x in (("reward", reward), ("value", value), ("next_value", next_value)):
        _checks.finite(x, "PPO-GAE-1", name)
    _checks.in_range(gamma, 0.0, 1.0, "PPO-GAE-1", "gamma", lo_open=False)
    _checks.in_range(lam, 0.0, 1.0, "PPO-GAE-1", "lam", lo_open=False)
    keep_boot = 1.0 - _flag(done, value, "PPO-GAE-1", "done")  # PPO-GAE-2: termination cuts the bootstrap
    keep_trace = keep_boot * (1.0 - _flag(truncated, value, "PPO-GAE-2", "truncated"))  # any end cuts the trace
    delta = reward.to(value.dtype) + gamma * keep_boot * next_value.to(value.dtype) - value  # PPO-GAE-1
    steps, running = [], torch.zeros_like(value[..., 0])
    for t in range(value.shape[-1] - 1, -1, -1):  # backwards: A_t needs A_{t+1}
        running = delta[..., t] + gamma * lam * keep_trace[..., t] * running
        steps.append(running)
    advantage = torch.stack(steps[::-1], dim=-1)
    return advantage, advantage + value
