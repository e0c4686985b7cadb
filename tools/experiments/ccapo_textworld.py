"""The CCAPO TextWorld study: CCAPO, GRPO and GiGPO (step weight 0.5 and 1) x 5 RL seeds x 3 initial models,
each arm at its best learning rate.

One command, ``python -m tools.experiments study ccapo-textworld --out DIR [--variant multiroom]``:

- **Sweep.** Each arm at every rate of ``LRS`` on an initial model and RL seeds of its own (``SWEEP_INIT``,
  ``SWEEP_SEEDS``), so the choice never sees the runs it is judged on; the rate with the best windowed held-out
  success is kept (``--lr-from FILE`` skips the sweep).
- **Pairs.** Runs of one (initial model I, RL seed S) share the network's initial weights (``--init-seed I``),
  the training games of every update and the evaluation draws (``--seeds S``) across arms, so each arm is
  compared with ``BASELINE`` run by run. The arms differ only in the advantage they train on; their draws
  part as soon as their policies do.
- **GiGPO's step weight.** GiGPO's step term runs at omega 0.5, CCAPO's micro weight (CCAPO-DEFAULT-3), and
  at omega 1, the trainer's default and the earlier single-seed page's setting; both are reported.
- **Repeat.** One configuration runs twice (``repeat/``), so the page states the run-to-run spread of a
  re-run on this machine instead of assuming it is zero.

Layout: ``DIR/<variant>/init<I>/<arm>/lr<L>/<trainer arm>-s<S>/metrics.jsonl``, the sweep the same under
``DIR/<variant>/sweep/``; games are generated once into ``DIR/games`` (deterministic by seed);
``DIR/<variant>/grid.json`` records the grid the page is checked against, rates included.
"""
from __future__ import annotations

import json
import math
from pathlib import Path, PurePosixPath

from reference_impl.ccapo.textworld.env import TextWorldEnv
from reference_impl.ccapo.textworld.games import game_set, train_and_heldout
from reference_impl.ccapo.textworld.trainer import Config
from rlconform.cli._common import UsageError
from rlconform.provenance import stamp

from tools.experiments import analysis as an
from tools.experiments.analysis import read_metrics
from tools.experiments.grid import (
    Job,
    elapsed_s,
    flags,
    packer,
    read_timings,
    require_finished,
    run_grid,
    updates_done,
    write_archive,
)
from tools.experiments.plots import arm_curves
from tools.experiments.study import PROG

ARMS = ("ccapo", "grpo", "gigpo-w0.5", "gigpo-w1")
BASELINE = "grpo"  # CCAPO with beta = 0: the same code without the micro stream
# study arm -> (the trainer's --arms value, the Config fields the arm sets)
ARM_CONFIG = {"ccapo": ("ccapo", {}), "grpo": ("grpo", {}),
              "gigpo-w0.5": ("gigpo", {"gigpo_omega": 0.5}), "gigpo-w1": ("gigpo", {"gigpo_omega": 1.0})}
PRETRAIN_SEEDS, SEEDS = (0, 1, 2), (0, 1, 2, 3, 4)  # initial models (init_seed) x RL seeds
LRS = (1e-3, 3e-3, 1e-2, 3e-2)  # around the trainer's default (3e-3); a best rate at an edge calls for a wider grid
SWEEP_INIT, SWEEP_SEEDS = 100, (0, 1, 2, 3)  # its own initial model and seeds; the outcome of a run is near 0 or 1
DEFAULT_LR = Config.lr  # the rate of a study that recorded none (studies from before the sweep)
REPEAT = (0, "ccapo", 0)  # (initial model, arm, seed) run a second time to measure the run-to-run spread
# evaluation every 5 updates, so the last 20% of a 50-update run holds two held-out evaluations (64 episodes)
EVAL = {"eval_every": 5, "heldout_games": 16, "eval_episodes": 2}
# single: the published setting (one kitchen, 20-command horizon; walkthroughs of 3 commands); multiroom: 6 rooms,
# 40-command horizon (walkthroughs of 3-6 commands; a uniform random policy wins 3.75% of 80 episodes, in 10-35
# commands; with --recipe 2 --take 2 or --go 9 it won none of 60 within 50, too cold a start for group advantages)
VARIANTS = {"single": {"updates": 50, "task": {}},
            "multiroom": {"updates": 100, "task": {"go": 6, "max_steps": 40}}}
# a run has collapsed to the short-episode failure when, over its last 20% of updates, its training episodes
# (almost) never win and end in under half the horizon: the time penalty's ranking of losses at work
COLLAPSE_SUCCESS, COLLAPSE_STEPS_SHARE = 0.05, 0.5


