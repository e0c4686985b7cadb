"""SQL STDB: SQLite (stdlib, embedded default) and PostgreSQL (psycopg 3) behind one class.

Concurrency design:
* one batch of trajectories is ONE transaction, and its first statement takes the store's write
  lock: SQLite's ``BEGIN IMMEDIATE``; on PostgreSQL ``SELECT ... FROM stdb_global ... FOR UPDATE``
  (every writer locks that one row first, so writers queue on it, never deadlock on edge rows, and
  read edges and anchors only after the previous writer committed);
* inside it: one read of the touched edges and anchors (a key-set join, not one SELECT per key),
  the batch folded in Python (:func:`stdb_fold`), one ``executemany`` upsert per table;
* counters are written as increments (``ON CONFLICT ... DO UPDATE SET n = n + excluded.n``), so
  even a writer that skipped the lock would lose no counts;
* SQLite runs in WAL mode: a process killed mid-transaction leaves only uncommitted WAL frames,
  which the next reader ignores; PostgreSQL rolls back the transaction of a dropped connection.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from reference_impl.ccapo.stdb.update import batch_fold, gc_paused, plan_batch, plan_keys, rows_to_state, stdb_update

# Portable DDL: only types and syntax that SQLite and PostgreSQL both accept.
SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS stdb_edge (
    loc      TEXT NOT NULL,
    prev_fp  TEXT NOT NULL,
    fp       TEXT NOT NULL,
    n_total  BIGINT NOT NULL DEFAULT 0,
    n_succ   BIGINT NOT NULL DEFAULT 0,
    d_sum    DOUBLE PRECISION NOT NULL DEFAULT 0,
    PRIMARY KEY (loc, prev_fp, fp)
);
CREATE TABLE IF NOT EXISTS stdb_anchor (
    loc       TEXT NOT NULL,
    prev_fp   TEXT NOT NULL,
    v_bar     DOUBLE PRECISION NOT NULL,
    n_updates BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (loc, prev_fp)
);
CREATE TABLE IF NOT EXISTS stdb_global (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    n_succ_total   BIGINT NOT NULL DEFAULT 0,
    n_total_global BIGINT NOT NULL DEFAULT 0
);
INSERT INTO stdb_global (id, n_succ_total, n_total_global) VALUES (1, 0, 0) ON CONFLICT (id) DO NOTHING;
"""

# SQLite: the same tables clustered on their primary key (WITHOUT ROWID), so an upsert walks one
# B-tree instead of a rowid table plus its key index (about 1.25x the upserts per second).
SQLITE_SCHEMA_SQL = SCHEMA_SQL
for _key in ("(loc, prev_fp, fp)", "(loc, prev_fp)"):
    SQLITE_SCHEMA_SQL = SQLITE_SCHEMA_SQL.replace(f"PRIMARY KEY {_key}\n)", f"PRIMARY KEY {_key}\n) WITHOUT ROWID")
del _key

_UPSERT_EDGE = (
    "INSERT INTO stdb_edge (loc, prev_fp, fp, n_total, n_succ, d_sum) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (loc, prev_fp, fp) DO UPDATE SET n_total = stdb_edge.n_total + excluded.n_total, "
    "n_succ = stdb_edge.n_succ + excluded.n_succ, d_sum = stdb_edge.d_sum + excluded.d_sum"
)
_UPSERT_ANCHOR = (
    "INSERT INTO stdb_anchor (loc, prev_fp, v_bar, n_updates) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (loc, prev_fp) DO UPDATE SET v_bar = excluded.v_bar, "
    "n_updates = stdb_anchor.n_updates + excluded.n_updates"
)
_BUMP_GLOBAL = ("UPDATE stdb_global SET n_succ_total = n_succ_total + ?, "
                "n_total_global = n_total_global + ? WHERE id = 1")
_SEL_GLOBAL = "SELECT n_succ_total, n_total_global FROM stdb_global WHERE id = 1"
_EDGE_COLS, _ANCHOR_COLS = ("loc", "prev_fp", "fp"), ("loc", "prev_fp")


