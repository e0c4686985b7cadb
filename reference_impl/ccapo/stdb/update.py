r"""The STDB update rule as one pure function over plain data (seed 004 §7.2, §7.3).

Every store backend calls :func:`stdb_update` on the slice of state a trajectory touches, so the
rule is written, tested and mutated once.
"""
from __future__ import annotations

from typing import Any, Mapping

from reference_impl import _checks
from reference_impl.ccapo.scoring import edge_q

EDGE_ZERO = {"n_total": 0, "n_succ": 0, "d_sum": 0.0}


def empty_stats() -> dict[str, Any]:
    """A store with nothing in it."""
    return {"edges": {}, "anchors": {}, "n_succ_total": 0, "n_total_global": 0}


def trajectory_edges(trajectory: Mapping[str, Any]) -> dict[tuple[str, str, str], int]:
    """Distinct edges (loc, prev_fp, fp) of a trajectory in first-visit order -> index of the LAST visit."""
    anchors, fps = trajectory["anchors"], trajectory["fingerprints"]
    if len(anchors) != len(fps):
        raise ValueError(f"[CCAPO-INPUT-3] {len(anchors)} anchors but {len(fps)} fingerprints")
    last: dict[tuple[str, str, str], int] = {}
    for t, (a, f) in enumerate(zip(anchors, fps)):
        last[(*tuple(a), f)] = t
    return last


def stdb_update(stats: Mapping[str, Any], trajectory: Mapping[str, Any], *, v_rate: float = 0.1,
                alpha_smooth: float = 1.0, distance_exponent: float = 0.5, lam: float = 1.0,
                eps: float = 1e-8) -> dict[str, Any]:
    r"""Fold one finished trajectory into the STDB statistics; returns a new state.

    every trajectory:  N_{total}(E) \mathrel{+}= 1 per distinct edge,  N^{global}_{total} \mathrel{+}= 1
    success only:      N_{succ}(E) \mathrel{+}= 1,  d_{sum}(E) \mathrel{+}= T-1-t_{last}(E),  N^{total}_{succ} \mathrel{+}= 1,
                       \bar V(u) \leftarrow (1-\eta)\bar V(u) + \eta\,Q_{STDB}(E)\ \text{for each edge } E \text{ leaving anchor } u

    Q is the edge's score after this trajectory's counts; an anchor's first V̄ is that Q.
    Implements: CCAPO-STDB-1, CCAPO-STDB-2, CCAPO-STDB-3, CCAPO-STDB-4
    """
    _checks.in_range(v_rate, 0.0, 1.0, "CCAPO-INPUT-5", "v_rate")
    last = trajectory_edges(trajectory)
    success = bool(trajectory["success"])
    T = len(trajectory["fingerprints"])
    edges = dict(stats["edges"])
    anchors = dict(stats["anchors"])
    new = {"edges": edges, "anchors": anchors,
           "n_total_global": int(stats["n_total_global"]) + 1,
           "n_succ_total": int(stats["n_succ_total"]) + int(success)}
    for key, t_last in last.items():
        e = dict(edges.get(key, EDGE_ZERO))
        e["n_total"] += 1
        if success:
            e["n_succ"] += 1
            e["d_sum"] = float(e["d_sum"]) + float(T - 1 - t_last)
        edges[key] = e
    if success and last:
        keys = list(last)
        q = edge_q([edges[k] for k in keys], new["n_succ_total"], new["n_total_global"],
                   alpha_smooth=alpha_smooth, distance_exponent=distance_exponent, lam=lam, eps=eps)
        for k, qk in zip(keys, q.tolist()):
            u = k[:2]
            old = anchors.get(u)
            if old is None:
                anchors[u] = {"v_bar": qk, "n_updates": 1}
            else:
                anchors[u] = {"v_bar": (1.0 - v_rate) * float(old["v_bar"]) + v_rate * qk,
                              "n_updates": int(old["n_updates"]) + 1}
    return new