# Per-update figures whose spikes the page reports, with the update where each happened.
SPIKES = {"kl_ref": "KL(π‖π_ref) of each arm (CCAPO-PPO-2's k3 estimate, per update)",
          "grad_norm": "gradient norm of each arm (before clipping; per update, the largest of its epochs)"}


def spike_table(rows: list[dict], arms, key: str, what: str) -> list[str]:
    """The largest ``key`` of each arm with the update and run where it happened, beside the arm's typical
    last-20% level; a line saying so when the runs did not log ``key``."""
    if all(math.isnan(r[f"{key}_peak"]) for r in rows):
        return [f"The {what.split(' of each arm')[0]} was not logged by the trainer these runs used."]
    out = [f"The largest {what}, with the update where it happened:", "",
           "| arm | peak | at update (run) | last-20% median (median run) |", "|---|---|---|---|"]
    unlogged = []  # (arm, runs without key, runs): an older trainer's runs, kept rather than rerun
    for arm in arms:
        runs = [r for r in rows if r["arm"] == arm]
        logged = [r for r in runs if not math.isnan(r[f"{key}_peak"])]
        if len(logged) < len(runs):
            unlogged.append((arm, len(runs) - len(logged), len(runs)))
        if not logged:
            out.append(f"| `{arm}` | not logged | | |")
            continue
        k = max(logged, key=lambda r: r[f"{key}_peak"])
        med = sorted(r[key] for r in logged)[len(logged) // 2]
        out.append(f"| `{arm}` | {k[f'{key}_peak']:.3g} | {k[f'{key}_peak_update']} (model {k['initial_model']}, "
                   f"seed {k['seed']}) | {med:.3g} |")
    if unlogged:
        out += ["", "Not logged by the older trainer that made these runs: "
                + ", ".join(f"`{a}` {n} of {total}" for a, n, total in unlogged) + "."]
    return out


def lr_lines(sweep: an.Sweep, chosen: dict[str, float], variant: str) -> list[str]:
    """The design's learning-rate item: how each arm's rate was chosen."""
    if not sweep:
        same = len(set(chosen.values())) == 1
        return ["- **Learning rate.** No sweep in this study: "
                + (f"every arm at {next(iter(chosen.values())):g}" if same else
                   ", ".join(f"`{a}` {lr:g}" for a, lr in chosen.items()))
                + (" (the trainer's default)." if same and next(iter(chosen.values())) == DEFAULT_LR else
                   " (given with `--lr-from`).")]
    return [f"- **Learning rate, per arm.** Each arm ran at every rate of {', '.join(f'{lr:g}' for lr in LRS)} on an "
            f"initial model of its own (network seed {SWEEP_INIT}) and RL seeds {', '.join(map(str, SWEEP_SEEDS))}, "
            f"{variant} games as here; the rate with the best mean held-out success (last 20%) was kept, ties to the "
            "smaller rate. The choice never sees the runs it is judged on; it does see the same held-out games."]


def sweep_section(sweep: an.Sweep, chosen: dict[str, float]) -> list[str]:
    """The sweep's table and the chosen rates, with the arms whose rate is at an edge of the grid."""
    if not sweep:
        return []
    edge = an.at_edge(chosen, LRS)
    cells = [[x for x in v if not math.isnan(x)] for by_lr in sweep.values() for v in by_lr.values()]
    gaps = [max(v) - min(v) for v in cells if len(v) > 1]
    return ["Learning-rate sweep: held-out success (last 20%), mean over the sweep's runs:", "",
            *an.sweep_table(sweep), "",
            *([f"The runs of one cell differ by up to {max(gaps):.3f} (median {sorted(gaps)[len(gaps) // 2]:.3f}): "
               "with this few runs per cell the choice is coarse, and the main grid's intervals, not the sweep, "
               "carry the comparison.", ""] if gaps else []),
            "Chosen: " + ", ".join(f"`{a}` {lr:g}" for a, lr in chosen.items()) + "."
            + (f" The rate of {', '.join(f'`{a}`' for a in edge)} is at an edge of the grid, so a wider grid could "
               "still move it." if edge else ""), ""]


def _span(values) -> str:
    """``3`` for equal values, ``3-6`` for a range."""
    lo, hi = min(values), max(values)
    return f"{lo}" if lo == hi else f"{lo}-{hi}"

def default_updates(variant: str) -> int:
    return VARIANTS[variant]["updates"]


def relocate(run: PurePosixPath, config: dict) -> PurePosixPath:
    """A run archived before the sweep (``<variant>/init<I>/<arm>/<trainer arm>-s<S>``, no ``lr<L>`` level) at
    today's path, under the rate its ``config.json`` records; a run of today's layout as it is."""
    if run.parent.name.startswith("lr"):
        return run
    return run.parent / f"lr{config.get('config', {}).get('lr', DEFAULT_LR):g}" / run.name


def root(out: Path, variant: str, init: int) -> Path:
    return Path(out) / variant / f"init{init}"


def sweep_root(out: Path, variant: str) -> Path:
    return Path(out) / variant / "sweep" / f"init{SWEEP_INIT}"


def run_dir(out: Path, variant: str, init: int, arm: str, seed: int, lr: float = DEFAULT_LR, *,
            base: Path | None = None) -> Path:
    where = Path(base) if base is not None else root(out, variant, init)
    return where / arm / f"lr{lr:g}" / f"{ARM_CONFIG[arm][0]}-s{seed}"


def job(out: Path, variant: str, arm: str, init: int, seed: int, updates: int, lr: float = DEFAULT_LR, *,
        device: str = "cpu", base: Path | None = None, tag: str = "") -> Job:
    """One run; ``base`` puts it under another root (the repeat, the sweep; ``tag`` names it in the key)."""
    trainer_arm, arm_cfg = ARM_CONFIG[arm]
    rd = run_dir(out, variant, init, arm, seed, lr, base=base)
    argv = ("--arms", trainer_arm, "--seeds", str(seed), "--init-seed", str(init), "--updates", str(updates),
            "--lr", f"{lr:g}", "--resume", "--out", str(rd.parent), "--device", device,
            "--games-dir", str(Path(out) / "games"), *flags(EVAL), *flags(VARIANTS[variant]["task"]), *flags(arm_cfg))
    key = (variant, *((tag,) if tag else ()), f"init{init}", arm, f"lr{lr:g}", f"seed{seed}")
    return Job(key=key, trainer="ccapo-textworld", argv=argv, run_dir=rd, updates=updates)


def jobs(out: Path, variant: str, arms, pretrains, seeds, updates: int, device: str = "cpu",
         chosen: dict[str, float] | None = None) -> list[Job]:
    """The main grid, each arm at its ``chosen`` rate (default: the trainer's). Seed-major order, so an
    interrupted study holds whole (model, seed) blocks of every arm, paired; the repeat last."""
    lr = {a: (chosen or {}).get(a, DEFAULT_LR) for a in arms}
    grid = [job(out, variant, a, p, s, updates, lr[a], device=device) for s in seeds for p in pretrains for a in arms]
    p, a, s = REPEAT
    if a in arms and p in pretrains and s in seeds:
        grid.append(job(out, variant, a, p, s, updates, lr[a], device=device, tag="repeat",
                        base=Path(out) / variant / "repeat" / f"init{p}"))
    return grid


def sweep_jobs(out: Path, variant: str, arms, updates: int, device: str = "cpu") -> list[Job]:
    """Every arm at every rate of ``LRS`` on the sweep's initial model and seeds, rate-major."""
    return [job(out, variant, a, SWEEP_INIT, s, updates, lr, device=device, tag="sweep", base=sweep_root(out, variant))
            for lr in LRS for s in SWEEP_SEEDS for a in arms]


def sweep_scores(out: Path, variant: str, arms) -> an.Sweep:
    """Each finished sweep run's windowed held-out success, by arm and rate (rates never run left out)."""
    sweep: an.Sweep = {}
    for arm in arms:
        for lr in LRS:
            recs = [flat(read_metrics(run_dir(out, variant, SWEEP_INIT, arm, s, lr, base=sweep_root(out, variant))))
                    for s in SWEEP_SEEDS]
            if any(recs):
                sweep.setdefault(arm, {})[lr] = [an.windowed(r, "heldout_success_rate") for r in recs if r]
    return sweep


def prepare_games(out: Path, variant: str) -> None:
    """Generate the variant's games once, before any run (runs in parallel would each compile them)."""

    cfg = Config(**VARIANTS[variant]["task"], **EVAL)
    train_and_heldout(cfg.game_spec(), cfg.train_games, cfg.heldout_games, Path(out) / "games")


def random_policy(out: Path, variant: str, *, games: int = 8, episodes: int = 10, seed: int = 0) -> dict:
    """A uniform random policy over the trainer's choice set on training games 0..games-1, at the variant's
    horizon, and each game's walkthrough length (TextWorld's own solution): how often play wins before any
    learning, the cold start the group advantages depend on. Written to ``DIR/<variant>/random_policy.json``."""
    import random

    import textworld

    cfg = Config(**VARIANTS[variant]["task"])
    rng = random.Random(seed)
    wins, walks = [], []
    for path in game_set(cfg.game_spec(), range(games), Path(out) / "games"):
        env = textworld.start(str(path), request_infos=textworld.EnvInfos(policy_commands=True))
        walks.append(len(env.reset().policy_commands))
        env.close()
        e = TextWorldEnv(path, cfg.max_steps)
        for _ in range(episodes):
            e.reset()
            while not e.done:
                e.step(rng.choice(e.admissible(cfg.drop_examine)))
            wins.append(e.t if e.won else None)
        e.close()
    rec = {"games": games, "episodes": len(wins), "max_steps": cfg.max_steps,
           "success": sum(w is not None for w in wins) / len(wins), "win_steps": [w for w in wins if w is not None],
           "walkthrough_steps": walks}
    (Path(out) / variant).mkdir(parents=True, exist_ok=True)
    (Path(out) / variant / "random_policy.json").write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def run(out: Path, *, parallel: int, updates: int | None = None, device: str = "cpu", variant: str = "single",
        arms=ARMS, seeds=SEEDS, pretrains=PRETRAIN_SEEDS, chosen: dict[str, float] | None = None,
        progress: Path | None = None, echo=print) -> dict[str, float]:
    """The sweep (unless ``chosen`` gives each arm's rate), then the main grid; returns the rates used (also in
    ``DIR/<variant>/chosen_lr.json``, the file ``--lr-from`` takes, and in ``grid.json``). ``progress``: an
    archive re-packed as each run ends (``grid.pack``)."""
    out = Path(out)
    updates = updates or default_updates(variant)
    after = packer(out, updates, progress)
    vdir = out / variant
    vdir.mkdir(parents=True, exist_ok=True)
    if (out / "command.txt").exists():  # the page names its own variant's command; the top file is the latest
        (vdir / "command.txt").write_text((out / "command.txt").read_text())
    prepare_games(out, variant)
    if not (vdir / "random_policy.json").exists():
        rp = random_policy(out, variant)
        echo(f"{variant}: a uniform random policy wins {rp['success']:.1%} of {rp['episodes']} episodes")
    if chosen is None:
        echo(f"{variant} sweep: {len(arms)} arms x {len(LRS)} learning rates x {len(SWEEP_SEEDS)} seeds on initial "
             f"model {SWEEP_INIT}")
        sweep = sweep_jobs(out, variant, arms, updates, device)
        run_grid(sweep, vdir, parallel=parallel, echo=echo, after=after)
        require_finished(sweep, "sweep")  # a rate is never chosen from part of its runs
        chosen = an.choose_rates(sweep_scores(out, variant, arms))
    chosen = {a: chosen[a] for a in arms}
    (vdir / "chosen_lr.json").write_text(json.dumps(chosen, indent=1) + "\n")
    (vdir / "grid.json").write_text(json.dumps({"arms": list(arms), "pretrains": list(pretrains), "seeds": list(seeds),
                                                "updates": updates, "device": device, "lr": chosen}, indent=1) + "\n")
    echo(f"{variant}: {len(arms)} arms x {len(pretrains)} initial models x {len(seeds)} seeds, {updates} updates; "
         "learning rates " + ", ".join(f"{a} {lr:g}" for a, lr in chosen.items()))
    run_grid(jobs(out, variant, arms, pretrains, seeds, updates, device, chosen), vdir, parallel=parallel, echo=echo,
             after=after)
    return chosen


# ----------------------------------------------------------------------------- scores of one run
def flat(records: list[dict]) -> list[dict]:
    """The trainer's records as one flat record per update: training keys as they are, held-out keys with a
    ``heldout_`` prefix (the trainer logs both splits under the same names)."""
    by_update: dict[int, dict] = {}
    for r in records:
        pre = "heldout_" if r.get("split") == "heldout" else ""
        row = by_update.setdefault(int(r["update"]), {"update": int(r["update"])})
        row.update({pre + k: v for k, v in r.items() if k not in ("update", "split", "family", "time", "arm")})
    return [by_update[u] for u in sorted(by_update)]


def run_scores(recs: list[dict], max_steps: int) -> dict:
    """One run's row of the page: windowed scores (the claims' metrics), the final evaluation (shown only),
    the KL spike with its update, and whether the run collapsed to short failures."""

    evals = [v for _, v in an.series(recs, "heldout_success_rate")]
    row = {"updates": recs[-1]["update"] + 1 if recs else 0,
           "heldout": an.windowed(recs, "heldout_success_rate"),
           "heldout_mean": sum(evals) / len(evals) if evals else math.nan,
           "heldout_final": evals[-1] if evals else math.nan,
           "train_success": an.windowed(recs, "success_rate"), "train_steps": an.windowed(recs, "mean_steps"),
           "diverged": any(math.isnan(v) for _, v in an.series(recs, "loss"))}
    for key in SPIKES:  # each spike with its update, and the level it sits above
        row[key] = an.windowed(recs, key)
        row[f"{key}_peak"], row[f"{key}_peak_update"] = an.peak(recs, key)
    row["collapsed"] = bool(row["train_success"] <= COLLAPSE_SUCCESS
                            and row["train_steps"] <= COLLAPSE_STEPS_SHARE * max_steps)
    return row


def identical_pairs(runs: dict[tuple[int, str, int], list[dict]], a: str, b: str) -> tuple[int, int]:
    """(pairs whose two logs are equal record for record, pairs) of arms ``a`` and ``b``."""
    pairs = [(p, s) for (p, arm, s) in runs if arm == a and (p, b, s) in runs]
    return sum(runs[(p, a, s)] == runs[(p, b, s)] for p, s in pairs), len(pairs)


# ----------------------------------------------------------------------------- the page
def rates(grid: dict) -> dict[str, float]:
    """Each arm's learning rate in the main grid (``grid.json``; a study from before the sweep: the default)."""
    return {a: grid.get("lr", {}).get(a, DEFAULT_LR) for a in grid["arms"]}


def _runs(vdir: Path, chosen: dict[str, float]) -> dict[tuple[int, str, int], list[dict]]:
    """(initial model, arm, seed) -> flat records of every main-grid run found under ``vdir``, each arm at its
    ``chosen`` rate (the repeat and the sweep excluded)."""

    runs = {}
    for init_dir in sorted(vdir.glob("init*")):
        for arm, lr in chosen.items():
            for rd in sorted((init_dir / arm / f"lr{lr:g}").glob(f"{ARM_CONFIG[arm][0]}-s*")):
                recs = read_metrics(rd)
                if recs:
                    runs[(int(init_dir.name[4:]), arm, int(rd.name.rsplit("-s", 1)[1]))] = flat(recs)
    return runs


METRIC = "held-out success (last 20%)"  # the claims' metric (run_scores' "heldout")


def default_rate_lines(vdir: Path, chosen: dict[str, float], updates: int, max_steps: int) -> list[str]:
    """Each tuned arm at its chosen rate against the same arm at the trainer's default, in pairs (same initial
    model and seed), where the grid also ran at the default (a study from before the sweep); [] otherwise.
    Whether the sweep's choice, made on another initial model, carries over is itself a finding."""
    tuned = {a: lr for a, lr in chosen.items() if lr != DEFAULT_LR}

    def finished(rates: dict[str, float]) -> dict:
        return {k: r for k, r in _runs(vdir, rates).items() if len(r) >= updates}

    old = finished(dict.fromkeys(tuned, DEFAULT_LR))
    if not old:
        return []
    rows = {(p, f"{a}@{tag}", s): run_scores(recs, max_steps)
            for tag, runs in (("default", old), ("chosen", finished(tuned))) for (p, a, s), recs in runs.items()}
    held = {k: r["heldout"] for k, r in rows.items()}
    lines = ["## The chosen rates against the trainer's default", "",
             f"The same grid also ran at the trainer's default rate ({DEFAULT_LR:g}) before the sweep:", "",
             "| arm | lr | runs | held-out success, last 20% (mean, 95% CI) | collapsed runs |",
             "|---|---|---|---|---|"]
    for arm in tuned:
        mine = [r for (p, a, s), r in rows.items() if a == f"{arm}@default"]
        if mine:
            m, lo, hi = an.paired_bootstrap(an.by_model(held, f"{arm}@default"))
            lines.append(f"| `{arm}` | {DEFAULT_LR:g} | {len(mine)} | {m:.3f} [{lo:.3f}, {hi:.3f}] | "
                         f"{sum(r['collapsed'] for r in mine)} of {len(mine)} |")
    lines += ["", "Each arm at its chosen rate against itself at the default, paired:", ""]
    for arm, lr in tuned.items():
        diffs = an.paired_differences(held, f"{arm}@chosen", f"{arm}@default")
        lines.append(f"- {an.paired_claim(f'{arm} at {lr:g}', f'{arm} at {DEFAULT_LR:g}', METRIC, diffs)}.")
    return lines + [""]


def missing_runs(vdir: Path, grid: dict) -> list[str]:
    """The runs of ``grid`` (grid.json) that have not logged all their updates, repeat included."""

    out = vdir.parent
    return ["/".join(j.key) for j in jobs(out, vdir.name, grid["arms"], grid["pretrains"], grid["seeds"],
                                          grid["updates"], chosen=rates(grid))
            if updates_done(j.run_dir) < j.updates]


def repeat_spread(vdir: Path, updates: int, lr: float) -> tuple[float, int] | None:
    """(largest |difference| of held-out success between the repeat and its original, the first update
    where their training logs differ, -1 if never); None while either is unfinished."""

    p, arm, s = REPEAT
    a = flat(read_metrics(run_dir(vdir.parent, vdir.name, p, arm, s, lr)))
    b = flat(read_metrics(run_dir(vdir.parent, vdir.name, p, arm, s, lr, base=vdir / "repeat" / f"init{p}")))
    if len(a) < updates or len(b) < updates:
        return None
    gap = max(abs(x.get("heldout_success_rate", 0.0) - y.get("heldout_success_rate", 0.0)) for x, y in zip(a, b))
    first = next((x["update"] for x, y in zip(a, b) if x != y), -1)
    return gap, first


def publish(out: Path, dest: Path, updates: int | None = None, variant: str = "single", partial: bool = False) -> str:
    """Write ``dest/results.md``, ``curves.png``, ``summary.csv``, ``runs.tar.gz`` and ``provenance.json`` from
    the study's ``variant`` in ``out``. Refuses an unfinished grid unless ``partial``: a page is the whole study."""
    import csv

    out, dest = Path(out), Path(dest)
    vdir = out / variant
    if not (vdir / "grid.json").is_file():
        raise UsageError(f"{vdir} holds no {variant} study (no grid.json): run the study's command first")
    grid = json.loads((vdir / "grid.json").read_text())
    missing = missing_runs(vdir, grid)
    if missing and not partial:
        raise UsageError(f"{vdir}: {len(missing)} runs unfinished (first: {missing[0]}); re-run the study's "
                         "command to finish them before publishing")
    arms, chosen = grid["arms"], rates(grid)
    # a run still in flight is not on the page yet
    runs = {k: recs for k, recs in _runs(vdir, chosen).items() if len(recs) >= grid["updates"]}
    if not runs:
        raise FileNotFoundError(f"{vdir}: no finished runs")
    # before writing: the stamp names the tree as it was, and the command that makes this page from the runs
    facts = stamp(f"{PROG} study ccapo-textworld --out {out} --variant {variant} --no-run --publish {dest}",
                  packages=["textworld", "matplotlib"])
    task = {"max_steps": 20, **VARIANTS[variant]["task"]}
    rows = [{"initial_model": p, "arm": a, "seed": s, **run_scores(recs, task["max_steps"])}
            for (p, a, s), recs in sorted(runs.items())]
    dest.mkdir(parents=True, exist_ok=True)
    with (dest / "summary.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    command = ((vdir / "command.txt").read_text().strip() if (vdir / "command.txt").exists()
               else f"{PROG} study ccapo-textworld --out DIR --variant {variant}")
    rand = (json.loads((vdir / "random_policy.json").read_text()) if (vdir / "random_policy.json").exists()
            else random_policy(out, variant))
    lines = _page(rows, grid, variant, task, command.replace(str(out), "DIR") + f" --publish {dest.as_posix()}",
                  read_timings(vdir), repeat_spread(vdir, grid["updates"], chosen[REPEAT[1]]) if REPEAT[1] in chosen
                  else None, len(missing), rand, identical_pairs(runs, "ccapo", BASELINE),
                  sweep_scores(out, variant, arms),
                  default_rate_lines(vdir, chosen, grid["updates"], task["max_steps"]))
    (dest / "results.md").write_text("\n".join(lines) + "\n")
    arm_curves(runs, arms, [("heldout_success_rate", "held-out success (band: 10-90% of runs)", "success rate", 1),
                            ("mean_steps", "training episode length (5-update mean)", "commands per episode", 5)],
               dest / "curves.png")
    files = [f for f in sorted(vdir.glob("**/*")) if f.name in ("metrics.jsonl", "config.json")]
    write_archive(out, files + [vdir / n for n in ("grid.json", "timings.jsonl", "random_policy.json")
                                if (vdir / n).exists()],
                  dest / "runs.tar.gz")
    extra = {"study_command": command, "variant": variant, "elapsed_s": elapsed_s(read_timings(vdir)),
             "study_dir_layout": f"{variant}/init<I>/<arm>/lr<L>/<trainer arm>-s<S>/metrics.jsonl", "lr": chosen}
    (dest / "provenance.json").write_text(json.dumps({**facts, **extra}, indent=1) + "\n")
    return f"wrote {dest / 'results.md'} ({len(rows)} runs)"


def _page(rows: list[dict], grid: dict, variant: str, task: dict, command: str, timings: list[dict],
          repeat: tuple[float, int] | None, n_missing: int, rand: dict, same: tuple[int, int],
          sweep: an.Sweep, default_rate: list[str]) -> list[str]:

    arms, base, chosen = grid["arms"], BASELINE, rates(grid)
    scores = {key: {(r["initial_model"], r["arm"], r["seed"]): r[key] for r in rows}
              for key in ("heldout", "heldout_mean", "heldout_final", "train_steps")}
    pts = sorted({r["initial_model"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})
    title = {"single": "single-room games", "multiroom": "six-room games"}[variant] + \
        f" ({task['max_steps']}-command horizon)" + (", each arm at its best learning rate" if sweep else "")
    lines = [f"# CCAPO v4.1 on TextWorld, {title}: CCAPO, GRPO and GiGPO, paired over seeds and initial models", "",
             "```", command, "```", ""]
    if n_missing:
        lines += [f"**Partial:** {n_missing} runs of the grid are unfinished; the numbers below are of the runs "
                  "that finished.", ""]
    ok = [t for t in timings if t.get("rc") == 0]
    if ok:
        span = elapsed_s(timings)
        bad = len(timings) - len(ok)
        lines += [f"The study ran {len(ok)} training runs to their end"
                  + (f" ({bad} interrupted attempt was resumed from its checkpoint)" if bad == 1 else
                     f" ({bad} interrupted attempts were resumed from their checkpoints)" if bad else "")
                  + f", {sum(t['wall_s'] for t in timings) / 3600:.1f} run-hours in all (each finished run "
                  f"{min(t['wall_s'] for t in ok):.0f}-{max(t['wall_s'] for t in ok):.0f} s of wall time with one torch "
                  "thread, on a machine shared with other jobs; a run paused from outside counts its pause)"
                  + (f", {span / 3600:.1f} hours from the first start to the last end (pauses between sessions "
                     "included)" if span else "")
                  + ". Re-running the command continues an interrupted study; finished runs are read, not rerun.", ""]
    lines += ["## Design", "",
              f"- **Grid.** {len(arms)} arms × {len(pts)} initial models (network seeds {', '.join(map(str, pts))}) × "
              f"{len(seeds)} RL seeds ({', '.join(map(str, seeds))}), {grid['updates']} updates each. Runs of the same "
              "initial model and RL seed start from the same weights, play the same training games per update and use "
              f"the same evaluation draws, so every arm is compared with `{base}` **in pairs**.",
              "- **Arms.** `ccapo`: macro + 0.5 × micro (CCAPO-FUSE-1, beta from CCAPO-DEFAULT-3); `grpo`: the same "
              "code with beta = 0 (CCAPO-MACRO-1 only); `gigpo-w0.5` and `gigpo-w1`: the macro advantage plus GiGPO's "
              "anchor-state step advantage at weight 0.5 (matched to CCAPO's micro weight) and 1 (the trainer's "
              "default, as on the earlier single-seed page).",
              f"- **Task.** `tw-cooking --recipe 1 --take 1 --go {task.get('go', 1)}`, at most {task['max_steps']} "
              f"commands per episode; 12 training games, {EVAL['heldout_games']} held-out games, "
              f"{EVAL['heldout_games'] * EVAL['eval_episodes']} held-out episodes every {EVAL['eval_every']} updates. "
              "Everything else, the learning rate aside, is the trainer's `Config` default. "
              "TextWorld's own walkthroughs of training games "
              f"0-{rand['games'] - 1} take {_span(rand['walkthrough_steps'])} commands; "
              f"a uniform random policy over the same choices wins {rand['success']:.1%} of {rand['episodes']} "
              f"episodes on them within {rand['max_steps']} commands (the cold start every arm begins from).",
              *lr_lines(sweep, chosen, variant),
              "- **Score of a run.** Held-out success, the **median over the evaluations in the last 20% of the "
              "updates** (the claims' metric), and the mean over all evaluations (the area under the held-out curve). "
              "The final evaluation is shown, never used for a claim.",
              "- **Intervals.** 95% percentile bootstrap of the mean, resampling initial models and then seeds within "
              f"each ({an.BOOTSTRAP:,} replicates). **Claims** are generated from the paired intervals: \"beats\" only "
              "when the interval excludes 0.", "",
              "## Results", "",
              *sweep_section(sweep, chosen),
              "| arm | lr | runs | held-out success, last 20% (mean, 95% CI) | mean over evaluations (95% CI) | "
              "final evaluation (mean) | collapsed runs |", "|---|---|---|---|---|---|---|"]
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        cells = []
        for key in ("heldout", "heldout_mean"):
            m, lo, hi = an.paired_bootstrap(an.by_model(scores[key], arm))
            cells.append(f"{m:.3f} [{lo:.3f}, {hi:.3f}]")
        final = [r["heldout_final"] for r in mine if not math.isnan(r["heldout_final"])]
        lines.append(f"| `{arm}` | {chosen[arm]:g} | {len(mine)} | {cells[0]} | {cells[1]} | "
                     f"{sum(final) / len(final) if final else math.nan:.3f} | "
                     f"{sum(r['collapsed'] for r in mine)} of {len(mine)} |")
    lines += ["", "![held-out success and episode length per arm](curves.png)", "",
              f"## Paired differences against `{base}`", ""]
    for arm in arms:
        if arm == base:
            continue
        for key, label in (("heldout", METRIC), ("heldout_mean", "held-out success (mean over evaluations)")):
            lines.append(f"- {an.paired_claim(arm, base, label, an.paired_differences(scores[key], arm, base))}.")
    if same[1]:
        lines += ["", f"In {same[0]} of {same[1]} pairs the `ccapo` and `{base}` runs are identical, record for record. "
                  "CCAPO's micro stream is inert until a training episode wins: V-bar is written by successful "
                  "trajectories only (CCAPO-STDB-3), so every anchor is unseen and every raw micro advantage is 0 "
                  "(CCAPO-MICRO-2). Until its first win, `ccapo` is GRPO."]
    lines += ["", "Per initial model (mean over seeds of the paired last-20% difference):", ""]
    for arm in arms:
        if arm == base:
            continue
        d = an.paired_differences(scores["heldout"], arm, base)
        lines.append(f"- `{arm}` − `{base}`: " + ", ".join(
            f"model {p}: {sum(v.values()) / len(v):+.3f}" if v else f"model {p}: –" for p, v in sorted(d.items())))
    lines += ["", *default_rate, "## Collapsed runs and spikes", "",
              f"A run counts as **collapsed** to the short-episode failure when, over its last 20% of updates, its "
              f"training episodes win at most {COLLAPSE_SUCCESS:.0%} of the time and last at most "
              f"{COLLAPSE_STEPS_SHARE:.0%} of the horizon ({COLLAPSE_STEPS_SHARE * task['max_steps']:g} commands): "
              "the time penalty ranks all-failure groups by length and the policy learns to lose fast. Collapsed and "
              "diverged runs stay in every table and interval.", ""]
    col = [r for r in rows if r["collapsed"] or r["diverged"]]
    lines += [f"- `{r['arm']}`, initial model {r['initial_model']}, seed {r['seed']}: training success "
              f"{r['train_success']:.2f}, {r['train_steps']:.1f} commands per episode, held-out {r['heldout']:.2f}"
              + (" (diverged: NaN loss)" if r["diverged"] else "") for r in col] or ["- None."]
    for key, what in SPIKES.items():
        lines += ["", *spike_table(rows, arms, key, what)]
    lines += ["", "## Reproducing", ""]
    if repeat is None:
        lines.append("The repeated run has not finished, so this page does not state the run-to-run spread.")
    else:
        gap, first = repeat
        p, arm, s = REPEAT
        lines.append(f"`{arm}`, initial model {p}, seed {s} ran twice from the same command on this machine: "
                     + ("the two logs are identical, record for record." if first < 0 else
                        f"the logs first differ at update {first} (float noise in the sampling), and their held-out "
                        f"success differs by up to {gap:.3f} at one evaluation. A re-run reproduces the intervals, "
                        "not each run."))
    lines += ["", "Every run's per-update log is in `runs.tar.gz`; `summary.csv` has each run's scores."]
    return lines
