r"""The STDB update rule as one pure function over plain data (seed 004 §7.2, §7.3).

Every store backend calls :func:`stdb_update` on the slice of state a trajectory touches, so the
rule is written, tested and mutated once. :func:`stdb_fold` is the same rule folded over a batch with
plain floats and no copy of the untouched state; :func:`stdb_update` stays the oracle it is
differentially tested against (``conformance_tests/meta/test_ccapo_stdb_store.py``).
"""
from __future__ import annotations

import contextlib
import gc
from typing import Any, Callable, Iterable, Mapping, Sequence

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
    try:  # a repeated key keeps its first position and takes its last value
        return {(loc, prev, f): t for t, ((loc, prev), f) in enumerate(zip(anchors, fps))}
    except (TypeError, ValueError) as e:  # an anchor that is not a pair, a key that is not hashable
        raise ValueError(f"[CCAPO-INPUT-3] anchors must be (location, previous fingerprint) pairs and "
                         f"fingerprints strings: {e}") from None


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


Plan = list  # [(trajectory_edges(tr), success, T, tr) per trajectory], see plan_batch
Rows = dict  # key -> mutable row: edges [n_total, n_succ, d_sum], anchors [v_bar, n_updates]


def plan_batch(trajectories: Sequence[Mapping[str, Any]]) -> Plan:
    """Each trajectory's distinct edges (-> last visit), success and length; validates ALL of them first,
    so a malformed trajectory rejects the whole batch before anything is read or written."""
    return [(trajectory_edges(tr), bool(tr["success"]), len(tr["fingerprints"]), tr) for tr in trajectories]


def plan_keys(plan: Plan) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]]]:
    """The distinct edges and anchors a planned batch touches, in first-visit order."""
    edges = plan_edges(plan)
    return list(edges), list(dict.fromkeys(k[:2] for k in edges))


def plan_edges(plan: Plan) -> dict[tuple[str, str, str], int]:
    """The distinct edges a planned batch touches, in first-visit order (as keys; the values are meaningless)."""
    edges: dict[tuple[str, str, str], int] = {}
    for last, *_ in plan:
        edges.update(last)
    return edges


def batch_keys(trajectories: Sequence[Mapping[str, Any]]) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]]]:
    """The distinct edges and anchors a batch touches (validating every trajectory first)."""
    return plan_keys(plan_batch(trajectories))


def state_slice(stats: Mapping[str, Any], edges: Iterable, anchors: Iterable) -> dict[str, Any]:
    """The part of a state these edges and anchors address (entries shared, not copied)."""
    e, a = stats["edges"], stats["anchors"]
    return {"edges": {k: e[k] for k in edges if k in e}, "anchors": {u: a[u] for u in anchors if u in a},
            "n_succ_total": stats["n_succ_total"], "n_total_global": stats["n_total_global"]}


def rows_to_state(edges: Rows, anchors: Rows, gs: int, gt: int) -> dict[str, Any]:
    """Row form (what the stores keep and the fast fold works on) -> the plain-dict state."""
    return {"edges": {k: {"n_total": int(e[0]), "n_succ": int(e[1]), "d_sum": float(e[2])} for k, e in edges.items()},
            "anchors": {u: {"v_bar": float(a[0]), "n_updates": int(a[1])} for u, a in anchors.items()},
            "n_succ_total": int(gs), "n_total_global": int(gt)}


def state_to_rows(stats: Mapping[str, Any]) -> tuple[Rows, Rows, int, int]:
    """The plain-dict state -> row form (fresh lists: the caller may mutate them)."""
    return ({k: [int(e["n_total"]), int(e["n_succ"]), float(e["d_sum"])] for k, e in stats["edges"].items()},
            {u: [float(a["v_bar"]), int(a["n_updates"])] for u, a in stats["anchors"].items()},
            int(stats["n_succ_total"]), int(stats["n_total_global"]))


