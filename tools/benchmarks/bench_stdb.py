"""STDB edge updates per second (CCAPO-STDB-1..4, CCAPO-STDB-6): our stores against the floors of the
same increments written with nothing else around them.

Workload: GRPO-style batches of 64 trajectories (8 prompts x 8 rollouts, 20 steps each; rollouts of
a prompt share its rooms and objects, so edges repeat within a batch as in a real run), 20 batches
per round, folded into a fresh store each round (the store's creation is not timed). One "edge
update" is one distinct edge of one trajectory (an N_total increment). Rows:

* ``sqlite_store`` / ``postgres_store`` / ``memory_store``: ``update_many(batch)``, one transaction
  per batch, with the full rule (counts, d_goal, V-bar);
* ``sqlite_store_per_trajectory``: ``update(trajectory)``, one transaction each (the old trainer loop);
* ``raw_executemany``: the counter upserts alone, precomputed, one ``executemany`` per batch, into
  text-keyed tables (loc, prev_fp, fp): the floor of the store's schema before symbol interning;
* ``raw_int_executemany``: the same upserts with the store's own packed integer keys and tables (the
  floor of today's schema; symbols interned beforehand, not timed);
* ``dict``: the counter increments alone, precomputed, into a Python dict.

Run, interleaved as the performance page wants it (every row once per round, in a rotated order, one
process; a busy minute then slows every row alike): ``python -m tools.benchmarks.bench_stdb [--rounds 5]``.
As pytest-benchmark tests (rows one after another, PostgreSQL included when a server can be started):
``python -m pytest tools/benchmarks -k bench_stdb`` (naming the file itself collects it twice: once by
pytest, once by tools/benchmarks/conftest.py); the edge updates/s of every row and the ratios are
printed at the end.
"""
from __future__ import annotations

import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import pytest

from reference_impl.ccapo.stdb import MemorySTDB, postgres_store, sqlite_store, trajectory_edges
from conformance_tests.stdb_backends import V1_SQLITE_SCHEMA, V1_UPSERT_EDGE
from reference_impl.ccapo.stdb.sql import _UPSERT_EDGE, SQLITE_SCHEMA_SQL, _edge_id
from reference_impl.ccapo.stdb.update import gc_paused

PROMPTS, ROLLOUTS, STEPS, BATCHES = 8, 8, 20, 20
ROUNDS = 5
# thread CPU time: the stores and SQLite work in the calling thread, and a shared machine then slows
# every row alike (WAL + synchronous=NORMAL commits do not wait on the disk)
pytestmark = pytest.mark.benchmark(timer=time.thread_time, disable_gc=True)
RATES: dict[str, float] = {}  # row -> edge updates/s (median round)
LABEL = "STDB edge updates [{} batches x 64 trajectories]".format(BATCHES)


def _batches(seed: int = 0) -> list[list[dict]]:
    rng = random.Random(seed)
    out = []
    for _ in range(BATCHES):
        batch = []
        for _ in range(PROMPTS):
            rooms = [f"room{rng.randrange(40)}" for _ in range(5)]
            objs = [f"TAKE(obj{rng.randrange(300)})" for _ in range(12)] + [f"GOTO({r})" for r in rooms]
            for _ in range(ROLLOUTS):
                fps = [rng.choice(objs) for _ in range(STEPS)]
                anchors = [(rng.choice(rooms), "<START>" if t == 0 else fps[t - 1]) for t in range(STEPS)]
                batch.append({"anchors": anchors, "fingerprints": fps, "success": rng.random() < 0.4})
        out.append(batch)
    return out


def _increments(batches) -> list[list[tuple]]:
    """Per batch, one (loc, prev_fp, fp, +N_total, +N_succ, +d_sum) row per edge update."""
    rows = []
    for batch in batches:
        rb = []
        for tr in batch:
            ok, T = bool(tr["success"]), len(tr["fingerprints"])
            rb += [(*k, 1, int(ok), float(T - 1 - t) if ok else 0.0) for k, t in trajectory_edges(tr).items()]
        rows.append(rb)
    return rows


