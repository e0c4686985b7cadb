"""CCAPO §7.2/§7.3: the STDB update rule (a pure contract operation) and our STDB component.

The rule is checked through ``ccapo.stdb_update`` against an independent replay of the trajectory
stream. The meta-tests below check rlconform's own stores, each test over every backend it applies
to (in-memory, SQLite, PostgreSQL on a throwaway server: conformance_tests/stdb_backends.py): a
stream fed in batches follows the rules, many writer processes lose no counts, a writer killed
inside its transaction leaves exactly the committed updates, awkward keys round-trip; and the
batched fold the stores use equals folding ``stdb_update`` (the oracle) one trajectory at a time.
"""
from __future__ import annotations

import contextlib
import copy
import itertools
import math
import multiprocessing as mp
import os
import signal

import pytest
from hypothesis import given, settings

from hypothesis import strategies as st

from conformance_tests import strategies as st_
from conformance_tests.harness import assert_close, assert_equal, assert_rejects, assert_that
from conformance_tests.stdb_backends import shared_backend, store_backend  # noqa: F401 (fixtures)

EMPTY = {"edges": {}, "anchors": {}, "n_succ_total": 0, "n_total_global": 0}
EPS = 1e-8


def _feed(ccapo, stream):
    stats = copy.deepcopy(EMPTY)
    for tr in stream:
        stats = ccapo.stdb_update(stats, tr)
    return stats


def _edges(tr):
    return {(*a, f) for a, f in zip(tr["anchors"], tr["fingerprints"])}


def _q(ns, nt, d_sum, gs, gt):
    """Q_STDB from counts with the defaults (independent of the implementation)."""
    i = (ns + 1.0) / (nt + 2.0)
    c = (ns / (nt + EPS)) / (gs / (gt + EPS) + EPS)
    d = (d_sum / ns if ns > 0 else 0.0) + 1.0
    x = i * (1 + c) * d ** -0.5
    return x / (1 + x)


def replay(stream, eta=0.1):
    """Brute-force oracle: counts by set membership per trajectory, V-bar by an explicit EMA replay."""
    edges, anchors, gs, gt = {}, {}, 0, 0
    for tr in stream:
        T, ok = len(tr["fingerprints"]), tr["success"]
        gt += 1
        gs += int(ok)
        order = []
        for t, (a, f) in enumerate(zip(tr["anchors"], tr["fingerprints"])):
            k = (*a, f)
            if k not in order:
                order.append(k)
        for k in order:
            e = edges.setdefault(k, [0, 0, 0.0])
            e[0] += 1
            if ok:
                last = max(t for t, (a, f) in enumerate(zip(tr["anchors"], tr["fingerprints"])) if (*a, f) == k)
                e[1] += 1
                e[2] += T - 1 - last
        if ok:
            for k in order:
                q = _q(edges[k][1], edges[k][0], edges[k][2], gs, gt)
                u = k[:2]
                anchors[u] = q if u not in anchors else (1 - eta) * anchors[u] + eta * q
    return edges, anchors, gs, gt


@pytest.mark.clause("CCAPO-STDB-1")
@given(st_.ccapo_streams())
def test_n_total_counts_every_trajectory(ccapo, stream):
    got = _feed(ccapo, stream)
    edges, _, _, gt = replay(stream)
    assert_equal(got["n_total_global"], gt, "CCAPO-STDB-1", "N_total_global = number of trajectories")
    assert_equal(sorted(got["edges"]), sorted(edges), "CCAPO-STDB-1", "edges stored")
    for k, e in edges.items():
        assert_equal(got["edges"][k]["n_total"], e[0], "CCAPO-STDB-1", f"N_total{k}")


@pytest.mark.clause("CCAPO-STDB-1")
def test_failed_trajectory_still_counts(ccapo):
    tr = {"anchors": [("hall", "<START>"), ("hall", "GOTO(hall)")], "fingerprints": ["GOTO(hall)", "GOTO(hall)"],
          "success": False}
    got = ccapo.stdb_update(copy.deepcopy(EMPTY), tr)
    assert_equal(got["n_total_global"], 1, "CCAPO-STDB-1")
    assert_equal(got["edges"][("hall", "<START>", "GOTO(hall)")]["n_total"], 1, "CCAPO-STDB-1", "failure adds N_total")
    twice = {"anchors": [("hall", "<START>")] * 2, "fingerprints": ["OPEN(chest)"] * 2, "success": False}
    got2 = ccapo.stdb_update(got, twice)
    assert_equal(got2["edges"][("hall", "<START>", "OPEN(chest)")]["n_total"], 1, "CCAPO-STDB-1",
                 "an edge counts once per trajectory")


