"""SQL STDB: SQLite (stdlib, embedded default) and PostgreSQL (psycopg 3) behind one class.

Concurrency design:
* one batch of trajectories is ONE transaction, and its first statement takes the store's write
  lock: SQLite's ``BEGIN IMMEDIATE``; on PostgreSQL ``SELECT ... FROM stdb_global ... FOR UPDATE``
  (every writer locks that one row first, so writers queue on it, never deadlock on edge rows, and
  read edges and anchors only after the previous writer committed);
* inside it: one read of the touched edges and anchors, the batch folded in Python
  (:func:`fold_rows`), one ``executemany`` upsert per table;
* counters are written as increments (``ON CONFLICT ... DO UPDATE SET n = n + excluded.n``), so
  even a writer that skipped the lock would lose no counts;
* SQLite runs in WAL mode: a process killed mid-transaction leaves only uncommitted WAL frames,
  which the next reader ignores; PostgreSQL rolls back the transaction of a dropped connection.

Keys: strings are interned, edges are not. Locations and fingerprints are few (hundreds) while edges
are many, so every text gets a small integer id in ``stdb_symbol`` (append-only: an id never changes
or goes away) and an edge's key is its three ids packed into one integer, ``loc << 42 | prev << 21 |
fp`` (an anchor's: ``loc << 21 | prev``): exact, no hashing, and SQLite keeps the rows in its rowid
B-tree: the file of tools/benchmarks/bench_stdb.py's workload is 0.45x the text-keyed one (fewer pages
to upsert and to rewrite at COMMIT).
Ids are assigned under the write lock; each writer keeps text <-> id in memory and, holding the
lock, first reads the ids other writers added since (``id >= its next id``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import sqlite3
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import operator

from reference_impl.ccapo.stdb.update import batch_fold, gc_paused, plan_batch, plan_edges, rows_to_state, stdb_update

ID_BITS = 21  # bits per symbol id: 3 x 21 = 63, a signed 64-bit integer (PostgreSQL BIGINT) holds an edge key
MAX_SYMBOL_ID = (1 << ID_BITS) - 1
_LOW, _HIGH = MAX_SYMBOL_ID, 2 * ID_BITS

# Portable DDL: only types and syntax that SQLite and PostgreSQL both accept. stdb_symbol.text has
# no UNIQUE index: ids are assigned only under the write lock, and PostgreSQL caps an index entry at
# about 2.7 kB, which would reject long fingerprints that the table itself stores.
SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS stdb_symbol (
    id   INTEGER PRIMARY KEY,
    text TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS stdb_edge (
    id       BIGINT PRIMARY KEY,
    n_total  BIGINT NOT NULL DEFAULT 0,
    n_succ   BIGINT NOT NULL DEFAULT 0,
    d_sum    DOUBLE PRECISION NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS stdb_anchor (
    id        BIGINT PRIMARY KEY,
    v_bar     DOUBLE PRECISION NOT NULL,
    n_updates BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS stdb_global (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    n_succ_total   BIGINT NOT NULL DEFAULT 0,
    n_total_global BIGINT NOT NULL DEFAULT 0
);
INSERT INTO stdb_global (id, n_succ_total, n_total_global) VALUES (1, 0, 0) ON CONFLICT (id) DO NOTHING;
"""

# SQLite: only "INTEGER PRIMARY KEY" makes the key the rowid (one B-tree, no separate key index);
# its INTEGER is 64-bit, so the same column holds a packed key.
SQLITE_SCHEMA_SQL = SCHEMA_SQL.replace("id       BIGINT PRIMARY KEY", "id       INTEGER PRIMARY KEY").replace(
    "id        BIGINT PRIMARY KEY", "id        INTEGER PRIMARY KEY")

_UPSERT_EDGE = (
    "INSERT INTO stdb_edge (id, n_total, n_succ, d_sum) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (id) DO UPDATE SET n_total = stdb_edge.n_total + excluded.n_total, "
    "n_succ = stdb_edge.n_succ + excluded.n_succ, d_sum = stdb_edge.d_sum + excluded.d_sum"
)
_UPSERT_ANCHOR = (
    "INSERT INTO stdb_anchor (id, v_bar, n_updates) VALUES (?, ?, ?) "
    "ON CONFLICT (id) DO UPDATE SET v_bar = excluded.v_bar, "
    "n_updates = stdb_anchor.n_updates + excluded.n_updates"
)
_BUMP_GLOBAL = ("UPDATE stdb_global SET n_succ_total = n_succ_total + ?, "
                "n_total_global = n_total_global + ? WHERE id = 1")
