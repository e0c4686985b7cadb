r"""GiGPO-style step-level anchor grouping: the comparison arm, not part of CCAPO v4.1.

GiGPO (Feng et al., 2025, "Group-in-Group Policy Optimization for LLM Agent Training") adds to
GRPO's episode advantage a step advantage computed inside *anchor-state groups*: the steps of one
episode group (same game, same start) that were taken from the identical environment state. Each
step's value is its discounted return; the step advantage is that return z-scored within its
anchor group, and the two are summed with weight omega. Seed 004 §2.2 names GiGPO as the method
whose in-batch grouping CCAPO's STDB replaces, so it is the natural third arm.

Choices here (none is a CCAPO clause): the per-step reward spreads R_tau over the steps (R_penalty
each step, R_terminal on the winning step), so its undiscounted sum is CCAPO-R-1's R_tau and the
arms optimise the same return; gamma = 0.95 and omega = 1 as in the GiGPO paper; the population std
with eps = 1e-6, so a group of one gets exactly 0.
"""
from __future__ import annotations

import torch


def step_rewards(success: torch.Tensor, n_steps: torch.Tensor, horizon: int, *, r_terminal: float,
                 r_penalty: float) -> torch.Tensor:
    r"""r_t = R_{penalty} + R_{terminal}\,\mathbb{1}[\text{success} \wedge t = N_{step}-1] for t < N_step, else 0; [B, H]."""
    t = torch.arange(horizon, device=n_steps.device)
    valid = t < n_steps[:, None]
    last = (t == n_steps[:, None] - 1) & success.bool()[:, None]
    return valid * r_penalty + last * r_terminal


def discounted_returns(rewards: torch.Tensor, *, gamma: float) -> torch.Tensor:
    r"""G_t = \sum_{k \ge 0} \gamma^k r_{t+k} along the last dim (padding rewards are 0)."""
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    for t in range(rewards.shape[-1] - 1, -1, -1):
        running = rewards[..., t] + gamma * running
        out[..., t] = running
    return out


def anchor_group_advantage(values: torch.Tensor, group_ids: torch.Tensor, valid: torch.Tensor, *, n_groups: int,
                           eps: float = 1e-6) -> torch.Tensor:
    r"""A_S = (G - \mathrm{mean}_g G) / (\mathrm{std}_g G + \epsilon) within each anchor group g; 0 off ``valid``.

    ``group_ids`` are integers in [0, n_groups) on the valid steps (the same id = the same anchor
    state in the same episode group); the host that built them passes their count.
    """
    v = values[valid]
    g = group_ids[valid]
    n = torch.zeros(n_groups, dtype=v.dtype, device=v.device).index_add(0, g, torch.ones_like(v))
    mean = torch.zeros_like(n).index_add(0, g, v) / n.clamp_min(1)
    var = torch.zeros_like(n).index_add(0, g, (v - mean[g]) ** 2) / n.clamp_min(1)
    out = torch.zeros_like(values)
    out[valid] = (v - mean[g]) / (var[g].sqrt() + eps)
    return out
