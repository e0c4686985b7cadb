"""Meta-tests of the CCAPO TextWorld study (tools/experiments/ccapo_textworld.py): pairing, the initial
model apart from the RL seed, resumability, and a page whose claims come from the intervals. No game is played."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tools.experiments import ccapo_textworld as st

pytestmark = pytest.mark.meta


def _opt(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_runs_of_one_initial_model_and_seed_differ_across_arms_only_in_the_arm(tmp_path):
    jobs = st.jobs(tmp_path, "single", st.ARMS, (0, 1, 2), (0, 1, 2, 3, 4), 50)
    grid = [j for j in jobs if "repeat" not in j.key]
    assert len(grid) == 4 * 3 * 5 and len(jobs) == len(grid) + 1
    assert len({j.run_dir for j in jobs}) == len(jobs)  # no two runs share a directory
    blocks: dict[tuple, list] = {}
    for j in grid:
        blocks.setdefault((_opt(j.argv, "--init-seed"), _opt(j.argv, "--seeds")), []).append(j)
    assert len(blocks) == 15 and all(len(b) == 4 for b in blocks.values())
    arm_flags = ("--arms", "--gigpo-omega", "--out")
    for block in blocks.values():
        shared = {tuple(x for i, x in enumerate(j.argv) if not any(j.argv[i - k] in arm_flags for k in (0, 1)))
                  for j in block}
        assert len(shared) == 1, f"runs of one pair differ beyond the arm: {shared}"
    by_arm = {j.key[-3]: j.argv for j in grid[:4]}
    assert [_opt(by_arm[a], "--arms") for a in st.ARMS] == ["ccapo", "grpo", "gigpo", "gigpo"]
    assert [_opt(by_arm[a], "--gigpo-omega") for a in st.ARMS] == [None, None, "0.5", "1.0"]
    # seed-major: an interrupted study holds whole blocks of every arm
    assert {(_opt(j.argv, "--init-seed"), _opt(j.argv, "--seeds")) for j in grid[:12]} == {(i, "0") for i in "012"}


def test_a_multiroom_run_has_six_rooms_and_a_long_horizon(tmp_path):
    argv = st.jobs(tmp_path, "multiroom", ("ccapo",), (0,), (0,), 100)[0].argv
    assert _opt(argv, "--go") == "6" and int(_opt(argv, "--max-steps")) >= 30


def test_the_initial_model_depends_on_init_seed_alone_and_leaves_the_rl_draws_alone():
    import torch

    from reference_impl.ccapo.textworld.trainer import Config, initial_policy, run_identity

    def weights(**kw):
        return torch.cat([p.detach().flatten() for p in initial_policy(Config(**kw), "cpu").parameters()])

    assert torch.equal(weights(seed=0, init_seed=3), weights(seed=7, init_seed=3))
    assert not torch.equal(weights(seed=0, init_seed=3), weights(seed=0, init_seed=4))
    torch.manual_seed(3)  # what train() does (seed_everything) before it builds the policy
    assert torch.equal(weights(seed=3), weights(seed=0, init_seed=3))  # unset: the RL seed, as before
    torch.manual_seed(11)
    weights(seed=11, init_seed=5)
    after = torch.rand(4)
    torch.manual_seed(11)
    assert torch.equal(after, torch.rand(4)), "drawing the initial model moved the RL seed's random stream"
    assert "init_seed" not in run_identity(Config(seed=1)), "old runs (no init_seed) would no longer resume"
    assert run_identity(Config(seed=1, init_seed=2))["init_seed"] == 2


def test_the_trainer_takes_init_seed_on_its_command_line(capsys):
    from reference_impl.ccapo.textworld.trainer import cli

    with pytest.raises(SystemExit) as e:
        cli(["--help"])
    assert e.value.code == 0 and "--init-seed" in capsys.readouterr().out


def test_a_finished_run_is_skipped_and_an_interrupted_one_continues(tmp_path):
    grid = {"arms": ["ccapo", "grpo"], "pretrains": [0], "seeds": [0], "updates": 10}
    jobs = st.jobs(tmp_path, "single", grid["arms"], grid["pretrains"], grid["seeds"], grid["updates"])
    assert all("--resume" in j.argv for j in jobs)  # a killed run restarts from its checkpoint
    _write_run(jobs[0].run_dir, 10, lambda u: 0.5)
    _write_run(jobs[1].run_dir, 6, lambda u: 0.5)  # stopped at update 6 of 10
    assert st.missing_runs(tmp_path / "single", grid) == ["single/init0/grpo/lr0.003/seed0",
                                                          "single/repeat/init0/ccapo/lr0.003/seed0"]


def test_pairs_whose_logs_agree_are_counted():
    same = [{"update": 0, "success_rate": 0.0}]
    runs = {(0, "ccapo", 0): same, (0, "grpo", 0): list(same), (0, "ccapo", 1): same,
            (0, "grpo", 1): [{"update": 0, "success_rate": 0.5}], (1, "ccapo", 0): same}  # the last has no pair
    assert st.identical_pairs(runs, "ccapo", "grpo") == (1, 2)


def test_records_flatten_by_split():
    recs = [{"update": 4, "split": "train", "success_rate": 0.25, "time": 1.0, "arm": "ccapo"},
            {"update": 4, "split": "heldout", "success_rate": 0.5, "mean_steps": 7.0}]
    assert st.flat(recs) == [{"update": 4, "success_rate": 0.25, "heldout_success_rate": 0.5, "heldout_mean_steps": 7.0}]


def test_a_run_that_learns_to_lose_fast_counts_as_collapsed_and_a_slow_loser_does_not():
    fast = [{"update": u, "success_rate": 0.0, "mean_steps": 2.0, "loss": 0.1} for u in range(10)]
    slow = [{**r, "mean_steps": 20.0} for r in fast]
    assert st.run_scores(fast, 20)["collapsed"] and not st.run_scores(slow, 20)["collapsed"]
    assert st.run_scores([*fast[:9], {**fast[9], "loss": math.nan}], 20)["diverged"]



def test_a_spike_the_runs_did_not_log_is_said_to_be_missing_not_shown_as_zero():
    recs = [{"update": u, "split": "train", "success_rate": 0.5, "mean_steps": 8.0, "kl_ref": 0.01, "loss": 0.1}
            for u in range(10)]  # runs from before the trainer logged grad_norm
    rows = [{**st.run_scores(recs, 20), "arm": "ccapo", "initial_model": 0, "seed": 0}]
    assert st.spike_table(rows, ["ccapo"], "grad_norm", st.SPIKES["grad_norm"]) == [
        "The gradient norm was not logged by the trainer these runs used."]
    assert st.spike_table(rows, ["ccapo"], "kl_ref", st.SPIKES["kl_ref"])[-1].startswith("| `ccapo` | 0.01 | 0 ")


def test_an_arm_whose_runs_did_not_log_a_spike_gets_a_row_saying_so_beside_the_arms_that_did():
    old = [{"update": u, "split": "train", "success_rate": 0.5, "mean_steps": 8.0, "kl_ref": 0.01, "loss": 0.1}
           for u in range(10)]
    new = [{**r, "grad_norm": 2.0 + (r["update"] == 6)} for r in old]
    rows = [{**st.run_scores(recs, 20), "arm": arm, "initial_model": 0, "seed": seed}
            for arm, seed, recs in (("ccapo", 0, new), ("ccapo", 1, old), ("gigpo-w1", 0, old))]
    table = st.spike_table(rows, ["ccapo", "gigpo-w1"], "grad_norm", st.SPIKES["grad_norm"])
    assert "| `ccapo` | 3 | 6 (model 0, seed 0) | 2 |" in table
    assert "| `gigpo-w1` | not logged | | |" in table
    assert table[-1] == "Not logged by the older trainer that made these runs: `ccapo` 1 of 2, `gigpo-w1` 1 of 1."

# ----------------------------------------------------------------------------- a synthetic study
UPDATES = 10  # held-out evaluations after updates 4 and 9; the window (last 20%) holds the second only


def _write_run(run_dir: Path, n: int, heldout, *, collapsed: bool = False, kl_spike_at: int = -1) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for u in range(n):
        lines.append({"update": u, "split": "train", "success_rate": 0.0 if collapsed else 0.5,
                      "mean_steps": 2.0 if collapsed else 8.0, "kl_ref": 9.0 if u == kl_spike_at else 0.01, "loss": 0.1,
                      "grad_norm": 50.0 if u == kl_spike_at else 1.0})
        if (u + 1) % 5 == 0:
            lines.append({"update": u, "split": "heldout", "success_rate": heldout(u), "mean_steps": 8.0})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (run_dir / "config.json").write_text("{}")


def _study(out: Path, lr: float = st.DEFAULT_LR, lift: float = 0.0) -> None:
    """ccapo 0.2 above grpo in every pair; gigpo-w0.5 +-0.1 alternating; gigpo-w1 0.1 below; one grpo run
    collapsed, one KL spike at update 7; every arm at ``lr``, every run ``lift`` higher."""
    shift = {"ccapo": lambda p, s: 0.2, "grpo": lambda p, s: 0.0,
             "gigpo-w0.5": lambda p, s: 0.1 * (-1) ** (s + p), "gigpo-w1": lambda p, s: -0.1}
    pretrains, seeds = (0, 1, 2), (0, 1, 2, 3, 4)
    for p in pretrains:
        for s in seeds:
            base = 0.4 + 0.02 * s + 0.05 * p + lift
            for arm in st.ARMS:
                _write_run(st.run_dir(out, "single", p, arm, s, lr), UPDATES, lambda u, v=base + shift[arm](p, s): v,
                           collapsed=(arm, p, s) == ("grpo", 1, 2), kl_spike_at=7 if (arm, p, s) == ("ccapo", 2, 3) else -1)
    p, arm, s = st.REPEAT
    _write_run(st.run_dir(out, "single", p, arm, s, lr, base=out / "single" / "repeat" / f"init{p}"), UPDATES,
               lambda u: 0.4 + 0.2)
    (out / "single" / "grid.json").write_text(json.dumps({"arms": list(st.ARMS), "pretrains": list(pretrains),
                                                          "seeds": list(seeds), "updates": UPDATES,
                                                          **({"lr": dict.fromkeys(st.ARMS, lr)}
                                                             if lr != st.DEFAULT_LR else {})}))
    (out / "single" / "random_policy.json").write_text(json.dumps(
        {"games": 8, "episodes": 80, "max_steps": 20, "success": 0.05, "win_steps": [9] * 4, "walkthrough_steps": [3, 4, 5]}))
    (out / "single" / "timings.jsonl").write_text("".join(
        json.dumps({"key": ["k", str(i)], "rc": 0 if i else -15, "start": 1000 + 100 * i, "wall_s": 90.0 if i else 5.0})
        + "\n" for i in range(61)))  # the first attempt was interrupted


@pytest.fixture
def fast_bootstrap(monkeypatch):
    """A page in a fraction of a second: fewer bootstrap replicates, the same sentences for these clear cases."""
    import functools

    from tools.experiments import analysis as an

    monkeypatch.setattr(an, "paired_bootstrap", functools.partial(an.paired_bootstrap, reps=1000))


def test_the_page_says_what_the_intervals_allow_and_shows_the_collapsed_run(tmp_path, fast_bootstrap):
    _study(tmp_path / "s")
    dest = tmp_path / "page"
    st.publish(tmp_path / "s", dest)
    page = (dest / "results.md").read_text()
    assert "`ccapo` beats `grpo` on held-out success (last 20%) (paired difference +0.200" in page
    assert "this study cannot tell `gigpo-w0.5` and `grpo` apart on held-out success (last 20%)" in page
    assert "`gigpo-w1` is worse than `grpo` on held-out success (last 20%)" in page
    assert "| `grpo` | 0.003 | 15 |" in page and "| 1 of 15 |" in page  # shown, not dropped
    assert "- `grpo`, initial model 1, seed 2: training success 0.00" in page
    assert "| `ccapo` | 9 | 7 (model 2, seed 3) |" in page  # the spike with its update
    assert "| `ccapo` | 50 | 7 (model 2, seed 3) | 1 |" in page  # the gradient-norm spike, above its level
    assert "1.7 hours from the first start to the last end" in page  # 61 starts 100 s apart, the last 90 s long
    assert "ran 60 training runs to their end (1 interrupted attempt was resumed from its checkpoint)" in page
    assert "the two logs are identical" in page
    assert "In 0 of 15 pairs the `ccapo` and `grpo` runs are identical" in page
    assert "take 3-5 commands; a uniform random policy over the same choices wins 5.0% of 80 episodes" in page
    for f in ("curves.png", "runs.tar.gz", "summary.csv"):
        assert (dest / f).stat().st_size > 0
    prov = json.loads((dest / "provenance.json").read_text())
    assert prov["commit"] and "python -m tools.experiments study ccapo-textworld" in prov["study_command"]
    assert prov["command"] == (f"python -m tools.experiments study ccapo-textworld --out {tmp_path / 's'} "
                               f"--variant single --no-run --publish {dest}")


def test_an_unfinished_study_is_not_published(tmp_path, capsys):
    from tools.experiments.study import main

    _study(tmp_path / "s")
    (st.run_dir(tmp_path / "s", "single", 2, "gigpo-w1", 4) / "metrics.jsonl").unlink()
    argv = ["study", "ccapo-textworld", "--out", str(tmp_path / "s"), "--no-run", "--publish", str(tmp_path / "page")]
    assert main(argv) == 2  # what the user must do first, not an internal error
    assert "1 runs unfinished (first: single/init2/gigpo-w1/lr0.003/seed4)" in capsys.readouterr().err
    assert not (tmp_path / "page").exists()
    argv[argv.index("--out") + 1] = str(tmp_path / "nothing")  # no study there at all
    assert main(argv) == 2 and "holds no single study (no grid.json)" in capsys.readouterr().err


def test_the_study_command_rejects_what_this_study_does_not_have_before_any_run(tmp_path, capsys):
    from tools.experiments.study import main

    base = ["study", "ccapo-textworld", "--out", str(tmp_path / "s")]
    (tmp_path / "lr.json").write_text(json.dumps({"ccapo": 1e-3}))
    assert main([*base, "--lr-from", str(tmp_path / "lr.json")]) == 2  # no rate for grpo, gigpo-w0.5, gigpo-w1
    assert main([*base, "--variant", "tiny"]) == 2
    assert main([*base, "--arms", "ccapo,ppo"]) == 2
    err = capsys.readouterr().err
    assert "no positive learning rate for arm 'grpo'" in err and "--variant tiny: choose from single, multiroom" in err
    assert "unknown arm 'ppo'" in err and not (tmp_path / "s").exists()


def test_the_sweep_runs_apart_from_the_grid_it_chooses_for(tmp_path):
    sweep = st.sweep_jobs(tmp_path, "single", st.ARMS, 50)
    assert len(sweep) == len(st.ARMS) * len(st.LRS) * len(st.SWEEP_SEEDS)
    assert {_opt(j.argv, "--init-seed") for j in sweep} == {str(st.SWEEP_INIT)}
    assert st.SWEEP_INIT not in st.PRETRAIN_SEEDS
    assert {float(_opt(j.argv, "--lr")) for j in sweep} == set(st.LRS)
    main = st.jobs(tmp_path, "single", st.ARMS, st.PRETRAIN_SEEDS, st.SEEDS, 50,
                   chosen={"ccapo": 1e-2, "grpo": 1e-3, "gigpo-w0.5": 3e-3, "gigpo-w1": 3e-3})
    assert not {j.run_dir for j in sweep} & {j.run_dir for j in main}
    assert {(j.key[-3], _opt(j.argv, "--lr")) for j in main} == {("ccapo", "0.01"), ("grpo", "0.001"),
                                                                ("gigpo-w0.5", "0.003"), ("gigpo-w1", "0.003")}
    assert all(j.run_dir.parent == Path(_opt(j.argv, "--out")) for j in sweep + main)  # where the trainer writes


def test_the_study_runs_each_arm_at_the_rate_its_sweep_chose(tmp_path, monkeypatch):
    ran = []

    def fake_grid(grid, where, **kw):  # the sweep's runs: ccapo best at 1e-2, the others at 1e-3
        ran.append(grid)
        for j in grid:
            if "sweep" in j.key:
                best = {"ccapo": 1e-2}.get(j.key[3], 1e-3)
                _write_run(j.run_dir, 10, lambda u, v=0.9 if float(_opt(j.argv, "--lr")) == best else 0.1: v)

    monkeypatch.setattr(st, "run_grid", fake_grid)
    monkeypatch.setattr(st, "prepare_games", lambda out, variant: None)
    (tmp_path / "single").mkdir()
    (tmp_path / "single" / "random_policy.json").write_text("{}")
    arms = ("ccapo", "grpo")
    chosen = st.run(tmp_path, parallel=1, updates=10, arms=arms, seeds=(0,), pretrains=(0,), echo=lambda m: None)
    assert chosen == {"ccapo": 1e-2, "grpo": 1e-3}
    assert json.loads((tmp_path / "single" / "grid.json").read_text())["lr"] == chosen
    assert {(j.key[-3], _opt(j.argv, "--lr")) for j in ran[1]} == {("ccapo", "0.01"), ("grpo", "0.001")}
    ran.clear()  # rates given: no sweep
    assert st.run(tmp_path, parallel=1, updates=10, arms=arms, seeds=(0,), pretrains=(0,), echo=lambda m: None,
                  chosen={"ccapo": 3e-3, "grpo": 3e-3}) == {"ccapo": 3e-3, "grpo": 3e-3}
    assert len(ran) == 1 and not any("sweep" in j.key for j in ran[0])


def test_the_page_shows_the_sweep_and_each_arms_rate(tmp_path, fast_bootstrap):
    out = tmp_path / "s"
    top = max(st.LRS)
    _study(out, lr=top)  # the main grid at the rate the sweep below chose
    for j in st.sweep_jobs(out, "single", st.ARMS, UPDATES):
        _write_run(j.run_dir, UPDATES, lambda u, v=0.5 + float(_opt(j.argv, "--lr")): v)  # the largest rate best
    st.publish(out, tmp_path / "page")
    page = (tmp_path / "page" / "results.md").read_text()
    assert "each arm at its best learning rate" in page.splitlines()[0]
    assert "| `ccapo` | " + " | ".join(f"{0.5 + lr:.3f}" for lr in st.LRS) + " |" in page
    assert f"| `ccapo` | {top:g} | 15 |" in page
    assert "The runs of one cell differ by up to 0.000" in page  # the fake sweep's two seeds agree
    assert "`gigpo-w1`, `ccapo`" not in page and "is at an edge of the grid" in page
    assert "the two logs are identical" in page  # the repeat found at its arm's rate
    assert "against the trainer's default" not in page  # the grid never ran at the default


def test_the_page_compares_each_arms_chosen_rate_with_the_default_where_the_grid_ran_both(tmp_path, fast_bootstrap):
    out, top = tmp_path / "s", max(st.LRS)
    _study(out)  # the grid at the default, from before the sweep
    _study(out, lr=top, lift=0.2)  # then at the chosen rate, every pair 0.2 higher; grid.json now names the rate
    for j in st.sweep_jobs(out, "single", st.ARMS, UPDATES):
        _write_run(j.run_dir, UPDATES, lambda u, v=0.5 + float(_opt(j.argv, "--lr")): v)
    st.publish(out, tmp_path / "page")
    section = (tmp_path / "page" / "results.md").read_text().split("## The chosen rates against the trainer's default")
    assert len(section) == 2, "no section comparing the chosen rates with the default"
    section = section[1].split("## ")[0]
    assert "| `grpo` | 0.003 | 15 | " in section and "| 1 of 15 |" in section  # its collapsed run, at the default
    for arm in st.ARMS:
        assert f"`{arm} at {top:g}` beats `{arm} at 0.003` on held-out success (last 20%) (paired difference +0.200" \
            in section


def test_a_study_from_before_the_sweep_reads_as_every_arm_at_the_default_rate(tmp_path, fast_bootstrap):
    _study(tmp_path / "s")
    st.publish(tmp_path / "s", tmp_path / "page")
    page = (tmp_path / "page" / "results.md").read_text()
    assert "No sweep in this study: every arm at 0.003 (the trainer's default)." in page
    assert "| `grpo` | 0.003 | 15 |" in page and "Learning-rate sweep" not in page


def test_a_sweep_run_that_did_not_finish_stops_the_study_before_a_rate_is_chosen(tmp_path, monkeypatch, capsys):
    from tools.experiments.study import main

    def crashed_grid(grid, where, **kw):  # every sweep run but the last finishes; that one dies at update 3
        for j in grid:
            _write_run(j.run_dir, 10 if j is not grid[-1] else 3, lambda u: 0.5)

    monkeypatch.setattr(st, "run_grid", crashed_grid)
    monkeypatch.setattr(st, "prepare_games", lambda out, variant: None)
    (tmp_path / "single").mkdir()
    (tmp_path / "single" / "random_policy.json").write_text("{}")
    assert main(["study", "ccapo-textworld", "--out", str(tmp_path), "--updates", "10", "--arms", "ccapo"]) == 1
    err = capsys.readouterr().err
    assert "1 runs of the sweep did not finish (first: single/sweep/init100/ccapo/lr0.03/seed3" in err
    assert not (tmp_path / "single" / "grid.json").exists() and not (tmp_path / "single" / "chosen_lr.json").exists()


def test_a_page_republished_from_its_archive_alone_is_the_same_page_older_layout_included(tmp_path, fast_bootstrap):
    import io
    import tarfile

    from tools.experiments.grid import read_archive
    from tools.experiments.study import main

    _study(tmp_path / "s")
    st.publish(tmp_path / "s", tmp_path / "page")
    page = (tmp_path / "page" / "results.md").read_text()
    # the same runs as archived before the sweep: no lr<L> level, the rate in each run's config.json only
    with tarfile.open(tmp_path / "old.tgz", "w:gz") as tar:
        for rel, data in read_archive(tmp_path / "page" / "runs.tar.gz").items():
            if rel.parent.parent.name == "lr0.003":
                rel = rel.parent.parent.parent / rel.parent.name / rel.name
                data = json.dumps({"config": {"lr": 0.003}}).encode() if rel.name == "config.json" else data
            info = tarfile.TarInfo(rel.as_posix())
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    for archive in (tmp_path / "page" / "runs.tar.gz", tmp_path / "old.tgz"):
        out = tmp_path / f"new-{archive.stem}"
        assert main(["study", "ccapo-textworld", "--out", str(out), "--updates", str(UPDATES), "--no-run",
                     "--resume-from", str(archive), "--publish", str(tmp_path / "page")]) == 0
        assert (tmp_path / "page" / "results.md").read_text() == page
        assert (out / "single" / "init0" / "ccapo" / "lr0.003" / "ccapo-s0" / "metrics.jsonl").is_file()