@contextlib.contextmanager
def gc_paused():
    """The cyclic garbage collector paused while a batch folds in. The fold allocates thousands of
    small rows and keys and makes no reference cycles, yet each allocation burst triggers collections
    that walk every object in the process (a trainer's whole heap): 4-5x the fold's own time.
    Only re-enables what it disabled, so nested or concurrent uses leave the collector as they found it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _check_params(v_rate: float, alpha_smooth: float, distance_exponent: float, lam: float) -> None:
    """The same ranges the scoring functions enforce (CCAPO-INPUT-5), checked once per batch."""
    _checks.in_range(v_rate, 0.0, 1.0, "CCAPO-INPUT-5", "v_rate")
    _checks.in_range(alpha_smooth, 0.0, float("inf"), "CCAPO-INPUT-5", "alpha_smooth", hi_open=True)
    _checks.in_range(distance_exponent, 0.0, float("inf"), "CCAPO-INPUT-5", "distance_exponent",
                     lo_open=False, hi_open=True)
    _checks.in_range(lam, 0.0, float("inf"), "CCAPO-INPUT-5", "lam", lo_open=False, hi_open=True)


def fold_rows(plan: Plan, edges: Rows, anchors: Rows, gs: int, gt: int, *, v_rate: float = 0.1,
              alpha_smooth: float = 1.0, distance_exponent: float = 0.5, lam: float = 1.0,
              eps: float = 1e-8) -> tuple[int, int]:
    r"""The STDB rule folded over a planned batch, in order, on rows mutated IN PLACE.

    ``edges`` / ``anchors`` hold the caller's private row of every touched key the store has
    (a key missing there is a key missing from the store); returns the new (N_succ_total,
    N_total_global). The result equals folding :func:`stdb_update` over the batch; Q_STDB is
    computed with Python floats in the order :func:`reference_impl.ccapo.scoring.edge_q` uses:

        I = \frac{N_s + \alpha}{N_t + 2\alpha},\ C = \frac{N_s/(N_t+\epsilon)}{N^{tot}_s/(N^{glob}_t+\epsilon)+\epsilon},\
        D = (d_{sum}/N_s + 1)^{-\gamma_d},\ x = I(1+\lambda C)D,\ Q = \frac{x}{1+x}

    Implements: CCAPO-STDB-1, CCAPO-STDB-2, CCAPO-STDB-3, CCAPO-STDB-4 (CCAPO-I-1, CCAPO-C-1,
    CCAPO-D-1 and CCAPO-Q-1 inlined)
    """
    _check_params(v_rate, alpha_smooth, distance_exponent, lam)
    two_a, keep = 2.0 * alpha_smooth, 1.0 - v_rate
    for last, success, T, _ in plan:
        gt += 1  # CCAPO-STDB-1
        if not success:
            for k in last:  # CCAPO-STDB-1: a failure adds N_total only
                e = edges.get(k)
                if e is None:
                    edges[k] = [1, 0, 0.0]
                else:
                    e[0] += 1
            continue
        gs += 1  # CCAPO-STDB-2
        for k, t_last in last.items():
            e = edges.get(k)
            if e is None:
                edges[k] = [1, 1, float(T - 1 - t_last)]  # CCAPO-STDB-4
            else:
                e[0] += 1
                e[1] += 1
                e[2] += float(T - 1 - t_last)
        c_den = gs / (gt + eps) + eps  # the global success rate (+ eps) under C
        for k in last:  # CCAPO-STDB-3, in first-visit order as stdb_update
            nt, ns, ds = edges[k]
            x = ((ns + alpha_smooth) / (nt + two_a)) * (1.0 + lam * ((ns / (nt + eps)) / c_den)) \
                * (ds / ns + 1.0) ** -distance_exponent  # ns >= 1: this trajectory succeeded
            q = x / (1.0 + x)
            a = anchors.get(k[:2])
            if a is None:
                anchors[k[:2]] = [q, 1]  # an anchor's first V-bar is its edge's Q
            else:
                a[0] = keep * a[0] + v_rate * q
                a[1] += 1
    return gs, gt


def rule_fold_rows(rule: Callable[..., dict]) -> Callable[..., tuple[int, int]]:
    """:func:`fold_rows`' signature for any per-trajectory rule (a mutant, an experiment): the rule
    folded over the rows in plain-dict form, written back into the rows."""
    def fold(plan: Plan, edges: Rows, anchors: Rows, gs: int, gt: int, **params: Any) -> tuple[int, int]:
        state = rows_to_state(edges, anchors, gs, gt)
        for *_, trajectory in plan:
            state = rule(state, trajectory, **params)
        new_e, new_a, gs, gt = state_to_rows(state)
        edges.update(new_e)
        anchors.update(new_a)
        return gs, gt
    return fold


def batch_fold(update_fn: Callable[..., dict]) -> Callable[..., tuple[int, int]]:
    """The row fold the stores use: :func:`fold_rows` for the reference rule, the rule itself otherwise."""
    return fold_rows if update_fn is stdb_update else rule_fold_rows(update_fn)


def stdb_fold(stats: Mapping[str, Any], trajectories: Sequence[Mapping[str, Any]], **params: Any) -> dict[str, Any]:
    """:func:`fold_rows` on a plain-dict state: returns the TOUCHED part of the new state (the batch's
    edges and anchors and the new global counters) without modifying ``stats`` or copying what the
    batch does not touch; merge it with ``dict.update``. Implements: CCAPO-STDB-1..4 (see fold_rows)."""
    plan = plan_batch(trajectories)
    ek, ak = plan_keys(plan)
    edges, anchors, gs, gt = state_to_rows(state_slice(stats, ek, ak))
    gs, gt = fold_rows(plan, edges, anchors, gs, gt, **params)
    return rows_to_state(edges, anchors, gs, gt)
