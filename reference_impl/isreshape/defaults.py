"""IS Reshape v4 defaults (seed 003, §9 code signature) and appendix A's recommended ranges."""
from __future__ import annotations

DEFAULTS = {  # ISR-DEFAULT-*
    "tau": 1.0,  # trust-region temperature
    "beta": 1.0,  # reward sensitivity of gamma
    "gamma_min": 0.0,
    "gamma_max": 1.0,
    "gamma_sft": 0.2,  # fixed gamma of the SFT variant (§5.2)
    "log_ratio_clamp": 20.0,  # |log pi - log mu| is clamped here before exp
    "mask_eps": 1e-8,  # added to the token count of the loss denominator
    # appendix A, closed intervals
    "tau_range": [1.0, 2.0],
    "beta_range": [0.5, 2.0],
    "gamma_min_range": [0.0, 0.1],
    "gamma_max_range": [0.8, 1.0],
    "gamma_sft_range": [0.1, 0.3],
}


def defaults() -> dict:
    """A copy of the defaults table (ranges copied too, so callers may mutate them)."""
    return {k: list(v) if isinstance(v, list) else v for k, v in DEFAULTS.items()}
