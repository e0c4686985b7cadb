"""Smoke test of the isreshape trainer: three updates, the metrics the clauses name, then a resume."""
from __future__ import annotations

import json
import math

import pytest

from conformance_tests.harness import assert_that
from reference_impl.isreshape.trainer import cli

METRICS = ("gamma_mean", "gamma_std", "weight_mean", "weight_max", "sapo_weight_mean", "ratio_mean",
           "abs_adv_mean", "kl", "mean_reward", "loss")
SMALL = ["--contexts", "4", "--tokens", "6", "--batch-contexts", "8", "--group-size", "4", "--epochs", "2",
         "--checkpoint-every", "1"]


def _records(path):
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


@pytest.mark.meta
@pytest.mark.clause("ISR-LOSS-2", "ISR-METRIC-1", "ISR-METRIC-2", "ISR-METRIC-3")
def test_trainer_three_updates_then_resume(tmp_path):

    out = tmp_path / "run"
    assert cli(["--out", str(out), "--updates", "3", *SMALL]) == 0
    recs = _records(out / "metrics.jsonl")
    assert_that([r["update"] for r in recs] == [0, 1, 2], "ISR-METRIC-1", [r["update"] for r in recs], "updates 0, 1, 2")
    for r in recs:
        missing = [m for m in METRICS if m not in r or not math.isfinite(r[m])]
        assert_that(not missing, "ISR-METRIC-1", missing, "every metric present and finite")
        assert_that(r["gamma_mean"] >= 0.5 - 1e-12, "ISR-METRIC-1", r["gamma_mean"], ">= 0.5 with the default bounds")
    assert_that(recs[0]["grad_norm"] > 0, "ISR-LOSS-2", recs[0]["grad_norm"], "a non-zero policy gradient")
    assert_that((out / "checkpoint.pt").exists(), "ISR-METRIC-1", "no checkpoint.pt", "a checkpoint")
    assert cli(["--out", str(out), "--updates", "5", "--resume", *SMALL]) == 0
    recs = _records(out / "metrics.jsonl")
    assert_that([r["update"] for r in recs] == [0, 1, 2, 3, 4], "ISR-METRIC-1", [r["update"] for r in recs],
                "the resumed run continues at update 3")
    straight = tmp_path / "straight"
    assert cli(["--out", str(straight), "--updates", "5", *SMALL]) == 0
    same = [a["mean_reward"] == b["mean_reward"] for a, b in zip(_records(straight / "metrics.jsonl"), recs)]
    assert_that(all(same), "ISR-METRIC-1", same, "a resumed run replays the uninterrupted run exactly")