_SEL_GLOBAL = "SELECT n_succ_total, n_total_global FROM stdb_global WHERE id = 1"
_EDGE_VALUES, _ANCHOR_VALUES = "n_total, n_succ, d_sum", "v_bar, n_updates"
_V1_KEY_COLUMN = "loc"  # the text-keyed schema before interning had (loc, prev_fp, fp) key columns


def _edge_id(ids: Mapping[str, int], k: tuple[str, str, str]) -> int:
    """An edge's key: its three symbol ids packed into 63 bits, exact (the anchor's id is
    ``edge_id >> ID_BITS``). Implements: CCAPO-STDB-6 (one row per distinct edge)."""
    return (ids[k[0]] << _HIGH) | (ids[k[1]] << ID_BITS) | ids[k[2]]


def _anchor_id(ids: Mapping[str, int], u: tuple[str, str]) -> int:
    return (ids[u[0]] << ID_BITS) | ids[u[1]]


def _edge_key(texts: Mapping[int, str], i: int) -> tuple[str, str, str]:
    return texts[i >> _HIGH], texts[(i >> ID_BITS) & _LOW], texts[i & _LOW]


def _anchor_key(texts: Mapping[int, str], i: int) -> tuple[str, str]:
    return texts[i >> ID_BITS], texts[i & _LOW]


def _sqlite_id_set(ids: Sequence[int]) -> tuple[str, list]:
    """The ids as ONE parameter (a JSON array): one statement for any number of keys."""
    return "IN (SELECT value FROM json_each(?))", [json.dumps(list(ids))]


def _postgres_id_set(ids: Sequence[int]) -> tuple[str, list]:
    return "= ANY(?::bigint[])", [list(ids)]


@dataclasses.dataclass(frozen=True)
class Dialect:
    """What differs between backends: placeholder, how transactions begin, the write lock, id sets."""
    name: str
    placeholder: str  # "?" (sqlite3 qmark) or "%s" (psycopg format)
    begin: str  # a write transaction
    begin_read: str  # a read-only transaction with one snapshot for all its statements
    lock_global: str  # appended to the first SELECT of a write transaction (the writers' queue)
    id_set: Callable[[Sequence[int]], tuple[str, list]]  # "id <this>" matches the listed ids
    schema: str = SCHEMA_SQL
    # a query whose value changes whenever ANOTHER connection commits (SQLite's data_version): lets a
    # writer keep the rows it wrote in memory and skip reading them back; None: always read
    data_version: str | None = None

    def sql(self, q: str) -> str:
        return q if self.placeholder == "?" else q.replace("?", self.placeholder)


SQLITE = Dialect("sqlite", "?", "BEGIN IMMEDIATE", "BEGIN", "", _sqlite_id_set, SQLITE_SCHEMA_SQL,
                 "PRAGMA data_version")
POSTGRES = Dialect("postgresql", "%s", "BEGIN", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", " FOR UPDATE",
                   _postgres_id_set)


class _Symbols:
    """text <-> id as the database holds them, plus the ids the open write transaction assigned
    (forgotten if it rolls back). Ids only ever get added, so what a writer knows never goes stale."""

    def __init__(self):
        self.ids: dict[str, int] = {}
        self.texts: dict[int, str] = {}
        self.next = 0  # every id below it is known
        self._pending: list[tuple[int, str]] = []

    def learn(self, rows: Iterable[tuple[int, str]]) -> None:
        for i, text in rows:
            self.ids[text], self.texts[i] = i, text
            self.next = max(self.next, i + 1)

    def assign(self, texts: Iterable[str]) -> list[tuple[int, str]]:
        """(id, text) rows for the texts without an id, for the caller to insert; known from now on."""
        new = list(dict.fromkeys(t for t in texts if t not in self.ids))
        if self.next + len(new) - 1 > MAX_SYMBOL_ID:
            raise ValueError(f"[CCAPO-STDB-6] this batch needs {len(new)} new symbol ids from {self.next} on, but "
                             f"ids are {ID_BITS}-bit (at most {MAX_SYMBOL_ID}) so that three pack into one 63-bit edge "
                             f"key; start a new store for more distinct locations and fingerprints")
        rows = [(self.next + j, t) for j, t in enumerate(new)]
        self.learn(rows)
        self._pending += rows
        return rows

    def commit(self) -> None:
        self._pending = []

    def rollback(self) -> None:
        for i, text in self._pending:
            del self.ids[text], self.texts[i]
        if self._pending:
            self.next = self._pending[0][0]
        self._pending = []


