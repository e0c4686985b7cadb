"""Oracles under a convention: numpy forms of the conventional quantities (spec/conventions.yaml)
that follow the value the implementation declares.
"""
from __future__ import annotations

import math

import numpy as np

from conformance_tests.harness.capabilities import convention, declares
from conformance_tests.oracles import huber


# numpy forms of the conventional quantities (spec/conventions.yaml), shared by every test that reads the
# convention: the test passes the value :func:`convention` gave it, so the oracle follows the declaration.
def np_standardise(a: np.ndarray, std_conv: dict, eps: float | None = None, axis: int = -1) -> np.ndarray:
    """(a - mean) / (std + eps), or / max(std, eps) with eps_mode "clamp"; ddof and the default eps from
    the advantage_std convention. Shift-invariant and exactly 0 for a constant group."""
    eps = std_conv["eps"] if eps is None else eps
    centred = a - a.mean(axis=axis, keepdims=True)
    sd = a.std(axis=axis, ddof=std_conv["ddof"], keepdims=True) if a.shape[axis] > std_conv["ddof"] else 0.0 * centred
    den = np.maximum(sd, eps) if std_conv["eps_mode"] == "clamp" else sd + eps
    return np.divide(centred, den, out=np.zeros_like(centred), where=den > 0)


def np_approx_kl(old: np.ndarray, new: np.ndarray, estimator: str) -> float:
    """approx_kl under the approx_kl convention: k1 = mean(old - new), k3 = mean((r - 1) - log r)."""
    lr = new - old
    return float(np.mean(-lr) if estimator == "k1" else np.mean(np.expm1(lr) - lr))


def np_clip_fraction(r: np.ndarray, clip_eps: float, convention_value: str, adv: np.ndarray | None = None) -> float:
    """The share of clipped samples under the clip_fraction convention (active_clips needs the advantages)."""
    return np_clip_fraction_bounds(r, clip_eps, convention_value, adv)[0]


def np_clip_fraction_bounds(r: np.ndarray, clip_eps: float, convention_value: str, adv: np.ndarray | None = None,
                            band: np.ndarray | float = 0.0) -> tuple[float, float]:
    """The least and the greatest share of clipped samples when each ratio may sit anywhere within ``band`` of
    ``r`` (the rounding of the dtype it was computed in): a ratio that close to 1 ± ε counts either way."""
    if convention_value == "ratio_outside":
        d = np.abs(r - 1.0)
        return float(np.mean(d - band > clip_eps)), float(np.mean(d + band > clip_eps))
    up, down = adv > 0, adv < 0
    surely = ((r - band > 1 + clip_eps) & up) | ((r + band < 1 - clip_eps) & down)
    maybe = ((r + band > 1 + clip_eps) & up) | ((r - band < 1 - clip_eps) & down)
    return float(np.mean(surely)), float(np.mean(maybe))


def np_critic_penalty(err: np.ndarray, delta: float, huber_conv: str) -> np.ndarray:
    """One critic's per-sample penalty under the huber_delta convention: Huber(err, delta) ("any"; δ = 1
    when "fixed_1", the caller passes it) or the plain squared error err² ("mse", no ½)."""
    return err**2 if huber_conv == "mse" else huber(err, delta)


def critic_delta(drawn: float) -> float:
    """The Huber δ a test may pass: the drawn one when any δ is supported, else 1 (fixed_1; ignored by mse)."""
    return drawn if convention("huber_delta") == "any" else 1.0


def temperature_loss_scale(log_alpha: float) -> float:
    """d J / d log α over the entropy gap mean(H − H_tgt): 1 when the loss is written in log α (the seed), α when
    it is written in α (the temperature_param convention), so the sign, and the zero at a met target, never change."""
    return math.exp(log_alpha) if convention("temperature_param") == "alpha" else 1.0


def np_temperature_loss(log_alpha: float, gap: float) -> float:
    """The temperature loss for a mean entropy gap mean(H − H_tgt): log α · gap, or α · gap (temperature_param)."""
    return (math.exp(log_alpha) if convention("temperature_param") == "alpha" else log_alpha) * gap


def log_ratio_clamp(drawn: float | None = None) -> float:
    """The log-ratio clamp a test passes and its oracle applies: the drawn one (or the seed's 20) when the
    implementation declares none, else its declared clamp (inf for "none"), which it uses whatever is passed."""
    if not declares("log_ratio_clamp"):
        return float(convention("log_ratio_clamp")) if drawn is None else drawn
    value = convention("log_ratio_clamp")
    return math.inf if value == "none" else float(value)
