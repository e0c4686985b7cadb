"""Meta-tests of the results studies (tools/experiments): windowed scores, paired intervals, claims, the command."""
from __future__ import annotations

import json
import math

import pytest
from rlconform import cli

from tools.experiments import analysis as an
from tools.experiments import isreshape_lm as study
from tools.experiments.grid import Job, run_grid, updates_done
from tools.experiments.study import main as study_main

pytestmark = pytest.mark.meta


def _recs(n, key="reward", every=1, value=lambda u: float(u)):
    return [{"update": u, **({key: value(u)} if (u + 1) % every == 0 else {})} for u in range(n)]


def test_the_window_is_the_last_fifth_of_the_updates_not_of_the_records():
    assert an.windowed(_recs(100), "reward") == 89.5  # updates 80..99
    assert an.windowed(_recs(100, "acc", every=5), "acc") == 91.5  # evaluations after updates 85, 90, 95, 100
    assert math.isnan(an.windowed(_recs(100, value=lambda u: math.nan if u == 95 else u), "reward"))  # shown, not dropped
    assert math.isnan(an.windowed(_recs(10), "missing"))


def test_a_spike_is_reported_with_its_update():
    assert an.peak(_recs(50, value=lambda u: 9.0 if u == 31 else 0.1), "reward") == (9.0, 31)


def test_claims_follow_the_paired_interval():
    ahead = {p: {s: 0.05 + 0.01 * s for s in range(5)} for p in range(3)}
    m, lo, hi = an.paired_bootstrap(ahead, reps=2000)
    assert 0 < lo <= m <= hi and an.claim("v4", "ppo", "accuracy", m, lo, hi).startswith("`v4` beats `ppo`")
    mixed = {p: {s: (-1) ** s * 0.05 for s in range(5)} for p in range(3)}
    m, lo, hi = an.paired_bootstrap(mixed, reps=2000)
    assert lo < 0 < hi and an.claim("v4", "ppo", "accuracy", m, lo, hi).startswith("this study cannot tell")
    behind = {p: {s: -0.1 for s in range(5)} for p in range(3)}
    assert "is worse than" in an.claim("v4", "ppo", "accuracy", *an.paired_bootstrap(behind, reps=200))


def test_the_interval_counts_the_spread_between_initial_models():
    # every seed agrees within a model, the models disagree: a bootstrap over seeds alone would be too narrow
    diffs = {0: {s: 0.10 for s in range(5)}, 1: {s: -0.02 for s in range(5)}, 2: {s: 0.01 for s in range(5)}}
    _, lo, hi = an.paired_bootstrap(diffs, reps=4000)
    assert lo < 0 < hi


def test_the_grid_skips_finished_runs_and_records_failures(tmp_path):
    done = tmp_path / "done"
    done.mkdir()
    (done / "metrics.jsonl").write_text("".join(json.dumps({"update": u}) + "\n" for u in range(3)))
    assert updates_done(done) == 3 and updates_done(tmp_path / "never") == 0
    jobs = [Job(("done",), "no-such-trainer", (), done, 3), Job(("bad",), "no-such-trainer", (), tmp_path / "bad", 3)]
    lines = []
    recs = run_grid(jobs, tmp_path, parallel=2, echo=lines.append)
    assert [r["key"] for r in recs] == [["bad"]] and recs[0]["rc"] != 0  # an unknown trainer fails, loudly
    assert lines[0].startswith("1 of 2 runs already done") and "FAILED" in lines[-1]
    assert json.loads((tmp_path / "timings.jsonl").read_text())["key"] == ["bad"]


def test_a_bad_lr_file_stops_the_study_before_any_run(tmp_path, capsys):

    (tmp_path / "lr.json").write_text(json.dumps({"v4": 1e-4}))
    argv = ["study", "isreshape-lm", "--out", str(tmp_path / "s"), "--arms", "v4,ppo", "--lr-from"]
    assert study_main([*argv, str(tmp_path / "lr.json")]) == 2
    assert "no positive learning rate for arm 'ppo'" in capsys.readouterr().err
    assert study_main([*argv, str(tmp_path / "missing.json")]) == 2
    assert not (tmp_path / "s").exists()  # nothing started


def test_the_study_names_its_own_command_and_the_engine_has_none(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(study, "run", lambda out, **kw: None)  # no training
    monkeypatch.setattr(study, "publish", lambda out, dest, **kw: "published")
    out = tmp_path / "s"
    assert study_main(["study", "isreshape-lm", "--out", str(out), "--parallel", "1", "--publish", "page"]) == 0
    # the page names the command that made the runs, not where it was published
    command = (out / "command.txt").read_text()
    assert command == f"python -m tools.experiments study isreshape-lm --out {out} --parallel 1\n"
    with pytest.raises(SystemExit) as e:  # results studies are checkout-only: the shipped CLI does not run them
        cli.main(["study", "isreshape-lm", "--out", str(out)])
    assert e.value.code == 2 and "invalid choice: 'study'" in capsys.readouterr().err


def test_the_sweep_keeps_the_rate_with_the_best_windowed_held_out_score(tmp_path):

    for lr, acc in ((1e-4, 0.30), (3e-4, 0.50), (1e-3, 0.50)):  # a tie: the smaller rate
        for s in (0, 1):
            run = study.root(tmp_path, 100, lr) / "v4" / f"seed{s}"
            run.mkdir(parents=True)
            (run / "metrics.jsonl").write_text("".join(json.dumps({"update": u, "heldout_acc": acc if u > 5 else 0.0})
                                                       + "\n" for u in range(10)))
    assert study.choose_lr(tmp_path, ["v4"], (1e-4, 3e-4, 1e-3), 100, (0, 1)) == {"v4": 3e-4}


def test_a_rate_whose_runs_all_diverged_is_never_chosen_and_a_diverged_run_does_not_sink_its_rate():
    from tools.experiments import analysis as an

    nan = math.nan
    sweep = {"a": {1e-3: [0.2, 0.2], 1e-2: [nan, nan]}, "b": {1e-3: [0.2, 0.3], 1e-2: [0.4, nan]}}
    assert an.choose_rates(sweep) == {"a": 1e-3, "b": 1e-2}
    assert an.sweep_table(sweep)[2:] == ["| `a` | 0.200 | – |", "| `b` | 0.250 | 0.400 |"]
    assert an.at_edge({"a": 1e-3, "b": 3e-3}, (1e-3, 3e-3, 1e-2)) == ["a"]


def test_too_few_pairs_make_no_claim():
    one = {0: {0: 0.9}}  # one pair: its bootstrap "interval" is a point that excludes 0
    assert an.paired_claim("v4", "ppo", "accuracy", one).startswith("too few paired runs (1, fewer than 5)")
    five = {0: {s: 0.1 + 0.01 * s for s in range(5)}}
    assert an.paired_claim("v4", "ppo", "accuracy", five).startswith("`v4` beats `ppo`")
