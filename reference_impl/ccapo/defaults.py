"""CCAPO v4.1 defaults (seed 004 §3.2, §4.1, §5.2.3, §5.3, §6) and our choices where it gives none."""
from __future__ import annotations

DEFAULTS = {  # CCAPO-DEFAULT-*
    "r_terminal": 10.0,         # §4.1
    "r_penalty": -0.1,          # §4.1 (v4.0: -0.05)
    "alpha_smooth": 1.0,        # §3.2.1 Beta(1,1)
    "distance_exponent": 0.5,   # §3.2.3 (the document's second "alpha")
    "lam": 1.0,                 # §3.2 lambda: not given by the document (errata)
    "sigma_min": 0.1,           # §5.2.3
    "beta": 0.5,                # §5.3, recommended 0.5-1.0
    "clip_eps": 0.2,            # §6
    "beta_kl": 0.04,            # §6: not given by the document (errata)
    "v_rate": 0.1,              # §7.3 moving-average rate: not given by the document (errata)
    "macro_eps": 1.0e-8,        # §5.1 epsilon: not given (errata)
    "eps": 1.0e-8,              # §3.2.2 epsilon: not given (errata)
}


def defaults() -> dict:
    """A copy of the defaults table."""
    return dict(DEFAULTS)
