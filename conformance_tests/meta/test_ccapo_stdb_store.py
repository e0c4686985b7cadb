"""rlconform's own STDB stores (reference_impl.ccapo.stdb), over every backend each test applies to.

In-memory, SQLite, and PostgreSQL on a throwaway server (conformance_tests/stdb_backends.py): a stream
fed in batches follows the rules, many writer processes lose no counts, a writer killed inside its
transaction leaves exactly the committed updates, awkward keys round-trip, symbols are interned once, an
old text-keyed store file is migrated; and the batched fold the stores use equals folding ``stdb_update``
(the oracle) one trajectory at a time. The counts are checked against the brute-force replay of
test_ccapo_stdb.py, the clause tests of the update rule.
"""
from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import os
import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_close,
    assert_equal,
    assert_rejects,
    assert_that,
)
from conformance_tests.stdb_backends import (  # noqa: F401 (fixtures)
    V1_SQLITE_SCHEMA,
    shared_backend,
    store_backend,
)
from conformance_tests.test_ccapo_stdb import replay
from reference_impl.ccapo.stdb import (
    POSTGRES,
    SCHEMA_SQL,
    MemorySTDB,
    empty_stats,
    sqlite_store,
    stdb_fold,
    stdb_update,
)


def _edges(tr):
    return {(*a, f) for a, f in zip(tr["anchors"], tr["fingerprints"])}


def _traj(i: int) -> dict:
    """A deterministic trajectory: success on even i, 2-4 steps over a small vocabulary."""
    fps = [f"A{(i + k) % 3}" for k in range(2 + i % 3)]
    anchors = [("room", "<START>" if t == 0 else fps[t - 1]) for t in range(len(fps))]
    return {"anchors": anchors, "fingerprints": fps, "success": i % 2 == 0}


def _batches(trajs: list, sizes=(1, 3, 2)) -> list[list]:
    """Consecutive batches of cycling sizes (single updates and multi-trajectory transactions)."""
    out, i = [], 0
    for size in itertools.cycle(sizes):
        if i >= len(trajs):
            return out
        out.append(trajs[i:i + size])
        i += size


def _writer(backend, loc, start, n):
    store = backend.open(loc)
    for batch in _batches([_traj(i) for i in range(start, start + n)]):
        store.update_many(batch)
    store.close()


def _killed_writer(backend, loc, n, ready):
    store = backend.open(loc)
    for batch in _batches([_traj(i) for i in range(n)]):
        store.update_many(batch)
    with store.transaction():  # a batch of three, never committed
        store.apply_many([_traj(n), _traj(n + 1), _traj(n + 2)])
        ready.set()
        signal.pause()


def _assert_matches_replay(snap, trajs, what=""):
    """Counts exactly as the brute-force replay; V-bar within tolerance (CCAPO-STDB-1..4, -6)."""
    edges, anchors, gs, gt = replay(trajs)
    assert_equal([snap["n_total_global"], snap["n_succ_total"]], [gt, gs], "CCAPO-STDB-6", f"{what} global counts")
    assert_equal({k: (e["n_total"], e["n_succ"], e["d_sum"]) for k, e in snap["edges"].items()},
                 {k: tuple(e) for k, e in edges.items()}, "CCAPO-STDB-6", f"{what} edge counts")
    assert_equal(sorted(snap["anchors"]), sorted(anchors), "CCAPO-STDB-6", f"{what} anchors")
    return anchors


def _fold_oracle(trajs, **params):
    """The pure rule folded one trajectory at a time: the oracle for every batched path."""

    stats = empty_stats()
    for tr in trajs:
        stats = stdb_update(stats, tr, **params)
    return stats


@pytest.mark.meta
@pytest.mark.clause("CCAPO-STDB-6")
def test_concurrent_writers_lose_no_counts(shared_backend):  # noqa: F811 (the imported fixture)
    loc = shared_backend.new()
    shared_backend.open(loc).close()  # create the schema once
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(shared_backend, loc, 1000 * w, 50)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert_equal(p.exitcode, 0, "CCAPO-STDB-6", f"writer exit code ({shared_backend.name})")
    with contextlib.closing(shared_backend.open(loc)) as store:
        # counts are order-independent: exactly the sum over the 200 trajectories, whatever the interleaving
        _assert_matches_replay(store.snapshot(), [_traj(1000 * w + i) for w in range(4) for i in range(50)],
                               shared_backend.name)