def _sqlite_keyset(cols: Sequence[str], keys: Sequence[tuple]) -> Iterator[tuple[str, list[str], list]]:
    """``(VALUES (?, ?), ...)`` in chunks padded to a power of two (so the statement cache hits),
    padding repeats the last key; the CROSS JOIN makes SQLite probe the primary key per listed key."""
    size = 1024
    for lo in range(0, len(keys), size):
        chunk = list(keys[lo:lo + size])
        n = 8
        while n < len(chunk):
            n *= 2
        chunk += [chunk[-1]] * (n - len(chunk))
        row = "(" + ", ".join("?" * len(cols)) + ")"
        names = [f"column{i + 1}" for i in range(len(cols))]
        yield f"(VALUES {', '.join([row] * n)}) AS k CROSS JOIN", names, [v for k in chunk for v in k]


def _postgres_keyset(cols: Sequence[str], keys: Sequence[tuple]) -> Iterator[tuple[str, list[str], list]]:
    """One ``unnest`` of one text array per key column: the same statement for any batch size."""
    arrays = ", ".join(["?::text[]"] * len(cols))
    yield f"unnest({arrays}) AS k({', '.join(cols)}) JOIN", list(cols), [list(c) for c in zip(*keys)]


@dataclasses.dataclass(frozen=True)
class Dialect:
    """What differs between backends: placeholder, how transactions begin, the write lock, key sets."""
    name: str
    placeholder: str  # "?" (sqlite3 qmark) or "%s" (psycopg format)
    begin: str  # a write transaction
    begin_read: str  # a read-only transaction with one snapshot for all its statements
    lock_global: str  # appended to the first SELECT of a write transaction (the writers' queue)
    keyset: Callable[[Sequence[str], Sequence[tuple]], Iterator[tuple[str, list[str], list]]]
    schema: str = SCHEMA_SQL
    # a query whose value changes whenever ANOTHER connection commits (SQLite's data_version): lets a
    # writer keep the rows it wrote in memory and skip reading them back; None: always read
    data_version: str | None = None

    def sql(self, q: str) -> str:
        return q if self.placeholder == "?" else q.replace("?", self.placeholder)


SQLITE = Dialect("sqlite", "?", "BEGIN IMMEDIATE", "BEGIN", "", _sqlite_keyset, SQLITE_SCHEMA_SQL,
                 "PRAGMA data_version")
POSTGRES = Dialect("postgresql", "%s", "BEGIN", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", " FOR UPDATE",
                   _postgres_keyset)


