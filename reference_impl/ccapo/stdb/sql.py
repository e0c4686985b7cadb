"""SQL STDB: SQLite (stdlib, embedded default) and PostgreSQL (psycopg) behind one class.

Concurrency design:
* one trajectory's update is ONE transaction; SQLite opens it with ``BEGIN IMMEDIATE`` (the write
  lock is taken before the first read, so the read-modify-write of V̄ cannot interleave), PostgreSQL
  with ``BEGIN`` plus ``SELECT ... FOR UPDATE`` on the rows it will rewrite;
* counters are written as increments (``ON CONFLICT ... DO UPDATE SET n = n + excluded.n``), so
  even a backend that lets writers interleave loses no counts;
* SQLite runs in WAL mode: a process killed mid-transaction leaves only uncommitted WAL frames,
  which the next reader ignores.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from reference_impl.ccapo.stdb.update import EDGE_ZERO, empty_stats, stdb_update

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
_SEL_EDGE = "SELECT n_total, n_succ, d_sum FROM stdb_edge WHERE loc = ? AND prev_fp = ? AND fp = ?"
_SEL_ANCHOR = "SELECT v_bar, n_updates FROM stdb_anchor WHERE loc = ? AND prev_fp = ?"
_SEL_GLOBAL = "SELECT n_succ_total, n_total_global FROM stdb_global WHERE id = 1"


@dataclasses.dataclass(frozen=True)
class Dialect:
    """What differs between backends: placeholder, how a write transaction begins, row locks."""
    name: str
    placeholder: str  # "?" (sqlite3 qmark) or "%s" (psycopg format)
    begin: str
    lock_rows: str  # appended to SELECTs inside the update transaction

    def sql(self, q: str) -> str:
        return q if self.placeholder == "?" else q.replace("?", self.placeholder)


SQLITE = Dialect("sqlite", "?", "BEGIN IMMEDIATE", "")
POSTGRES = Dialect("postgresql", "%s", "BEGIN", " FOR UPDATE")


class SQLSTDB:
    """An STDB over a DB-API connection in autocommit mode (transactions are explicit)."""

    def __init__(self, conn, dialect: Dialect, *, update_fn=stdb_update, **params: Any):
        self._conn, self._d = conn, dialect
        self._update_fn, self._params = update_fn, params
        cur = conn.cursor()
        for stmt in filter(str.strip, SCHEMA_SQL.split(";")):
            cur.execute(stmt)

    # ----------------------------------------------------------------- plumbing
    def _exec(self, q: str, args: Sequence = ()):
        cur = self._conn.cursor()
        cur.execute(self._d.sql(q), tuple(args))
        return cur

    @contextlib.contextmanager
    def transaction(self):
        """One explicit transaction: COMMIT on success, ROLLBACK on any exception."""
        self._exec(self._d.begin)
        try:
            yield
        except BaseException:
            self._exec("ROLLBACK")
            raise
        self._exec("COMMIT")

    def _read(self, keys, anchors, lock: str = "") -> dict:
        edges = {}
        for k in keys:
            row = self._exec(_SEL_EDGE + lock, k).fetchone()
            if row is not None:
                edges[k] = {"n_total": int(row[0]), "n_succ": int(row[1]), "d_sum": float(row[2])}
        anc = {}
        for a in anchors:
            row = self._exec(_SEL_ANCHOR + lock, a).fetchone()
            if row is not None:
                anc[a] = {"v_bar": float(row[0]), "n_updates": int(row[1])}
        g = self._exec(_SEL_GLOBAL + lock).fetchone()
        return {"edges": edges, "anchors": anc, "n_succ_total": int(g[0]), "n_total_global": int(g[1])}

    @staticmethod
    def _keys(anchors, fingerprints):
        keys = list(dict.fromkeys((*tuple(a), f) for a, f in zip(anchors, fingerprints)))
        return keys, list(dict.fromkeys(tuple(a) for a in anchors))

    # ----------------------------------------------------------------- the store contract
    def apply(self, trajectory: Mapping[str, Any]) -> None:
        """The body of :meth:`update`; call it inside :meth:`transaction`."""
        keys, anchors = self._keys(trajectory["anchors"], trajectory["fingerprints"])
        old = self._read(keys, anchors, self._d.lock_rows)
        new = self._update_fn(old, trajectory, **self._params)
        for k, e in new["edges"].items():
            o = old["edges"].get(k, EDGE_ZERO)
            delta = (e["n_total"] - o["n_total"], e["n_succ"] - o["n_succ"], e["d_sum"] - o["d_sum"])
            if any(delta):
                self._exec(_UPSERT_EDGE, (*k, *delta))
        for a, v in new["anchors"].items():
            o = old["anchors"].get(a)
            if o is None or v != o:
                dn = v["n_updates"] - (o["n_updates"] if o else 0)
                self._exec(_UPSERT_ANCHOR, (*a, v["v_bar"], dn))
        self._exec(_BUMP_GLOBAL, (new["n_succ_total"] - old["n_succ_total"],
                                  new["n_total_global"] - old["n_total_global"]))

    def update(self, trajectory: Mapping[str, Any]) -> None:
        with self.transaction():
            self.apply(trajectory)

    def lookup(self, anchors: Sequence[tuple[str, str]], fingerprints: Sequence[str]) -> dict:
        keys, anc = self._keys(anchors, fingerprints)
        return self._read(keys, anc)

    def snapshot(self) -> dict:
        s = empty_stats()
        for loc, prev, fp, nt, ns, ds in self._exec("SELECT loc, prev_fp, fp, n_total, n_succ, d_sum FROM stdb_edge"):
            s["edges"][(loc, prev, fp)] = {"n_total": int(nt), "n_succ": int(ns), "d_sum": float(ds)}
        for loc, prev, v, n in self._exec("SELECT loc, prev_fp, v_bar, n_updates FROM stdb_anchor"):
            s["anchors"][(loc, prev)] = {"v_bar": float(v), "n_updates": int(n)}
        g = self._exec(_SEL_GLOBAL).fetchone()
        s["n_succ_total"], s["n_total_global"] = int(g[0]), int(g[1])
        return s

    def restore(self, stats: Mapping[str, Any]) -> None:
        with self.transaction():
            self._exec("DELETE FROM stdb_edge")
            self._exec("DELETE FROM stdb_anchor")
            self._exec("UPDATE stdb_global SET n_succ_total = ?, n_total_global = ? WHERE id = 1",
                       (int(stats["n_succ_total"]), int(stats["n_total_global"])))
            for k, e in stats["edges"].items():
                self._exec(_UPSERT_EDGE, (*k, e["n_total"], e["n_succ"], e["d_sum"]))
            for a, v in stats["anchors"].items():
                self._exec(_UPSERT_ANCHOR, (*a, v["v_bar"], v["n_updates"]))

    def close(self) -> None:
        self._conn.close()


def sqlite_store(path: str | Path = ":memory:", *, timeout: float = 30.0, **params: Any) -> SQLSTDB:
    """The embedded default: a WAL-mode SQLite file (``isolation_level=None``: explicit transactions)."""
    conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a process crash
    conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
    return SQLSTDB(conn, SQLITE, **params)


def postgres_store(dsn: str, *, connect: Callable | None = None, **params: Any) -> SQLSTDB:
    """PostgreSQL through psycopg 3 (``pip install psycopg``): same schema, same update rule."""
    if connect is None:
        import psycopg  # an optional dependency, imported only here

        connect = psycopg.connect
    conn = connect(dsn, autocommit=True)
    return SQLSTDB(conn, POSTGRES, **params)
