"""The numbers the PPO document fixes (seed 002, §3, §4, §8, §11)."""
from __future__ import annotations

DEFAULTS = {  # PPO-DEFAULT-*
    "clip_eps": 0.2,
    "target_kl": 0.015,
    "kl_stop_factor": 2.0,
    "adv_eps": 1e-8,
    "adv_clamp": 10.0,
    "mask_fill": -1e9,
    "reward_clip": 1.0,
    "approx_kl_min": 0.01,
    "approx_kl_max": 0.03,
    "clip_fraction_min": 0.05,
    "clip_fraction_max": 0.30,
    "ratio_mean_min": 0.9,
    "ratio_mean_max": 1.1,
    "log_prob_min": -20.0,
}


def defaults() -> dict:
    """A copy of the defaults table."""
    return dict(DEFAULTS)