@pytest.mark.clause("CCAPO-STDB-2")
@given(st_.ccapo_streams())
def test_n_succ_counts_successes_only(ccapo, stream):
    got = _feed(ccapo, stream)
    edges, _, gs, _ = replay(stream)
    assert_equal(got["n_succ_total"], gs, "CCAPO-STDB-2", "N_succ_total = successful trajectories")
    for k, e in edges.items():
        assert_equal(got["edges"][k]["n_succ"], e[1], "CCAPO-STDB-2", f"N_succ{k}")


@pytest.mark.clause("CCAPO-STDB-2")
def test_failure_leaves_n_succ(ccapo):
    tr = {"anchors": [("hall", "<START>")], "fingerprints": ["OPEN(chest)"], "success": True}
    one = ccapo.stdb_update(copy.deepcopy(EMPTY), tr)
    two = ccapo.stdb_update(one, {**tr, "success": False})
    e = two["edges"][("hall", "<START>", "OPEN(chest)")]
    assert_equal([e["n_succ"], e["n_total"], two["n_succ_total"]], [1, 2, 1], "CCAPO-STDB-2")


@pytest.mark.clause("CCAPO-STDB-3")
@given(st_.ccapo_streams())
def test_v_bar_is_moving_average_of_successes(ccapo, stream):
    got = _feed(ccapo, stream)
    _, anchors, _, _ = replay(stream)
    assert_equal(sorted(got["anchors"]), sorted(anchors), "CCAPO-STDB-3", "anchors with a V-bar")
    for u, v in anchors.items():
        assert_close(got["anchors"][u]["v_bar"], v, "CCAPO-STDB-3", what=f"V-bar{u}")


@pytest.mark.clause("CCAPO-STDB-3")
def test_v_bar_golden(ccapo):
    # success k->GOTO(hall), hall->TAKE(key): I = 2/3, C = 1 (up to eps), d = 1 and 0
    tr = {"anchors": [("kitchen", "<START>"), ("hall", "GOTO(hall)")], "fingerprints": ["GOTO(hall)", "TAKE(key)"],
          "success": True}
    one = ccapo.stdb_update(copy.deepcopy(EMPTY), tr)
    c1 = (1 / (1 + EPS)) / (1 / (1 + EPS) + EPS)
    x0, x1 = (2 / 3) * (1 + c1) / math.sqrt(2), (2 / 3) * (1 + c1)
    q0, q1 = x0 / (1 + x0), x1 / (1 + x1)
    assert_close(one["anchors"][("kitchen", "<START>")]["v_bar"], q0, "CCAPO-STDB-3", what="first V-bar = Q")
    assert_close(one["anchors"][("hall", "GOTO(hall)")]["v_bar"], q1, "CCAPO-STDB-3", what="first V-bar = Q (4/7)")
    failed = ccapo.stdb_update(one, {**tr, "success": False})
    assert_equal(failed["anchors"], one["anchors"], "CCAPO-STDB-3", "a failure leaves V-bar unchanged")
    # second success: counts (2 succ of 3), global 2 of 3 -> C = 1; V-bar = 0.9 V + 0.1 Q
    two = ccapo.stdb_update(failed, tr)
    c2 = (2 / (3 + EPS)) / (2 / (3 + EPS) + EPS)
    x1b = (3 / 5) * (1 + c2)
    assert_close(two["anchors"][("hall", "GOTO(hall)")]["v_bar"], 0.9 * q1 + 0.1 * x1b / (1 + x1b), "CCAPO-STDB-3")


@pytest.mark.clause("CCAPO-STDB-4")
@given(st_.ccapo_streams())
def test_d_goal_from_successes(ccapo, stream):
    got = _feed(ccapo, stream)
    edges, _, _, _ = replay(stream)
    for k, e in edges.items():
        assert_equal(got["edges"][k]["d_sum"], e[2], "CCAPO-STDB-4", f"d_sum{k}")


