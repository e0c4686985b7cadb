"""In-memory STDB: the same contract as the SQL store, for fast tests and single-process runs."""
from __future__ import annotations

import copy
import threading
from typing import Any, Mapping, Sequence

from reference_impl.ccapo.stdb.update import empty_stats, stdb_update


class MemorySTDB:
    def __init__(self, *, update_fn=stdb_update, **params: Any):
        self._stats = empty_stats()
        self._update_fn, self._params = update_fn, params
        self._lock = threading.Lock()

    def update(self, trajectory: Mapping[str, Any]) -> None:
        with self._lock:  # the rule returns a new state, so a failure leaves the old one intact
            self._stats = self._update_fn(self._stats, trajectory, **self._params)

    def lookup(self, anchors: Sequence[tuple[str, str]], fingerprints: Sequence[str]) -> dict:
        with self._lock:
            s = self._stats
            keys = {(*tuple(a), f) for a, f in zip(anchors, fingerprints)}
            anc = {tuple(a) for a in anchors}
            return {"edges": {k: dict(s["edges"][k]) for k in keys if k in s["edges"]},
                    "anchors": {a: dict(s["anchors"][a]) for a in anc if a in s["anchors"]},
                    "n_succ_total": s["n_succ_total"], "n_total_global": s["n_total_global"]}

    def snapshot(self) -> dict:
        with self._lock:
            return copy.deepcopy(self._stats)

    def restore(self, stats: Mapping[str, Any]) -> None:
        with self._lock:
            self._stats = copy.deepcopy(dict(stats))

    def close(self) -> None:
        pass
