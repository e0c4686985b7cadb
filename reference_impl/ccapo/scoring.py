r"""STDB edge scoring (seed 004 §3.2): I(E), C(E), D(E) and Q_STDB, plus the per-step lookup."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from reference_impl import _checks


def _float(x) -> torch.Tensor:
    """Python numbers and integer tensors become float64; float tensors keep their dtype."""
    if not isinstance(x, torch.Tensor):
        return torch.as_tensor(x, dtype=torch.float64)
    return x if x.is_floating_point() else x.to(torch.float64)


def _counts(**named) -> dict[str, torch.Tensor]:
    """Counts and distances as float tensors; NaN/inf and negative values are bad input."""
    out = {}
    for k, v in named.items():
        t = _float(v)
        _checks.finite(t, "CCAPO-INPUT-1", k)
        if _checks._on() and bool((t < 0).any()):
            raise ValueError(f"[CCAPO-INPUT-2] {k} has a negative count")
        out[k] = t
    return out


def importance(n_succ, n_total, *, alpha_smooth: float = 1.0) -> torch.Tensor:
    r"""Bayesian-smoothed conditional success rate of an edge.

    I(E) = \frac{N_{succ}(E) + \alpha}{N_{total}(E) + 2\alpha}

    Implements: CCAPO-I-1
    """
    c = _counts(n_succ=n_succ, n_total=n_total)
    _checks.in_range(alpha_smooth, 0.0, float("inf"), "CCAPO-INPUT-5", "alpha_smooth", hi_open=True)
    if _checks._on() and bool((c["n_succ"] > c["n_total"]).any()):
        raise ValueError("[CCAPO-INPUT-2] n_succ exceeds n_total")
    return (c["n_succ"] + alpha_smooth) / (c["n_total"] + 2.0 * alpha_smooth)


def criticality(n_succ, n_total, n_succ_total, n_total_global, *, eps: float = 1e-8) -> torch.Tensor:
    r"""Success rate through the edge relative to the global success rate.

    C(E) = \frac{N_{succ}(E)/(N_{total}(E)+\epsilon)}{N^{total}_{succ}/(N^{global}_{total}+\epsilon) + \epsilon}

    Implements: CCAPO-C-1
    """
    c = _counts(n_succ=n_succ, n_total=n_total, n_succ_total=n_succ_total,
                n_total_global=n_total_global)
    p_edge = c["n_succ"] / (c["n_total"] + eps)
    p_all = c["n_succ_total"] / (c["n_total_global"] + eps)
    return p_edge / (p_all + eps)


def distance_decay(d_goal, *, distance_exponent: float = 0.5) -> torch.Tensor:
    r"""Potential-style decay with the mean logical distance to the goal.

    D(E) = (d_{goal}(E) + 1)^{-\gamma_d}, \gamma_d = distance_exponent (the document's second α)

    Implements: CCAPO-D-1
    """
    d = _counts(d_goal=d_goal)["d_goal"]
    _checks.in_range(distance_exponent, 0.0, float("inf"), "CCAPO-INPUT-5", "distance_exponent",
                     lo_open=False, hi_open=True)
    return (d + 1.0).pow(-distance_exponent)


def q_stdb(importance, criticality, distance, *, lam: float = 1.0) -> torch.Tensor:
    r"""Micro value of an edge squashed into (0, 1).

    Q = \sigma(\log x) = \frac{x}{1+x},\quad x = I(E)\,(1+\lambda C(E))\,D(E)

    The closed form x/(1+x) avoids log(0) and is exact where σ(log x) would round.
    Implements: CCAPO-Q-1
    """
    i, c, d = (_float(v) for v in (importance, criticality, distance))
    for name, t in (("importance", i), ("criticality", c), ("distance", d)):
        _checks.finite(t, "CCAPO-INPUT-1", name)
        if _checks._on() and bool((t < 0).any()):
            raise ValueError(f"[CCAPO-INPUT-2] {name} is negative")
    _checks.in_range(lam, 0.0, float("inf"), "CCAPO-INPUT-5", "lam", lo_open=False, hi_open=True)
    x = i * (1.0 + lam * c) * d
    return x / (1.0 + x)


def edge_q(edges: Sequence[Mapping[str, float]], n_succ_total, n_total_global, *, alpha_smooth: float = 1.0,
           distance_exponent: float = 0.5, lam: float = 1.0, eps: float = 1e-8) -> torch.Tensor:
    """Q_STDB of a list of stored edges ({n_total, n_succ, d_sum}); shared by lookup and update.

    d_goal = d_sum / n_succ; an edge never on a successful trajectory has no distance evidence
    and gets D = 1 (no decay). Implements: CCAPO-Q-1, CCAPO-STDB-5
    """
    n_tot = torch.tensor([float(e["n_total"]) for e in edges], dtype=torch.float64)
    n_suc = torch.tensor([float(e["n_succ"]) for e in edges], dtype=torch.float64)
    d_sum = torch.tensor([float(e["d_sum"]) for e in edges], dtype=torch.float64)
    d_goal = torch.where(n_suc > 0, d_sum / n_suc.clamp_min(1.0), torch.zeros_like(d_sum))
    i = importance(n_suc, n_tot, alpha_smooth=alpha_smooth)
    c = criticality(n_suc, n_tot, float(n_succ_total), float(n_total_global), eps=eps)
    d = distance_decay(d_goal, distance_exponent=distance_exponent)
    return q_stdb(i, c, d, lam=lam)


def score_steps(stats: Mapping[str, Any], anchors: Sequence[tuple[str, str]], fingerprints: Sequence[str], *,
                alpha_smooth: float = 1.0, distance_exponent: float = 0.5, lam: float = 1.0,
                eps: float = 1e-8) -> dict[str, torch.Tensor]:
    """Per-step STDB lookup: Q of each step's edge and V̄ of its anchor, with seen flags.

    Implements: CCAPO-STDB-5, CCAPO-MICRO-1
    """
    if len(anchors) != len(fingerprints):
        raise ValueError(f"[CCAPO-INPUT-3] {len(anchors)} anchors but {len(fingerprints)} fingerprints")
    T = len(fingerprints)
    keys = [(*tuple(a), f) for a, f in zip(anchors, fingerprints)]
    edge_seen = torch.tensor([k in stats["edges"] for k in keys], dtype=torch.bool)
    q = torch.zeros(T, dtype=torch.float64)
    if bool(edge_seen.any()):
        found = [stats["edges"][k] for k in keys if k in stats["edges"]]
        q[edge_seen] = edge_q(found, stats["n_succ_total"], stats["n_total_global"], alpha_smooth=alpha_smooth,
                              distance_exponent=distance_exponent, lam=lam, eps=eps)
    anc = [tuple(a) for a in anchors]
    anchor_seen = torch.tensor([a in stats["anchors"] for a in anc], dtype=torch.bool)
    v_bar = torch.tensor([float(stats["anchors"][a]["v_bar"]) if a in stats["anchors"] else 0.0 for a in anc],
                         dtype=torch.float64)
    return {"q": q, "edge_seen": edge_seen, "v_bar": v_bar, "anchor_seen": anchor_seen}
