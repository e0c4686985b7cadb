"""The SQLite store's writer cache (rows kept in memory between batches, dropped when another
connection commits, seen through SQLite's data_version) never changes a result.

Oracle: the in-memory store folded over the same batches in the same order (its rule is held to a
brute-force replay in test_ccapo_stdb.py). Two store objects on one file interleave their batches,
so each must notice the other's commits; a restore and a rolled-back batch sit in between.
"""
from __future__ import annotations

import random

import pytest

from conformance_tests.harness import assert_close, assert_equal
from reference_impl.ccapo.stdb import MemorySTDB, sqlite_store

pytestmark = pytest.mark.meta


def _traj(rng: random.Random) -> dict:
    rooms = [f"r{rng.randrange(4)}" for _ in range(3)]
    fps = [f"TAKE(o{rng.randrange(6)})" for _ in range(rng.randrange(1, 7))]
    return {"anchors": [(rng.choice(rooms), "<START>" if t == 0 else fps[t - 1]) for t in range(len(fps))],
            "fingerprints": fps, "success": rng.random() < 0.5}


def _assert_same(snap: dict, want: dict, what: str) -> None:
    assert_equal([snap["n_total_global"], snap["n_succ_total"]], [want["n_total_global"], want["n_succ_total"]],
                 "CCAPO-STDB-6", f"{what}: global counts")
    assert_equal(snap["edges"], want["edges"], "CCAPO-STDB-6", f"{what}: edges")
    assert_equal(sorted(snap["anchors"]), sorted(want["anchors"]), "CCAPO-STDB-6", f"{what}: anchors")
    for u, a in want["anchors"].items():
        assert_close(snap["anchors"][u]["v_bar"], a["v_bar"], "CCAPO-STDB-3", what=f"{what}: V-bar {u}")


@pytest.mark.clause("CCAPO-STDB-6", "CCAPO-STDB-3")
@pytest.mark.parametrize("seed", range(3))
def test_two_cached_writers_on_one_file_match_the_memory_store(tmp_path, seed):
    rng = random.Random(seed)
    path = tmp_path / "s.sqlite"
    a, b, oracle = sqlite_store(path), sqlite_store(path), MemorySTDB()
    for step in range(12):
        batch = [_traj(rng) for _ in range(rng.randrange(1, 5))]
        writer = (a, b)[rng.randrange(2)]
        writer.update_many(batch)
        oracle.update_many(batch)
        if step == 5:  # a rolled-back batch leaves neither the file nor a writer's cache changed
            with pytest.raises(RuntimeError), writer.transaction():
                writer.apply_many([_traj(rng)])
                raise RuntimeError("abort")
        if step == 8:  # one writer restores an earlier state: the other must not trust its cache
            snap = oracle.snapshot()
            b.restore(snap)
        _assert_same(a.snapshot(), oracle.snapshot(), f"step {step}")
    a.close()
    b.close()
