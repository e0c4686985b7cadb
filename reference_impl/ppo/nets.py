"""Small MLP actor and critic shared by the PPO and MAPPO trainers.

The actor maps an observation to unmasked logits over the full action space (masking is the job
of :mod:`reference_impl.ppo.masking`, applied identically at sampling and update time); the critic
maps an observation (MAPPO: the global state) to one value.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def _mlp(in_dim: int, hidden: int, out_dim: int, *, out_gain: float) -> nn.Sequential:
    layers = [nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, out_dim)]
    for layer in layers:
        if isinstance(layer, nn.Linear):  # orthogonal init, the usual PPO choice
            gain = out_gain if layer is layers[-1] else math.sqrt(2.0)
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


class Actor(nn.Module):
    """obs ``[B, obs_dim]`` -> logits ``[B, n_actions]`` (a small output gain starts near-uniform)."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64):
        super().__init__()
        self.net = _mlp(obs_dim, hidden, n_actions, out_gain=0.01)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


class Critic(nn.Module):
    """obs ``[B, obs_dim]`` -> value ``[B]``."""

    def __init__(self, obs_dim: int, hidden: int = 64):
        super().__init__()
        self.net = _mlp(obs_dim, hidden, 1, out_gain=1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).squeeze(-1)
