"""The V2 defaults table (seed 000, §9) and the recommended settings of §5."""
from __future__ import annotations

DEFAULTS = {  # SAC-DEFAULT-*
    "d_model": 128,
    "gru_hidden": 256,
    "batch_size": 2048,
    "lr_pi": 3e-4,
    "lr_q": 3e-4,
    "lr_alpha": 1e-4,
    "tau": 0.005,
    "gamma": 0.995,
    "top_p": 0.98,
    "top_p_coverage_min": 0.95,
    "kappa": 0.9,
    "alpha_min": 1e-4,
    "alpha_max": 2.0,
    "lambda_cov": 1.0,
    "lambda_nce": 0.5,
    "lambda_gar": 0.1,
    "lambda_ill": 2.0,
    "lambda_bigram": 1.0,
    "popart_beta": 1e-3,
    "popart_eps": 1e-8,
    "rho": 0.75,
    "lambda_bc": 0.1,
    "dagger_start": 1.0,
    "dagger_end": 0.1,
    "dagger_horizon": 200_000,
    "grad_clip": 0.5,
    "lambda_cql": 0.5,
    "ngram_n": 3,
    "window": 64,
    "nce_tau": 0.07,
    "mask_fill": -1e9,
    "prob_eps": 1e-8,
}


def defaults() -> dict:
    """A copy of the defaults table."""
    return dict(DEFAULTS)