@pytest.mark.meta
@pytest.mark.clause("CCAPO-STDB-6")
def test_killed_writer_leaves_committed_counts(shared_backend):  # noqa: F811 (the imported fixture)
    loc = shared_backend.new()
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=_killed_writer, args=(shared_backend, loc, 7, ready))
    p.start()
    assert ready.wait(60), "the writer never reached its open transaction"
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    committed = [_traj(i) for i in range(7)]
    with contextlib.closing(shared_backend.open(loc)) as store:
        _assert_matches_replay(store.snapshot(), committed, f"{shared_backend.name} after SIGKILL:")
        store.update_many([_traj(7), _traj(8)])  # writable again: the dead writer's lock is gone
        _assert_matches_replay(store.snapshot(), committed + [_traj(7), _traj(8)], "after the crash")


@pytest.mark.meta
@pytest.mark.clause("CCAPO-STDB-1", "CCAPO-STDB-2", "CCAPO-STDB-3", "CCAPO-STDB-4", "CCAPO-STDB-6")
@settings(max_examples=15)
@given(stream=st_.ccapo_streams(max_size=12), sizes=st.lists(st.integers(1, 5), min_size=1, max_size=3))
def test_store_follows_the_rules(store_backend, stream, sizes):  # noqa: F811 (the imported fixture)
    """A stream fed in batches of any sizes ends in the replay's state, on every backend."""
    with contextlib.closing(store_backend.open(store_backend.new())) as store:
        for batch in _batches(stream, sizes):
            store.update_many(batch)
        snap = store.snapshot()
        anchors = _assert_matches_replay(snap, stream, store_backend.name)
        for u, v in anchors.items():
            assert_close(snap["anchors"][u]["v_bar"], v, "CCAPO-STDB-3", what=f"V-bar{u}")
        probe = stream[-1]
        got = store.lookup(probe["anchors"], probe["fingerprints"])
        keys = _edges(probe)
        want = {"edges": {k: snap["edges"][k] for k in keys}, "anchors": {a: snap["anchors"][a] for a in map(tuple,
                probe["anchors"]) if a in snap["anchors"]}, "n_succ_total": snap["n_succ_total"],
                "n_total_global": snap["n_total_global"]}
        assert_that(got == want, "CCAPO-STDB-6", (got, want), "lookup is the snapshot's slice")


@pytest.mark.meta
@pytest.mark.clause("CCAPO-STDB-1", "CCAPO-STDB-2", "CCAPO-STDB-3", "CCAPO-STDB-4")
@settings(max_examples=40)
@given(stream=st_.ccapo_streams(max_size=16), sizes=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       v_rate=st.sampled_from([0.1, 0.5, 1.0]), alpha_smooth=st.sampled_from([1.0, 0.5]),
       distance_exponent=st.sampled_from([0.5, 0.0, 2.0]), lam=st.sampled_from([1.0, 0.0, 3.0]))