class SQLSTDB:
    """An STDB over a DB-API connection in autocommit mode (transactions are explicit).
    Implements: CCAPO-STDB-6 (the rule itself, CCAPO-STDB-1..4, is :func:`fold_rows`)."""

    def __init__(self, conn, dialect: Dialect, *, update_fn=stdb_update, **params: Any):
        self._conn, self._d = conn, dialect
        self._fold, self._params = batch_fold(update_fn), params
        self._sym = _Symbols()
        self._create_schema()
        if self._is_v1():
            self._migrate_v1()
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

    def _create_schema(self) -> None:
        for stmt in filter(str.strip, self._d.schema.split(";")):
            self._exec(stmt)

    @contextlib.contextmanager
    def transaction(self, begin: str | None = None):
        """One explicit transaction: COMMIT on success, ROLLBACK on any exception (and the symbol
        ids it assigned forgotten)."""
        self._exec(begin or self._d.begin)
        try:
            yield
            self._exec("COMMIT")
        except BaseException:
            self._sym.rollback()
            with contextlib.suppress(Exception):  # a failed COMMIT may already have ended it
                self._exec("ROLLBACK")
            raise
        self._sym.commit()

    def _sync_symbols(self) -> None:
        """Learn the ids other writers added (call it inside a transaction)."""
        self._sym.learn(self._exec("SELECT id, text FROM stdb_symbol WHERE id >= ?", (self._sym.next,)))

    def _intern(self, texts: Iterable[str]) -> dict[str, int]:
        """text -> id with an id for every one of ``texts``; call it under the write lock, after
        :meth:`_sync_symbols` (a text another writer gave an id must not get a second one)."""
        self._exec_many("INSERT INTO stdb_symbol (id, text) VALUES (?, ?)", self._sym.assign(texts))
        return self._sym.ids

    def _edge_ids(self, edges: Iterable[tuple[str, str, str]]) -> dict[tuple[str, str, str], int]:
        """Edge -> packed key, interning texts that have no id yet (under the write lock)."""
        self._sync_symbols()
        ids = self._sym.ids
        new = set().union(*edges).difference(ids)
        if new:
            self._intern(sorted(new))  # sorted: the same ids for the same stream
        return {k: _edge_id(ids, k) for k in edges}

    def _rows(self, table: str, values: str, ids: Sequence[int]) -> dict[int, tuple]:
        """id -> (id, values...) of the stored rows among ``ids``."""
        if not ids:
            return {}
        cond, args = self._d.id_set(ids)
        return {r[0]: tuple(r) for r in self._exec(f"SELECT id, {values} FROM {table} WHERE id {cond}", args)}

    def _version(self):
        return self._exec(self._d.data_version).fetchone()[0]

    def _cached_rows(self, cache: _RowCache | None, eids, aids) -> tuple[dict, dict, _RowCache | None]:
        """The stored rows among these ids, from the writer's cache where it is still valid (no other
        connection committed since the version it holds, read under the write lock), else read; and
        the cache to keep if the batch commits. Call it under the write lock."""
        if cache is not None and cache.version != self._version():
            cache = None  # another writer committed: what we remember may be stale
        if cache is None:
            if not self._d.data_version:
                return self._rows("stdb_edge", _EDGE_VALUES, eids), self._rows("stdb_anchor", _ANCHOR_VALUES, aids), None
            cache = _RowCache(self._version(), complete=False)
        old_e = cache.rows(cache.edges, eids, lambda ids: self._rows("stdb_edge", _EDGE_VALUES, ids))
        old_a = cache.rows(cache.anchors, aids, lambda ids: self._rows("stdb_anchor", _ANCHOR_VALUES, ids))
        return old_e, old_a, cache

    # ----------------------------------------------------------------- the store contract
    def apply_many(self, trajectories: Sequence[Mapping[str, Any]], plan=None) -> None:
        """The body of :meth:`update_many`; call it inside :meth:`transaction`."""
        plan = plan_batch(trajectories) if plan is None else plan
        cache, self._cache = self._cache, None  # forgotten unless the batch commits (see update_many)
        gs0, gt0 = self._exec(_SEL_GLOBAL + self._d.lock_global).fetchone()  # the writers' lock first
        gs0, gt0 = int(gs0), int(gt0)
        eid = self._edge_ids(plan_edges(plan))
        aids = list({i >> ID_BITS for i in eid.values()})  # an edge's anchor: its top two ids
        old_e, old_a, cache = self._cached_rows(cache, list(eid.values()), aids)
        t = self._sym.texts  # the fold's private copies of the stored rows, keyed by text
        edges = {_edge_key(t, i): list(r[1:]) for i, r in old_e.items()}
        anchors = {_anchor_key(t, i): list(r[1:]) for i, r in old_a.items()}
        gs, gt = self._fold(plan, edges, anchors, gs0, gt0, **self._params)
        # Upsert rows (id, increments...). The fold only adds keys, and dicts keep insertion order, so
        # each dict lists the stored rows first, in old_e's / old_a's order, then the new keys.
        stored_e, added_e = _split(edges, len(old_e))
        grown_e = [(i, e[0] - o[1], e[1] - o[2], e[2] - o[3]) for (i, o), e in zip(old_e.items(), stored_e)]
        new_e = [(eid[k], *e) for k, e in added_e]
        ids = self._sym.ids  # anchors: V-bar is set, n_updates is an increment
        stored_a, added_a = _split(anchors, len(old_a))
        grown_a = [(i, a[0], a[1] - o[2]) for (i, o), a in zip(old_a.items(), stored_a)
                   if a[1] != o[2]]  # else only failures touched it: unchanged
        new_a = [(_anchor_id(ids, u), *a) for u, a in added_a]
        self._exec_many(_UPSERT_EDGE, new_e + grown_e)
        self._exec_many(_UPSERT_ANCHOR, new_a + grown_a)
        self._exec(_BUMP_GLOBAL, (gs - gs0, gt - gt0))
        if cache is not None:  # the rows as the database now holds them (its own float arithmetic)
            _remember(cache.edges, old_e, new_e, grown_e)
            _remember(cache.anchors, old_a, new_a, grown_a, set_first=True)
        self._pending = cache

    def apply(self, trajectory: Mapping[str, Any]) -> None:
        self.apply_many([trajectory])

    def update_many(self, trajectories: Sequence[Mapping[str, Any]]) -> None:
        """Fold a batch in, in order, as ONE transaction: all of it or none of it (CCAPO-STDB-6)."""
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
        keys = dict.fromkeys((*tuple(a), f) for a, f in zip(anchors, fingerprints))
        with self.transaction(self._d.begin_read):
            gs, gt = self._exec(_SEL_GLOBAL).fetchone()
            self._sync_symbols()
            ids = self._sym.ids
            eid = {_edge_id(ids, k): k for k in keys if all(t in ids for t in k)}  # a text without an id is in no row
            aid = {_anchor_id(ids, u): u for u in map(tuple, anchors) if all(t in ids for t in u)}
            edges = {eid[i]: r[1:] for i, r in self._rows("stdb_edge", _EDGE_VALUES, list(eid)).items()}
            anchor_rows = {aid[i]: r[1:] for i, r in self._rows("stdb_anchor", _ANCHOR_VALUES, list(aid)).items()}
        return rows_to_state(edges, anchor_rows, gs, gt)

    def snapshot(self) -> dict:
        with self.transaction(self._d.begin_read):
            self._sync_symbols()
            t = self._sym.texts
            edges = {_edge_key(t, i): r for i, *r in self._exec(f"SELECT id, {_EDGE_VALUES} FROM stdb_edge")}
            anchors = {_anchor_key(t, i): r for i, *r in self._exec(f"SELECT id, {_ANCHOR_VALUES} FROM stdb_anchor")}
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
            self._write_rows({k: (e["n_total"], e["n_succ"], e["d_sum"]) for k, e in stats["edges"].items()},
                             {u: (a["v_bar"], a["n_updates"]) for u, a in stats["anchors"].items()})

    def _write_rows(self, edges: Mapping[tuple, tuple], anchors: Mapping[tuple, tuple]) -> None:
        """Text-keyed rows into the emptied tables (under the write lock)."""
        self._sync_symbols()
        ids = self._intern(t for k in (*edges, *anchors) for t in k)
        self._exec_many(_UPSERT_EDGE, [(_edge_id(ids, k), *e) for k, e in edges.items()])
        self._exec_many(_UPSERT_ANCHOR, [(_anchor_id(ids, u), *a) for u, a in anchors.items()])

    # ----------------------------------------------------------------- the text-keyed schema before interning
    def _is_v1(self) -> bool:
        cur = self._exec("SELECT * FROM stdb_edge WHERE 1 = 0")
        cur.fetchall()
        return _V1_KEY_COLUMN in [c[0] for c in cur.description]

    def _migrate_v1(self) -> None:
        """Rewrite a store file of the text-keyed schema in the interned one, as ONE transaction under
        the write lock (so a crash leaves the old file, and a second process opening it waits, then
        finds it migrated). A resumed run continues on the same statistics."""
        with self.transaction():
            self._exec(_SEL_GLOBAL + self._d.lock_global)
            if not self._is_v1():
                return
            edges = {tuple(r[:3]): tuple(r[3:]) for r in self._exec(
                "SELECT loc, prev_fp, fp, n_total, n_succ, d_sum FROM stdb_edge")}
            anchors = {tuple(r[:2]): tuple(r[2:]) for r in self._exec(
                "SELECT loc, prev_fp, v_bar, n_updates FROM stdb_anchor")}
            self._exec("DROP TABLE stdb_edge")
            self._exec("DROP TABLE stdb_anchor")
            self._create_schema()
            self._write_rows(edges, anchors)

    def close(self) -> None:
        self._conn.close()


