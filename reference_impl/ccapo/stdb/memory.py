"""In-memory STDB: the same contract as the SQL store, for fast tests and single-process runs."""
from __future__ import annotations

import threading
from typing import Any, Mapping, Sequence

from reference_impl.ccapo.stdb.update import (batch_fold, gc_paused, plan_batch, plan_keys, rows_to_state,
                                              state_to_rows, stdb_update)


class MemorySTDB:
    """Rows kept as mutable lists (``update.Rows``); an update copies only the rows its batch touches."""

    def __init__(self, *, update_fn=stdb_update, **params: Any):
        self._edges, self._anchors, self._gs, self._gt = {}, {}, 0, 0
        self._fold, self._params = batch_fold(update_fn), params
        self._lock = threading.Lock()

    def update_many(self, trajectories: Sequence[Mapping[str, Any]]) -> None:
        """Fold a batch in, all of it or none of it: the fold works on private copies of the touched
        rows, which replace the stored ones only once it has succeeded."""
        with gc_paused():
            self._update_many(trajectories)

    def _update_many(self, trajectories: Sequence[Mapping[str, Any]]) -> None:
        plan = plan_batch(trajectories)
        ek, ak = plan_keys(plan)
        with self._lock:
            edges = {k: list(self._edges[k]) for k in ek if k in self._edges}
            anchors = {u: list(self._anchors[u]) for u in ak if u in self._anchors}
            gs, gt = self._fold(plan, edges, anchors, self._gs, self._gt, **self._params)
            self._edges.update(edges)
            self._anchors.update(anchors)
            self._gs, self._gt = gs, gt

    def update(self, trajectory: Mapping[str, Any]) -> None:
        self.update_many([trajectory])

    def lookup(self, anchors: Sequence[tuple[str, str]], fingerprints: Sequence[str]) -> dict:
        keys = {(*tuple(a), f) for a, f in zip(anchors, fingerprints)}
        with self._lock:
            return rows_to_state({k: self._edges[k] for k in keys if k in self._edges},
                                 {u: self._anchors[u] for u in map(tuple, anchors) if u in self._anchors},
                                 self._gs, self._gt)

    def snapshot(self) -> dict:
        with self._lock:
            return rows_to_state(self._edges, self._anchors, self._gs, self._gt)

    def restore(self, stats: Mapping[str, Any]) -> None:
        rows = state_to_rows(stats)
        with self._lock:
            self._edges, self._anchors, self._gs, self._gt = rows

    def close(self) -> None:
        pass
