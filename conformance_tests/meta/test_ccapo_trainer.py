"""Smoke test of the CCAPO reference trainer: three updates, metrics on disk, resume continues."""
from __future__ import annotations

import json

import pytest

from conformance_tests.harness import assert_that
from reference_impl.ccapo.stdb import sqlite_store
from reference_impl.ccapo.trainer import cli


@pytest.mark.meta
@pytest.mark.clause("CCAPO-PPO-1", "CCAPO-STDB-6")
def test_trainer_runs_and_resumes(tmp_path):

    out = tmp_path / "run"
    args = ["--out", str(out), "--prompts", "2", "--group-size", "4", "--checkpoint-every", "1"]
    assert cli(args + ["--updates", "2"]) == 0
    assert cli(args + ["--updates", "3", "--resume"]) == 0
    recs = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert_that([r["update"] for r in recs] == [0, 1, 2], "CCAPO-PPO-1", [r["update"] for r in recs],
                "updates 0, 1 then 2 after the resume")
    for key in ("success_rate", "mean_steps", "r_tau_mean", "stdb_hit_rate", "approx_kl", "kl_ref", "clip_fraction"):
        assert_that(all(key in r for r in recs), "CCAPO-PPO-1", recs[-1], f"metric {key!r} in every record")
    assert_that(recs[-1]["stdb_hit_rate"] > 0, "CCAPO-STDB-6", recs[-1]["stdb_hit_rate"], "> 0 once the STDB has data")
    snap = sqlite_store(out / "stdb.sqlite").snapshot()
    assert_that(snap["n_total_global"] == 3 * 2 * 4, "CCAPO-STDB-6", snap["n_total_global"],
                "one count per trajectory of the three updates (the resume does not double count)")