class _RateReport:
    """Prints every row's edge updates/s in the terminal summary (registered once as a plugin)."""

    def __init__(self, n: int):
        self.n = n

    def pytest_terminal_summary(self, terminalreporter):
        if RATES:
            terminalreporter.write_sep("-", f"STDB edge updates/s ({self.n} per round, median of {ROUNDS} rounds)")
            raw, raw_int = RATES.get("raw_executemany"), RATES.get("raw_int_executemany")
            for row, rate in RATES.items():
                vs = f"   {rate / raw:.2f}x raw executemany" if raw else ""
                vs += f"   {rate / raw_int:.2f}x raw int executemany" if raw_int else ""
                terminalreporter.write_line(f"{row:30s} {rate:>12,.0f}/s{vs}")


@pytest.fixture(scope="module")
def workload(request):
    batches = _batches()
    n = sum(len(trajectory_edges(tr)) for b in batches for tr in b)
    if not request.config.pluginmanager.has_plugin("bench-stdb-rates"):
        request.config.pluginmanager.register(_RateReport(n), "bench-stdb-rates")
    return batches, _increments(batches), n


def _run(benchmark, record_median, key, setup, fn, n, pair=None):
    benchmark.group = "stdb"
    benchmark.extra_info["edge_updates"] = n
    benchmark.pedantic(fn, setup=setup, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    record_median(f"stdb/{key}", benchmark, pair=pair)
    stats = getattr(benchmark, "stats", None)
    if stats is not None and getattr(stats, "stats", None) is not None:
        RATES[key] = n / stats.stats.median
        benchmark.extra_info["edge_updates_per_s"] = RATES[key]


def _store_rows(make, batches, per_trajectory=False):
    def setup():
        return (make(),), {}

    def fold(store):
        for b in batches:
            if per_trajectory:
                for tr in b:
                    store.update(tr)
            else:
                store.update_many(b)
        store.close()
    return setup, fold


def _dict_rows(rows):
    """(setup, fold) of the counter increments alone into a Python dict."""
    def setup():
        return ({},), {}

    def fold(d):
        for rb in rows:
            for loc, prev, fp, nt, ns, ds in rb:
                e = d.get((loc, prev, fp))
                if e is None:
                    d[(loc, prev, fp)] = [nt, ns, ds]
                else:
                    e[0] += nt
                    e[1] += ns
                    e[2] += ds
    return setup, fold


def test_dict(benchmark, record_median, workload):
    _, rows, n = workload
    setup, fold = _dict_rows(rows)
    _run(benchmark, record_median, "dict", setup, fold, n)


def _raw_rows(directory: Path, key: str, schema: str, upsert: str, rows):
    """(setup, fold) of precomputed upserts, one ``executemany`` per batch, into a fresh WAL file."""
    paths = iter(range(10**6))

    def setup():
        conn = sqlite3.connect(str(directory / f"{key}{next(paths)}.sqlite"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        for stmt in filter(str.strip, schema.split(";")):
            conn.execute(stmt)
        return (conn,), {}

    def fold(conn):
        for rb in rows:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(upsert, rb)
            conn.execute("COMMIT")
        conn.close()
    return setup, fold


def _packed(rows):
    """The increments with the store's packed integer keys (symbols interned beforehand, not timed)."""
    ids: dict[str, int] = {}
    for rb in rows:
        for r in rb:
            for t in r[:3]:
                ids.setdefault(t, len(ids))
    return [[(_edge_id(ids, r[:3]), *r[3:]) for r in rb] for rb in rows]


def test_raw_executemany(benchmark, record_median, workload, tmp_path):
    _, rows, n = workload
    setup, fold = _raw_rows(tmp_path, "raw_executemany", V1_SQLITE_SCHEMA, V1_UPSERT_EDGE, rows)
    _run(benchmark, record_median, "raw_executemany", setup, fold, n)


def test_raw_int_executemany(benchmark, record_median, workload, tmp_path):
    _, rows, n = workload
    setup, fold = _raw_rows(tmp_path, "raw_int_executemany", SQLITE_SCHEMA_SQL, _UPSERT_EDGE, _packed(rows))
    _run(benchmark, record_median, "raw_int_executemany", setup, fold, n)


def test_memory_store(benchmark, record_median, workload):
    batches, _, n = workload
    setup, fold = _store_rows(MemorySTDB, batches)
    _run(benchmark, record_median, "memory_store", setup, fold, n,
         pair=(f"{LABEL}: dict time / memory store time", "stdb/dict", "stdb/memory_store"))


def test_sqlite_store(benchmark, record_median, workload, tmp_path):
    batches, _, n = workload
    paths = iter(range(10**6))
    setup, fold = _store_rows(lambda: sqlite_store(tmp_path / f"s{next(paths)}.sqlite"), batches)
    _run(benchmark, record_median, "sqlite_store", setup, fold, n,
         pair=(f"{LABEL}: raw executemany time / SQLite store time", "stdb/raw_executemany", "stdb/sqlite_store"))


def test_sqlite_store_per_trajectory(benchmark, record_median, workload, tmp_path):
    batches, _, n = workload
    paths = iter(range(10**6))
    setup, fold = _store_rows(lambda: sqlite_store(tmp_path / f"t{next(paths)}.sqlite"), batches, per_trajectory=True)
    _run(benchmark, record_median, "sqlite_store_per_trajectory", setup, fold, n,
         pair=(f"{LABEL}: SQLite one transaction per trajectory / per batch", "stdb/sqlite_store_per_trajectory",
               "stdb/sqlite_store"))


def test_postgres_store(benchmark, record_median, workload, request):
    from conformance_tests.stdb_backends import postgres_server  # skips, with the reason, without a server

    server = postgres_server(request.config)
    batches, _, n = workload
    setup, fold = _store_rows(lambda: postgres_store(server.fresh_dsn()), batches)
    _run(benchmark, record_median, "postgres_store", setup, fold, n,
         pair=(f"{LABEL}: SQLite store time / PostgreSQL store time", "stdb/sqlite_store", "stdb/postgres_store"))


def contenders(batches, rows, directory: Path) -> dict:
    """Every row of the page as (setup, fold): what :func:`tools.benchmarks._common.interleave` times."""
    paths = iter(range(10**6))
    return {
        "dict": _dict_rows(rows),
        "raw_executemany": _raw_rows(directory, "raw_executemany", V1_SQLITE_SCHEMA, V1_UPSERT_EDGE, rows),
        "raw_int_executemany": _raw_rows(directory, "raw_int_executemany", SQLITE_SCHEMA_SQL, _UPSERT_EDGE,
                                         _packed(rows)),
        "memory_store": _store_rows(MemorySTDB, batches),
        "sqlite_store": _store_rows(lambda: sqlite_store(directory / f"s{next(paths)}.sqlite"), batches),
        "sqlite_store_per_trajectory": _store_rows(lambda: sqlite_store(directory / f"t{next(paths)}.sqlite"),
                                                   batches, per_trajectory=True),
    }


def main(argv=None) -> dict:
    import torch

    from tools.benchmarks import _common as C

    ap = C.parser(__doc__)
    args = ap.parse_args(argv)
    if args.device != "cpu":
        ap.error("the STDB runs on the CPU (SQLite and Python dicts): --device cpu")
    batches = _batches()
    rows, n = _increments(batches), sum(len(trajectory_edges(tr)) for b in batches for tr in b)
    with tempfile.TemporaryDirectory() as tmp, gc_paused():  # as the pytest-benchmark rows run (disable_gc)
        timed = {name: (lambda setup=setup: setup()[0], fold)
                 for name, (setup, fold) in contenders(batches, rows, Path(tmp)).items()}
        times = C.interleave(timed, args.rounds, torch.device("cpu"))
    med = {k: C.median(t) for k, t in times.items()}
    rate = {k: n / m for k, m in med.items()}
    res = {"benchmark": "stdb", "device": "cpu", "rounds": args.rounds, "edge_updates": n, "median_s": med,
           "times_s": times, "edge_updates_per_s": rate}
    path = C.write("stdb_cpu", res, args.json)
    for k, r in rate.items():
        print(f"{k:30s} {r:>12,.0f}/s   {r / rate['raw_executemany']:.2f}x raw executemany")
    print(f"wrote {path}")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