def test_batched_fold_equals_stdb_update(stream, sizes, v_rate, alpha_smooth, distance_exponent, lam):
    """Differential: the stores' fast batched fold (and its path for any other rule) against
    ``stdb_update`` folded one trajectory at a time: counts exact, V-bar within tolerance."""

    params = {"v_rate": v_rate, "alpha_smooth": alpha_smooth, "distance_exponent": distance_exponent, "lam": lam}
    want = _fold_oracle(stream, **params)
    fast, via_rule = empty_stats(), MemorySTDB(update_fn=lambda s, t, **kw: stdb_update(s, t, **kw), **params)
    for batch in _batches(stream, sizes):
        touched = stdb_fold(fast, batch, **params)
        fast = {"edges": {**fast["edges"], **touched["edges"]}, "anchors": {**fast["anchors"], **touched["anchors"]},
                "n_succ_total": touched["n_succ_total"], "n_total_global": touched["n_total_global"]}
        via_rule.update_many(batch)
    for got, what in ((fast, "stdb_fold"), (via_rule.snapshot(), "the rule folded by the store")):
        assert_equal({k: got[k] for k in ("edges", "n_succ_total", "n_total_global")},
                     {k: want[k] for k in ("edges", "n_succ_total", "n_total_global")}, "CCAPO-STDB-1", what)
        assert_equal({u: a["n_updates"] for u, a in got["anchors"].items()},
                     {u: a["n_updates"] for u, a in want["anchors"].items()}, "CCAPO-STDB-3", what)
        for u, a in want["anchors"].items():
            assert_close(got["anchors"][u]["v_bar"], a["v_bar"], "CCAPO-STDB-3", what=f"{what} V-bar{u}")


@pytest.mark.meta
@pytest.mark.clause("CCAPO-STDB-6", "CCAPO-INPUT-3")
@pytest.mark.parametrize("bad", [
    {"anchors": [("room", "<START>")], "fingerprints": ["A0", "A1"], "success": True},  # lengths differ
    {"anchors": [("room", "<START>", "extra")], "fingerprints": ["A0"], "success": True},  # not a pair
    {"anchors": ["room"], "fingerprints": ["A0"], "success": False},  # not a pair
], ids=["length", "triple", "bare"])
def test_batch_is_all_or_nothing(store_backend, bad):  # noqa: F811 (the imported fixture)
    with contextlib.closing(store_backend.open(store_backend.new())) as store:
        store.update_many([_traj(0), _traj(1)])
        before = store.snapshot()
        assert_rejects("CCAPO-INPUT-3", store.update_many, [_traj(2), _traj(3), bad])
        assert_that(store.snapshot() == before, "CCAPO-STDB-6", store.snapshot(), "a rejected batch writes nothing")


_NASTY = ["O'Brien \"quoted\"", "C:\\path\\to\\ \\' \\\\", "%s %(x)s ? :1 $1", "打开(冰箱) 去(厨房)", "🙂 ü é",
          "", " ", "line\nbreak\ttab", "; DROP TABLE stdb_edge; --", "长" * 200 + "x" * 200]


@pytest.mark.meta
@pytest.mark.clause("CCAPO-STDB-6")
def test_nasty_keys_round_trip(store_backend):  # noqa: F811 (the imported fixture)
    with contextlib.closing(store_backend.open(store_backend.new())) as store:
        trajs = [{"anchors": [(loc, "<START>"), (loc, a)], "fingerprints": [a, b], "success": n % 2 == 0}
                 for n, (loc, a, b) in enumerate(zip(_NASTY, _NASTY[3:] + _NASTY[:3], _NASTY[7:] + _NASTY[:7]))]
        store.update_many(trajs)
        snap = store.snapshot()
        anchors = _assert_matches_replay(snap, trajs, f"{store_backend.name} nasty keys:")
        for u, v in anchors.items():
            assert_close(snap["anchors"][u]["v_bar"], v, "CCAPO-STDB-3", what=f"V-bar{u!r}")
        probe = trajs[3]
        got = store.lookup(probe["anchors"], probe["fingerprints"])
        assert_equal(sorted(got["edges"]), sorted(_edges(probe)), "CCAPO-STDB-6", "lookup by nasty keys")


