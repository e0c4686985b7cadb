"""MAPPO replay batches keyed and ordered by (episode_id, timestep, agent_id) (seed 002, §6)."""
from __future__ import annotations

import torch

KEY = ("episode_id", "timestep", "agent_id")


def _rows(batch: dict[str, torch.Tensor]) -> int:
    missing = [k for k in KEY if k not in batch]
    if missing:
        raise ValueError(f"[PPO-INPUT-5] MAPPO batch lacks key field(s) {missing}")
    n = batch[KEY[0]].shape[0]
    bad = {k: tuple(v.shape) for k, v in batch.items() if v.dim() == 0 or v.shape[0] != n}
    if bad:
        raise ValueError(f"[PPO-INPUT-5] every field needs {n} rows (one per key); got {bad}")
    return n


def _strictly_increasing(e: torch.Tensor, t: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Per consecutive pair: is key[i] < key[i+1] in lexicographic (episode, timestep, agent) order."""
    e0, e1, t0, t1, a0, a1 = e[:-1], e[1:], t[:-1], t[1:], a[:-1], a[1:]
    return (e0 < e1) | ((e0 == e1) & ((t0 < t1) | ((t0 == t1) & (a0 < a1))))


def align_batch(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    r"""Sort every field by the key (episode_id, timestep, agent_id); a repeated key raises.

    All fields (actor obs, critic obs, action, old log-prob, mask, advantage, return, ...) are moved
    with one permutation, so each row keeps its own mask and its own observations.

    Implements: PPO-MAPPO-1, PPO-MAPPO-2, PPO-MAPPO-4.
    """
    _rows(batch)
    e, t, a = (batch[k].long() for k in KEY)
    order = torch.argsort(a, stable=True)  # lexicographic sort: least significant key first
    order = order[torch.argsort(t[order], stable=True)]
    order = order[torch.argsort(e[order], stable=True)]
    es, ts, as_ = e[order], t[order], a[order]
    dup = ~_strictly_increasing(es, ts, as_)
    if bool(dup.any()):
        i = int(torch.nonzero(dup)[0])
        raise ValueError(f"[PPO-MAPPO-1] duplicate key (episode_id, timestep, agent_id) = "
                         f"({int(es[i])}, {int(ts[i])}, {int(as_[i])})")
    return {k: v[order] for k, v in batch.items()}


def check_alignment(batch: dict[str, torch.Tensor]) -> None:
    r"""Raise unless the rows are in strictly increasing (episode_id, timestep, agent_id) order.

    The comparison is lexicographic on the triple (agent_id restarts at every timestep, so a
    per-column monotonicity check would reject a correctly sorted batch).

    Implements: PPO-MAPPO-1.
    """
    _rows(batch)
    ok = _strictly_increasing(*(batch[k].long() for k in KEY))
    if not bool(ok.all()):
        i = int(torch.nonzero(~ok)[0])
        raise ValueError(f"[PPO-MAPPO-1] rows {i} and {i + 1} are out of (episode_id, timestep, agent_id) order "
                         "or repeat a key")