@pytest.mark.clause("CCAPO-STDB-4")
def test_d_goal_golden(ccapo):
    # actions A B A C at one anchor (success, T = 4): A's last visit is t = 2 -> d = 1; B -> 2; C -> 0
    tr = {"anchors": [("r", "x")] * 4, "fingerprints": ["A", "B", "A", "C"], "success": True}
    got = ccapo.stdb_update(copy.deepcopy(EMPTY), tr)
    assert_equal({k[2]: v["d_sum"] for k, v in got["edges"].items()}, {"A": 1.0, "B": 2.0, "C": 0.0}, "CCAPO-STDB-4")


@pytest.mark.clause("CCAPO-STDB-1", "CCAPO-STDB-2", "CCAPO-STDB-3")
def test_update_does_not_modify_its_input(ccapo):
    tr = {"anchors": [("hall", "<START>")], "fingerprints": ["OPEN(chest)"], "success": True}
    one = ccapo.stdb_update(copy.deepcopy(EMPTY), tr)
    before = copy.deepcopy(one)
    ccapo.stdb_update(one, tr)
    assert_that(one == before, "CCAPO-STDB-1", one, "the input state unchanged (stdb_update returns a new one)")


# ============================================================================ meta: our STDB store
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
    from reference_impl.ccapo.stdb import empty_stats, stdb_update

    stats = empty_stats()
    for tr in trajs:
        stats = stdb_update(stats, tr, **params)
    return stats


@pytest.mark.meta
@pytest.mark.clause("CCAPO-STDB-6")
def test_concurrent_writers_lose_no_counts(shared_backend):
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
def test_killed_writer_leaves_committed_counts(shared_backend):
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
def test_store_follows_the_rules(store_backend, stream, sizes):
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
    from reference_impl.ccapo.stdb import MemorySTDB, empty_stats, stdb_fold, stdb_update

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
def test_batch_is_all_or_nothing(store_backend, bad):
    with contextlib.closing(store_backend.open(store_backend.new())) as store:
        store.update_many([_traj(0), _traj(1)])
        before = store.snapshot()
        assert_rejects("CCAPO-INPUT-3", store.update_many, [_traj(2), _traj(3), bad])
        assert_that(store.snapshot() == before, "CCAPO-STDB-6", store.snapshot(), "a rejected batch writes nothing")


_NASTY = ["O'Brien \"quoted\"", "C:\\path\\to\\ \\' \\\\", "%s %(x)s ? :1 $1", "打开(冰箱) 去(厨房)", "🙂 ü é",
          "", " ", "line\nbreak\ttab", "; DROP TABLE stdb_edge; --", "长" * 200 + "x" * 200]


@pytest.mark.meta
@pytest.mark.clause("CCAPO-STDB-6")
def test_nasty_keys_round_trip(store_backend):
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
def test_unstorable_key_round_trips_or_is_rejected_cleanly(store_backend, key):
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
def test_restore_round_trip(store_backend):
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

    from reference_impl.ccapo.stdb import POSTGRES, SCHEMA_SQL, sqlite_store

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
def test_two_writers_intern_each_symbol_once(shared_backend):
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
def test_concurrent_writers_intern_new_symbols_once(shared_backend):
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
def test_symbol_id_overflow_is_rejected_cleanly(shared_backend):
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

    from conformance_tests.stdb_backends import V1_SQLITE_SCHEMA
    from reference_impl.ccapo.stdb import sqlite_store

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


@pytest.mark.clause("CCAPO-INPUT-3")
def test_anchor_fingerprint_length_mismatch_rejected(ccapo):
    tr = {"anchors": [("hall", "<START>")], "fingerprints": ["OPEN(chest)", "TAKE(key)"], "success": True}
    assert_rejects("CCAPO-INPUT-3", ccapo.raw("stdb_update"), copy.deepcopy(EMPTY), tr)
    assert_rejects("CCAPO-INPUT-3", ccapo.raw("score_steps"), copy.deepcopy(EMPTY), tr["anchors"], tr["fingerprints"])


@pytest.mark.clause("CCAPO-INPUT-5")
@pytest.mark.parametrize("v_rate", [0.0, 1.5, -0.1])
def test_bad_moving_average_rate_rejected(ccapo, v_rate):
    tr = {"anchors": [("hall", "<START>")], "fingerprints": ["OPEN(chest)"], "success": True}
    assert_rejects("CCAPO-INPUT-5", ccapo.raw("stdb_update"), copy.deepcopy(EMPTY), tr, v_rate=v_rate)