@pytest.mark.meta
@pytest.mark.clause("CCAPO-STDB-6")
@pytest.mark.parametrize("key", ["nul\x00inside", "\x00", "oversized " + "长x" * 5000], ids=["nul", "only-nul", "oversized"])
def test_unstorable_key_round_trips_or_is_rejected_cleanly(store_backend, key):  # noqa: F811 (the imported fixture)
    """A NUL character (PostgreSQL text cannot hold one) or a key of kilobytes (beyond the about 2.7 kB
    PostgreSQL allows an index entry) either round-trips exactly or raises, leaving the store as it
    was and writable."""
    with contextlib.closing(store_backend.open(store_backend.new())) as store:
        store.update(_traj(0))
        before = store.snapshot()
        tr = {"anchors": [("room", key)], "fingerprints": [key], "success": True}
        try:
            store.update(tr)
        except Exception:  # noqa: BLE001 - which error is the backend's; that it is clean is checked below
            assert_that(store.snapshot() == before, "CCAPO-STDB-6", store.snapshot(), "a rejected key writes nothing")
            trajs = [_traj(0), _traj(1)]
        else:
            trajs = [_traj(0), tr, _traj(1)]
            assert_that(("room", key, key) in store.snapshot()["edges"], "CCAPO-STDB-6", key, "the key round-trips")
        store.update(_traj(1))
        _assert_matches_replay(store.snapshot(), trajs, f"{store_backend.name} after {key[:10]!r}:")


@pytest.mark.meta
@pytest.mark.clause("CCAPO-STDB-6")
def test_restore_round_trip(store_backend):  # noqa: F811 (the imported fixture)
    with contextlib.closing(store_backend.open(store_backend.new())) as store:
        store.update_many([_traj(i) for i in range(6)])
        snap = store.snapshot()
        store.update(_traj(6))
        store.restore(snap)
        back = store.snapshot()
        assert_that(back == snap, "CCAPO-STDB-6", back, "the restored snapshot")
        store.update(_traj(6))
        _assert_matches_replay(store.snapshot(), [_traj(i) for i in range(7)], "updates after a restore")


@pytest.mark.meta
@pytest.mark.clause("CCAPO-STDB-6")
def test_schema_is_portable_and_sqlite_uses_wal(tmp_path):
    import re

    sqlite_only = r"AUTOINCREMENT|INSERT OR|PRAGMA|WITHOUT ROWID|\bBLOB\b|\bREAL\b|STRICT|\?"
    assert_that(not re.search(sqlite_only, SCHEMA_SQL, re.I), "CCAPO-STDB-6", SCHEMA_SQL, "no SQLite-only syntax")
    assert_equal(POSTGRES.sql("SELECT a FROM t WHERE b = ? AND c = ?"), "SELECT a FROM t WHERE b = %s AND c = %s",
                 "CCAPO-STDB-6", "psycopg placeholders")
    store = sqlite_store(tmp_path / "w.sqlite")
    mode = store._conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert_equal(mode, "wal", "CCAPO-STDB-6", "journal mode")
    store.close()


def _worded(w: str, i: int) -> dict:
    """_traj(i) with fingerprints of writer ``w``'s own (texts no other writer brings)."""
    tr = _traj(i)
    return {**tr, "fingerprints": [f"{w}{i % 4}{k}" for k in range(len(tr["fingerprints"]))]}


def _worded_writer(backend, loc, w, n):
    with contextlib.closing(backend.open(loc)) as store:
        for i in range(n):
            store.update_many([_worded(w, i), _traj(i)])


def _symbol_rows(store) -> list[tuple[int, str]]:
    return sorted(tuple(r) for r in store._exec("SELECT id, text FROM stdb_symbol"))


def _texts(trajs) -> set[str]:
    return {t for tr in trajs for a, f in zip(tr["anchors"], tr["fingerprints"]) for t in (*a, f)}


@pytest.mark.meta
@pytest.mark.clause("CCAPO-STDB-6")
def test_two_writers_intern_each_symbol_once(shared_backend):  # noqa: F811 (the imported fixture)
    """Two writers on one store, each adding texts the other has not seen (and some it has): every
    text gets exactly one id, and both read back the other's edges by text."""
    loc = shared_backend.new()
    a, b = shared_backend.open(loc), shared_backend.open(loc)
    trajs = []
    for i in range(8):  # alternate writers; each batch brings new texts and repeats earlier ones
        w = "AB"[i % 2]
        batch = [_worded(w, i), _traj(i), _worded(w, i + 1)]
        (a, b)[i % 2].update_many(batch)
        trajs += batch
    for store in (a, b):
        _assert_matches_replay(store.snapshot(), trajs, f"{shared_backend.name} two interning writers:")
    rows = _symbol_rows(a)
    assert_equal(sorted(t for _, t in rows), sorted(_texts(trajs)), "CCAPO-STDB-6", "one symbol row per distinct text")
    assert_equal(len({i for i, _ in rows}), len(rows), "CCAPO-STDB-6", "distinct ids")
    a.close()
    b.close()