class SQLSTDB:
    """An STDB over a DB-API connection in autocommit mode (transactions are explicit)."""

    def __init__(self, conn, dialect: Dialect, *, update_fn=stdb_update, **params: Any):
        self._conn, self._d = conn, dialect
        self._fold, self._params = batch_fold(update_fn), params
        cur = conn.cursor()
        for stmt in filter(str.strip, dialect.schema.split(";")):
            cur.execute(stmt)
        self._cache: _RowCache | None = None
        if dialect.data_version:
            with self.transaction(dialect.begin_read):
                empty = not self._exec("SELECT EXISTS (SELECT 1 FROM stdb_edge) OR EXISTS (SELECT 1 FROM stdb_anchor)"
                                       ).fetchone()[0]
                self._cache = _RowCache(self._version(), complete=empty)

    # ----------------------------------------------------------------- plumbing
    def _exec(self, q: str, args: Sequence = ()):
        cur = self._conn.cursor()
        cur.execute(self._d.sql(q), tuple(args))
        return cur

    def _exec_many(self, q: str, rows: list) -> None:
        if rows:
            self._conn.cursor().executemany(self._d.sql(q), rows)

    @contextlib.contextmanager
    def transaction(self, begin: str | None = None):
        """One explicit transaction: COMMIT on success, ROLLBACK on any exception."""
        self._exec(begin or self._d.begin)
        try:
            yield
        except BaseException:
            self._exec("ROLLBACK")
            raise
        self._exec("COMMIT")

    def _rows(self, table: str, cols: Sequence[str], values: str, keys: Sequence[tuple]) -> dict[tuple, tuple]:
        """key -> (values...) of the stored rows among ``keys``."""
        out: dict[tuple, tuple] = {}
        n = len(cols)
        for rel, kcols, args in (self._d.keyset(cols, keys) if keys else ()):
            on = " AND ".join(f"t.{c} = k.{kc}" for c, kc in zip(cols, kcols))
            q = f"SELECT {', '.join('t.' + c for c in cols)}, {values} FROM {rel} {table} AS t ON {on}"
            out.update((tuple(r[:n]), tuple(r[n:])) for r in self._exec(q, args))
        return out

    def _version(self):
        return self._exec(self._d.data_version).fetchone()[0]

    def _cached_rows(self, cache: _RowCache | None, keys, anchors) -> tuple[dict, dict, _RowCache | None]:
        """The stored rows among these keys, from the writer's cache where it is still valid (no other
        connection committed since the version it holds, read under the write lock), else read; and
        the cache to keep if the batch commits. Call it under the write lock."""
        if cache is not None and cache.version != self._version():
            cache = None  # another writer committed: what we remember may be stale
        if cache is None:
            if not self._d.data_version:
                return (self._rows("stdb_edge", _EDGE_COLS, "t.n_total, t.n_succ, t.d_sum", keys),
                        self._rows("stdb_anchor", _ANCHOR_COLS, "t.v_bar, t.n_updates", anchors), None)
            cache = _RowCache(self._version(), complete=False)
        old_e = cache.rows(cache.edges, keys, lambda ks: self._rows(
            "stdb_edge", _EDGE_COLS, "t.n_total, t.n_succ, t.d_sum", ks))
        old_a = cache.rows(cache.anchors, anchors, lambda ks: self._rows(
            "stdb_anchor", _ANCHOR_COLS, "t.v_bar, t.n_updates", ks))
        return old_e, old_a, cache

    def _read(self, keys, anchors, lock: str = "") -> tuple[dict, dict, int, int]:
        """The rows these keys address, as tuples; the global row first (with the writers' lock)."""
        gs, gt = self._exec(_SEL_GLOBAL + lock).fetchone()
        return (self._rows("stdb_edge", _EDGE_COLS, "t.n_total, t.n_succ, t.d_sum", keys),
                self._rows("stdb_anchor", _ANCHOR_COLS, "t.v_bar, t.n_updates", anchors), int(gs), int(gt))

    # ----------------------------------------------------------------- the store contract
    def apply_many(self, trajectories: Sequence[Mapping[str, Any]], plan=None) -> None:
        """The body of :meth:`update_many`; call it inside :meth:`transaction`."""
        plan = plan_batch(trajectories) if plan is None else plan
        cache, self._cache = self._cache, None  # forgotten unless the batch commits (see update_many)
        gs0, gt0 = self._exec(_SEL_GLOBAL + self._d.lock_global).fetchone()  # the writers' lock first
        gs0, gt0 = int(gs0), int(gt0)
        old_e, old_a, cache = self._cached_rows(cache, *plan_keys(plan))
        edges = {k: list(v) for k, v in old_e.items()}
        anchors = {u: list(v) for u, v in old_a.items()}
        gs, gt = self._fold(plan, edges, anchors, gs0, gt0, **self._params)
        zero_e, zero_a = (0, 0, 0.0), (0.0, 0)
        self._exec_many(_UPSERT_EDGE, [(*k, e[0] - o[0], e[1] - o[1], e[2] - o[2])  # increments
                                       for k, e in edges.items() for o in (old_e.get(k, zero_e),)])
        self._exec_many(_UPSERT_ANCHOR, [(*u, a[0], a[1] - o[1])  # V-bar as set, n_updates as an increment
                                         for u, a in anchors.items() for o in (old_a.get(u, zero_a),)
                                         if a[1] != o[1]])  # an anchor only failures touched is unchanged
        self._exec(_BUMP_GLOBAL, (gs - gs0, gt - gt0))
        if cache is not None:  # the rows as the database now holds them (its own float arithmetic)
            for k, e in edges.items():
                o = old_e.get(k, zero_e)
                cache.edges[k] = (o[0] + (e[0] - o[0]), o[1] + (e[1] - o[1]), o[2] + (e[2] - o[2]))
            for u, a in anchors.items():
                o = old_a.get(u, zero_a)
                cache.anchors[u] = (a[0], o[1] + (a[1] - o[1]))
        self._pending = cache

    def apply(self, trajectory: Mapping[str, Any]) -> None:
        self.apply_many([trajectory])

    def update_many(self, trajectories: Sequence[Mapping[str, Any]]) -> None:
        """Fold a batch in, in order, as ONE transaction: all of it or none of it."""
        plan = plan_batch(trajectories)  # a malformed trajectory is rejected before the transaction opens
        self._pending = None
        with gc_paused(), self.transaction():
            self.apply_many(trajectories, plan)
        # committed: keep the rows; the cache's version was read under the lock, and this connection's
        # own commit does not change data_version, so the next batch sees any other writer's commit
        self._cache, self._pending = self._pending, None

    def update(self, trajectory: Mapping[str, Any]) -> None:
        self.update_many([trajectory])

    def lookup(self, anchors: Sequence[tuple[str, str]], fingerprints: Sequence[str]) -> dict:
        keys = list(dict.fromkeys((*tuple(a), f) for a, f in zip(anchors, fingerprints)))
        with self.transaction(self._d.begin_read):
            return rows_to_state(*self._read(keys, list(dict.fromkeys(map(tuple, anchors)))))

    def snapshot(self) -> dict:
        with self.transaction(self._d.begin_read):
            edges = {tuple(r[:3]): r[3:] for r in self._exec("SELECT loc, prev_fp, fp, n_total, n_succ, d_sum "
                                                             "FROM stdb_edge")}
            anchors = {tuple(r[:2]): r[2:] for r in self._exec("SELECT loc, prev_fp, v_bar, n_updates FROM stdb_anchor")}
            gs, gt = self._exec(_SEL_GLOBAL).fetchone()
        return rows_to_state(edges, anchors, gs, gt)

    def restore(self, stats: Mapping[str, Any]) -> None:
        self._cache = None
        with self.transaction():
            self._exec(_SEL_GLOBAL + self._d.lock_global)
            self._exec("DELETE FROM stdb_edge")
            self._exec("DELETE FROM stdb_anchor")
            self._exec("UPDATE stdb_global SET n_succ_total = ?, n_total_global = ? WHERE id = 1",
                       (int(stats["n_succ_total"]), int(stats["n_total_global"])))
            self._exec_many(_UPSERT_EDGE, [(*k, e["n_total"], e["n_succ"], e["d_sum"])
                                           for k, e in stats["edges"].items()])
            self._exec_many(_UPSERT_ANCHOR, [(*a, v["v_bar"], v["n_updates"]) for a, v in stats["anchors"].items()])

    def close(self) -> None:
        self._conn.close()


