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


def _finished(run_dir, n, **config):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"update": u}) + "\n" for u in range(n)))
    (run_dir / "config.json").write_text(json.dumps({"config": config}))


def test_a_study_travels_as_its_finished_runs_and_a_restore_merges_never_shortens(tmp_path):
    from tools.experiments.grid import pack, read_archive, restore, write_archive

    a = tmp_path / "a"
    _finished(a / "pt0" / "lr0.001" / "v4" / "seed0", 10)
    _finished(a / "pt0" / "lr0.001" / "v4" / "seed1", 4)  # in flight: without its checkpoint it could not resume
    (a / "pt0" / "lr0.001" / "v4" / "seed0" / "model.pt").write_bytes(b"weights")
    (a / "timings.jsonl").write_text('{"key": ["x"]}\n')
    (a / "chosen_lr.json").write_text('{"v4": 0.001}')
    assert pack(a, 10, tmp_path / "p.tgz") == 1
    first = (tmp_path / "p.tgz").read_bytes()
    assert pack(a, 10, tmp_path / "p.tgz") == 1 and (tmp_path / "p.tgz").read_bytes() == first  # byte-stable
    assert sorted(map(str, read_archive(tmp_path / "p.tgz"))) == [
        "chosen_lr.json", "pt0/lr0.001/v4/seed0/config.json", "pt0/lr0.001/v4/seed0/metrics.jsonl", "timings.jsonl"]

    b = tmp_path / "b"
    _finished(b / "pt0" / "lr0.001" / "v4" / "seed0", 3)  # a shorter copy here is replaced
    _finished(b / "pt0" / "lr0.001" / "v4" / "seed2", 10)  # a run the archive lacks stays
    (b / "timings.jsonl").write_text('{"key": ["y"]}\n{"key": ["x"]}\n')
    (b / "chosen_lr.json").write_text('{"v4": 0.01}')
    assert restore(tmp_path / "p.tgz", b, 10) == (1, 0, 0)
    assert updates_done(b / "pt0" / "lr0.001" / "v4" / "seed0") == 10
    assert updates_done(b / "pt0" / "lr0.001" / "v4" / "seed2") == 10
    assert (b / "timings.jsonl").read_text() == '{"key": ["y"]}\n{"key": ["x"]}\n'  # merged, no record twice
    assert (b / "chosen_lr.json").read_text() == '{"v4": 0.01}'  # the study rewrites its own files
    assert restore(tmp_path / "p.tgz", b, 10) == (0, 1, 0)  # nothing new the second time

    # a page's archive may hold an unfinished run: it is counted and left out
    files = [a / "pt0" / "lr0.001" / "v4" / s / "metrics.jsonl" for s in ("seed0", "seed1")]
    write_archive(a, files, tmp_path / "page.tgz")
    assert restore(tmp_path / "page.tgz", tmp_path / "c", 10) == (1, 0, 1)
    assert not (tmp_path / "c" / "pt0" / "lr0.001" / "v4" / "seed1").exists()


def test_an_archive_that_would_write_outside_the_study_is_refused_before_anything_is_unpacked(tmp_path, capsys):
    import io
    import tarfile

    good = tmp_path / "good.tgz"
    from tools.experiments.grid import pack

    _finished(tmp_path / "src" / "pt0" / "lr0.001" / "v4" / "seed0", study.UPDATES)
    pack(tmp_path / "src", study.UPDATES, good)
    with tarfile.open(tmp_path / "evil.tgz", "w:gz") as tar:
        info = tarfile.TarInfo("../escaped/metrics.jsonl")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    (tmp_path / "junk.tgz").write_bytes(b"not a tar")
    out = tmp_path / "s"
    for bad, why in (("evil.tgz", "would land outside the study directory"), ("junk.tgz", "not a study archive"),
                     ("missing.tgz", "not a study archive")):
        argv = ["study", "isreshape-lm", "--out", str(out), "--no-run", "--resume-from", str(good),
                "--resume-from", str(tmp_path / bad)]
        assert study_main(argv) == 2
        assert why in capsys.readouterr().err
        assert not out.exists() and not (tmp_path / "escaped").exists()  # the good archive was not unpacked either
    assert study_main(["study", "isreshape-lm", "--out", str(out), "--progress", str(tmp_path / "no" / "p.tgz")]) == 2
    assert "its directory does not exist" in capsys.readouterr().err and not out.exists()


def test_resume_from_and_progress_carry_a_study_and_stay_out_of_its_command(tmp_path, monkeypatch, capsys):
    from tools.experiments.grid import read_archive

    n = study.UPDATES
    _finished(tmp_path / "old" / "pt0" / "lr0.001" / "v4" / "seed0", n)
    from tools.experiments.grid import pack

    pack(tmp_path / "old", n, tmp_path / "page.tgz")
    seen = {}

    def run(out, progress=None, **kw):  # the archive's run is in place before the study runs; one more finishes
        seen["restored"] = updates_done(out / "pt0" / "lr0.001" / "v4" / "seed0")
        seen["progress"] = progress
        _finished(out / "pt1" / "lr0.001" / "v4" / "seed0", n)

    monkeypatch.setattr(study, "run", run)
    out, prog = tmp_path / "s", tmp_path / "progress.tgz"
    argv = ["study", "isreshape-lm", "--out", str(out), "--resume-from", str(tmp_path / "page.tgz"),
            f"--progress={prog}", "--parallel", "1"]
    assert study_main(argv) == 0
    assert seen == {"restored": n, "progress": prog}
    assert {str(p.parent) for p in read_archive(prog) if p.name == "metrics.jsonl"} == {
        "pt0/lr0.001/v4/seed0", "pt1/lr0.001/v4/seed0"}
    assert (out / "command.txt").read_text() == f"python -m tools.experiments study isreshape-lm --out {out} " \
                                                "--parallel 1\n"  # where a study is kept is not what it runs
    # on a new machine: the progress file alone brings both runs back
    assert study_main(["study", "isreshape-lm", "--out", str(tmp_path / "t"), "--progress", str(prog), "--no-run"]) == 0
    assert "2 finished runs unpacked into" in capsys.readouterr().out
    assert updates_done(tmp_path / "t" / "pt1" / "lr0.001" / "v4" / "seed0") == n