@pytest.mark.meta
@pytest.mark.clause("CCAPO-STDB-6")
def test_concurrent_writers_intern_new_symbols_once(shared_backend):  # noqa: F811 (the imported fixture)
    """Writer processes racing, each bringing texts of its own and shared ones: no lost counts, one
    id per text (each writer reads the ids others assigned before assigning its own)."""
    loc = shared_backend.new()
    shared_backend.open(loc).close()  # create the schema once
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_worded_writer, args=(shared_backend, loc, w, 12)) for w in "WXYZ"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert_equal(p.exitcode, 0, "CCAPO-STDB-6", f"writer exit code ({shared_backend.name})")
    trajs = [tr for w in "WXYZ" for i in range(12) for tr in (_worded(w, i), _traj(i))]
    with contextlib.closing(shared_backend.open(loc)) as store:
        _assert_matches_replay(store.snapshot(), trajs, f"{shared_backend.name} racing interning writers:")
        rows = _symbol_rows(store)
        assert_equal(sorted(t for _, t in rows), sorted(_texts(trajs)), "CCAPO-STDB-6", "one symbol row per text")


@pytest.mark.meta
@pytest.mark.clause("CCAPO-STDB-6")
def test_symbol_id_overflow_is_rejected_cleanly(shared_backend):  # noqa: F811 (the imported fixture)
    """Symbol ids are 21-bit (three pack into one signed 64-bit key): the last id, 2**21 - 1, is
    usable and round-trips; a batch that needs one more is rejected naming the clause, writing nothing."""
    last = 2 ** 21 - 1
    with contextlib.closing(shared_backend.open(shared_backend.new())) as store:
        store.update(_traj(0))
        with store.transaction():  # as if the store already held 2**21 - 2 symbols
            store._exec("INSERT INTO stdb_symbol (id, text) VALUES (?, ?)", (last - 1, "filler"))
        edge = {"anchors": [("room", "filler")], "fingerprints": ["the-last-id"], "success": True}
        store.update(edge)  # one new text: it takes the last id
        assert_equal(max(i for i, _ in _symbol_rows(store)), last, "CCAPO-STDB-6", "the last id is used")
        _assert_matches_replay(store.snapshot(), [_traj(0), edge], "the highest packed key round-trips:")
        before = store.snapshot()
        over = {"anchors": [("room", "<START>")], "fingerprints": ["one-too-many"], "success": True}
        err = assert_rejects("CCAPO-STDB-6", store.update_many, [_traj(1), over])
        assert_that("CCAPO-STDB-6" in str(err) and "2097151" in str(err), "CCAPO-STDB-6", str(err),
                    "an error naming the clause and the id limit")
        assert_that(store.snapshot() == before, "CCAPO-STDB-6", store.snapshot(), "the rejected batch wrote nothing")
        store.update_many([_traj(3), edge])  # known texts only: still writable
        _assert_matches_replay(store.snapshot(), [_traj(0), edge, _traj(3), edge], "after the rejected batch:")


