"""The store contract every STDB backend meets."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, Sequence

UpdateFn = Callable[..., dict]


class STDBStore(Protocol):
    """Edges keyed by (anchor, fingerprint) with N_total, N_succ and d_goal evidence; anchors with
    V̄; the global counters N_succ_total and N_total_global."""

    def update_many(self, trajectories: Sequence[Mapping[str, Any]]) -> None:
        """Fold finished trajectories in, in order, atomically (all of the batch or none of it); the
        result equals folding :func:`stdb_update` over them one by one."""

    def update(self, trajectory: Mapping[str, Any]) -> None:
        """``update_many([trajectory])``."""

    def lookup(self, anchors: Sequence[tuple[str, str]], fingerprints: Sequence[str]) -> dict:
        """The slice of state these steps touch (their edges and anchors) plus the global counters,
        in the plain-dict form :func:`stdb_update` and ``score_steps`` read."""

    def snapshot(self) -> dict:
        """The whole state as a plain dict."""

    def restore(self, stats: Mapping[str, Any]) -> None:
        """Replace the whole state (used to roll back to a checkpoint on resume)."""

    def close(self) -> None: ...