def _split(rows: dict, n: int) -> tuple[Iterable[list], Iterable[tuple[Any, list]]]:
    """The first ``n`` values of ``rows``, and its other items."""
    return itertools.islice(rows.values(), n), itertools.islice(rows.items(), n, None)


def _remember(table: dict, old: Mapping[int, tuple], new: list[tuple], grown: list[tuple],
              set_first: bool = False) -> None:
    """Into a writer's cache: each row as the database holds it after the upsert: a new row as
    written; a stored one as its old values plus the increments, in the database's float arithmetic
    (``set_first``: the first value is set, not added: V-bar)."""
    table.update(zip(map(_first, new), new))
    for r in grown:
        o = old[r[0]]
        table[r[0]] = (r[0], r[1], *map(operator.add, o[2:], r[2:])) if set_first else \
            (r[0], *map(operator.add, o[1:], r[1:]))


_first = operator.itemgetter(0)


class _RowCache:
    """The rows a writer read or wrote (id -> (id, values...), or None: known absent). ``complete``: the
    database holds no row outside the cache (it was empty when this writer opened it)."""

    def __init__(self, version, *, complete: bool):
        self.version, self.complete = version, complete
        self.edges: dict[int, tuple | None] = {}
        self.anchors: dict[int, tuple | None] = {}

    def rows(self, table: dict, keys: Sequence[int], read: Callable[[list], dict]) -> dict:
        missing = [] if self.complete else list(set(keys).difference(table))
        if missing:
            found = read(missing)
            table.update((k, found.get(k)) for k in missing)
        return {k: row for k in table.keys() & keys if (row := table[k]) is not None}


def sqlite_store(path: str | Path = ":memory:", *, timeout: float = 30.0, **params: Any) -> SQLSTDB:
    """The embedded default: a WAL-mode SQLite file (``isolation_level=None``: explicit transactions).
    A file in the text-keyed schema of earlier versions is migrated on open."""
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