@pytest.mark.meta
@pytest.mark.clause("CCAPO-STDB-6")
def test_text_keyed_store_file_is_migrated_on_open(tmp_path):
    """A store file written before symbol interning (text key columns) opens with the same statistics
    and keeps folding: a trainer resuming an old run continues where it stopped."""
    import sqlite3

    before = [_traj(i) for i in range(9)] + [{"anchors": [(k, k)], "fingerprints": [k], "success": True}
                                               for k in _NASTY[:5]]
    state = _fold_oracle(before)
    path = tmp_path / "v1.sqlite"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.executescript(V1_SQLITE_SCHEMA)
        conn.executemany("INSERT INTO stdb_edge VALUES (?, ?, ?, ?, ?, ?)",
                         [(*k, e["n_total"], e["n_succ"], e["d_sum"]) for k, e in state["edges"].items()])
        conn.executemany("INSERT INTO stdb_anchor VALUES (?, ?, ?, ?)",
                         [(*u, a["v_bar"], a["n_updates"]) for u, a in state["anchors"].items()])
        conn.execute("UPDATE stdb_global SET n_succ_total = ?, n_total_global = ?",
                     (state["n_succ_total"], state["n_total_global"]))
    with contextlib.closing(sqlite_store(path)) as store:
        assert_that(store.snapshot() == state, "CCAPO-STDB-6", store.snapshot(), "the old file's statistics")
        store.update_many([_traj(9), _traj(10)])
    with contextlib.closing(sqlite_store(path)) as store:  # reopened: already migrated
        cols = [c[0] for c in store._exec("SELECT * FROM stdb_edge WHERE 1 = 0").description]
        assert_equal(cols, ["id", "n_total", "n_succ", "d_sum"], "CCAPO-STDB-6", "the interned schema")
        _assert_matches_replay(store.snapshot(), before + [_traj(9), _traj(10)], "migrated, then folded:")


@pytest.mark.meta
def test_the_empty_store_counts_a_first_success_from_zero():
    """empty_stats() is the store the trainers start from: one successful trajectory of two steps gives global
    counts of one, each edge one success, and each anchor its first V-bar after one update."""
    from reference_impl.ccapo.stdb.update import empty_stats, stdb_update

    tr = {"anchors": [("hall", "<START>"), ("hall", "OPEN(chest)")], "fingerprints": ["OPEN(chest)", "TAKE(key)"],
          "success": True}
    got = stdb_update(empty_stats(), tr)
    assert (got["n_total_global"], got["n_succ_total"]) == (1, 1)
    assert set(got["edges"]) == {("hall", "<START>", "OPEN(chest)"), ("hall", "OPEN(chest)", "TAKE(key)")}
    assert all((e["n_total"], e["n_succ"]) == (1, 1) for e in got["edges"].values())
    updates = {u: a["n_updates"] for u, a in got["anchors"].items()}
    assert updates == {("hall", "<START>"): 1, ("hall", "OPEN(chest)"): 1}


@pytest.mark.meta
@pytest.mark.parametrize("enabled", [True, False])
def test_a_paused_collector_is_left_as_it_was_found(enabled):
    """The fold pauses the cyclic collector and re-enables only what it disabled: a trainer's collector is on
    again afterwards, and one its owner had switched off stays off."""
    import gc

    from reference_impl.ccapo.stdb.update import gc_paused

    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.meta
@pytest.mark.parametrize("param", [{"v_rate": 1.5}, {"alpha_smooth": float("inf")},
                                   {"distance_exponent": float("inf")}, {"lam": float("inf")}],
                         ids=["v_rate", "alpha_smooth", "distance_exponent", "lam"])
def test_the_batch_fold_refuses_a_setting_out_of_range_by_name(param):
    """The stores' batch fold checks the scoring ranges once per batch, as stdb_update and the scoring do."""
    from reference_impl.ccapo.stdb.update import empty_stats, stdb_fold

    tr = {"anchors": [("hall", "<START>")], "fingerprints": ["OPEN(chest)"], "success": True}
    with pytest.raises(ValueError, match=rf"^\[CCAPO-INPUT-5\] {next(iter(param))}="):
        stdb_fold(empty_stats(), [tr], **param)


@pytest.mark.meta
def test_the_stores_fold_the_reference_rule_inlined_and_any_other_rule_as_it_is():
    from reference_impl.ccapo.stdb.update import batch_fold, fold_rows, stdb_update

    def other(stats, trajectory, **params):
        return stdb_update(stats, trajectory, **params)

    assert batch_fold(stdb_update) is fold_rows
    assert batch_fold(other) is not fold_rows