class _RowCache:
    """The rows a writer read or wrote (key -> row tuple, or None: known absent). ``complete``: the
    database holds no row outside the cache (it was empty when this writer opened it)."""

    def __init__(self, version, *, complete: bool):
        self.version, self.complete = version, complete
        self.edges: dict[tuple, tuple | None] = {}
        self.anchors: dict[tuple, tuple | None] = {}

    def rows(self, table: dict, keys: Sequence[tuple], read: Callable[[list], dict]) -> dict:
        missing = [] if self.complete else [k for k in keys if k not in table]
        if missing:
            found = read(missing)
            table.update((k, found.get(k)) for k in missing)
        return {k: row for k in keys if (row := table.get(k)) is not None}


def sqlite_store(path: str | Path = ":memory:", *, timeout: float = 30.0, **params: Any) -> SQLSTDB:
    """The embedded default: a WAL-mode SQLite file (``isolation_level=None``: explicit transactions)."""
    conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a process crash
    conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
    return SQLSTDB(conn, SQLITE, **params)


def postgres_store(dsn: str, *, connect: Callable | None = None, **params: Any) -> SQLSTDB:
    """PostgreSQL through psycopg 3 (``pip install "psycopg[binary]"``): same schema, same update rule."""
    if connect is None:
        import psycopg  # an optional dependency, imported only here

        connect = psycopg.connect
    conn = connect(dsn, autocommit=True)
    return SQLSTDB(conn, POSTGRES, **params)
