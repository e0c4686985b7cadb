"""The IS-Reshape LM study: every arm x 5 RL seeds x 3 initial models, at each arm's best learning rate.

Two phases, one command (``python -m tools.experiments study isreshape-lm --out DIR``):

1. **Sweep.** Each arm at every learning rate of ``LRS``, on a separate initial model (pre-train seed
   ``SWEEP_PRETRAIN``) and ``SWEEP_SEEDS`` RL seeds, so the selection never sees the runs it is judged on.
   The best learning rate per arm is the one with the highest windowed held-out accuracy.
2. **Main.** Each arm at its chosen rate, on ``PRETRAIN_SEEDS`` x ``SEEDS``. Runs of the same
   (initial model, RL seed) share prompts and sampling draws across arms, so arms are compared in pairs.

Layout: ``DIR/pt<P>/lr<L>/<arm>/seed<S>/metrics.jsonl`` with each root's initial model in ``DIR/pt<P>/lr<L>/init``.
"""
from __future__ import annotations

import json
from pathlib import Path

from reference_impl.isreshape.lm.trainer import LmConfig, init_path
from rlconform.provenance import stamp

from tools.experiments import analysis as an
from tools.experiments.analysis import read_metrics, windowed
from tools.experiments.grid import Job, packer, read_timings, require_finished, run_grid, write_archive
from tools.experiments.grid import flags as _flags
from tools.experiments.plots import arm_curves
from tools.experiments.study import PROG

ARMS = ("v4", "ppo", "sapo", "is", "sft")
BASELINE = "ppo"  # the clipped objective every reshaped loss is set against
LRS = (3e-5, 1e-4, 3e-4, 1e-3)  # a best rate at an edge of the grid would call for a wider one
SWEEP_PRETRAIN, SWEEP_SEEDS = 100, (0, 1)
PRETRAIN_SEEDS, SEEDS = (0, 1, 2), (0, 1, 2, 3, 4)
UPDATES = 150
# the task and model of the published configuration (docs/results/isreshape/lm)
TASK = {"max_operand": 14, "pretrain_steps": 300}
# model sizes: the published tiny Llama (132k parameters, CPU) and a larger one for a GPU (4.2M parameters)
VARIANTS = {"tiny": {}, "large": {"hidden": 256, "layers": 4, "heads": 8}}


def default_updates(variant: str) -> int:
    return UPDATES  # every model size runs the same budget


def root(out: Path, pretrain: int, lr: float) -> Path:
    return Path(out) / f"pt{pretrain}" / f"lr{lr:g}"


def job(out: Path, arm: str, pretrain: int, lr: float, seed: int, updates: int = UPDATES, *,
        device: str = "cpu", variant: str = "tiny") -> Job:
    r = root(out, pretrain, lr)
    argv = ("--arms", arm, "--seed", str(seed), "--pretrain-seed", str(pretrain), "--lr", f"{lr:g}",
            "--updates", str(updates), "--resume", "--out", str(r), "--device", device, "--threads", "1",
            "--checkpoint-every", "50", *_flags(TASK), *_flags(VARIANTS[variant]))
    return Job(key=(f"pt{pretrain}", f"lr{lr:g}", arm, f"seed{seed}"), trainer="isreshape-lm", argv=argv,
               run_dir=r / arm / f"seed{seed}", updates=updates)


def sweep_scores(out: Path, arms, lrs, pretrain: int, seeds, key: str = "heldout_acc") -> an.Sweep:
    """Each sweep run's windowed ``key``, by arm and learning rate (rates never run left out)."""
    return {arm: {lr: [windowed(read_metrics(root(out, pretrain, lr) / arm / f"seed{s}"), key) for s in seeds]
                  for lr in lrs if root(out, pretrain, lr).exists()} for arm in arms}


def choose_lr(out: Path, arms, lrs, pretrain: int, seeds, key: str = "heldout_acc") -> dict[str, float]:
    """Per arm, the learning rate with the best mean windowed ``key`` over the sweep's runs (ties: the smaller rate)."""
    return an.choose_rates(sweep_scores(out, arms, lrs, pretrain, seeds, key))


def prepare_inits(out: Path, pairs, variant: str = "tiny") -> None:
    """Pre-train each initial model once, before parallel runs could race to build it; every learning-rate
    root of one pre-train seed gets a copy of the same files, so arms at different rates start identical."""
    import shutil

    first: dict[int, Path] = {}
    for pretrain, lr in pairs:
        dest = root(out, pretrain, lr) / "init"
        if pretrain in first and not dest.exists():
            shutil.copytree(first[pretrain], dest)
        cfg = LmConfig(pretrain_seed=pretrain, lr=lr, **TASK, **VARIANTS[variant])
        first.setdefault(pretrain, Path(init_path(cfg, root(out, pretrain, lr))))


def run(out: Path, *, parallel: int, updates: int = UPDATES, device: str = "cpu", variant: str = "tiny",
        chosen: dict[str, float] | None = None, arms=ARMS, seeds=SEEDS, pretrains=PRETRAIN_SEEDS,
        progress: Path | None = None, echo=print) -> dict[str, float]:
    """The sweep (unless ``chosen`` gives each arm's rate), then the main grid; returns the rates used
    (also written to ``DIR/chosen_lr.json``). ``progress``: an archive re-packed as each run ends (``grid.pack``)."""
    out = Path(out)
    after = packer(out, updates, progress)
    out.mkdir(parents=True, exist_ok=True)
    kw = {"device": device, "variant": variant}
    if chosen is None:
        prepare_inits(out, [(SWEEP_PRETRAIN, lr) for lr in LRS], variant)
        echo(f"sweep: {len(arms)} arms x {len(LRS)} learning rates x {len(SWEEP_SEEDS)} seeds on initial model "
             f"{SWEEP_PRETRAIN}")
        sweep = [job(out, a, SWEEP_PRETRAIN, lr, s, updates, **kw) for lr in LRS for s in SWEEP_SEEDS for a in arms]
        run_grid(sweep, out, parallel=parallel, echo=echo, after=after)
        require_finished(sweep, "sweep")  # a rate is never chosen from part of its runs
        chosen = choose_lr(out, arms, LRS, SWEEP_PRETRAIN, SWEEP_SEEDS)
    chosen = {a: chosen[a] for a in arms}
    (out / "chosen_lr.json").write_text(json.dumps(chosen, indent=1) + "\n")
    echo("learning rates: " + ", ".join(f"{a} {lr:g}" for a, lr in chosen.items()))
    prepare_inits(out, sorted({(p, lr) for p in pretrains for lr in chosen.values()}), variant)
    echo(f"main: {len(arms)} arms x {len(pretrains)} initial models x {len(seeds)} seeds")
    run_grid([job(out, a, p, chosen[a], s, updates, **kw) for p in pretrains for s in seeds for a in arms],
             out, parallel=parallel, echo=echo, after=after)
    return chosen


# ----------------------------------------------------------------------------- the page
def _runs(out: Path, chosen: dict[str, float]) -> dict[tuple[int, str, int], list[dict]]:
    """(initial model, arm, seed) -> metric records of the main grid found in ``out`` (the sweep's model excluded)."""

    runs = {}
    for pt_dir in sorted(Path(out).glob("pt*")):
        p = int(pt_dir.name[2:])
        if p == SWEEP_PRETRAIN:
            continue
        for arm, lr in chosen.items():
            for run_dir in sorted((root(out, p, lr) / arm).glob("seed*")):
                recs = read_metrics(run_dir)
                if recs:
                    runs[(p, arm, int(run_dir.name[4:]))] = sorted(recs, key=lambda r: r["update"])
    return runs


def _sweep_table(out: Path, arms) -> list[str]:
    scores = sweep_scores(out, arms, LRS, SWEEP_PRETRAIN, SWEEP_SEEDS)
    return an.sweep_table(scores) if any(scores.values()) else []


def publish(out: Path, dest: Path, updates: int = UPDATES) -> str:
    """Write ``dest/results.md``, ``curves.png``, ``summary.csv``, ``runs.tar.gz`` and ``provenance.json``
    from the study in ``out``. Every claim on the page is generated from a paired interval."""
    import csv

    out, dest = Path(out), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    # before writing: the stamp names the tree as it was, and the command that makes this page from the runs
    facts = stamp(f"{PROG} study isreshape-lm --out {out} --no-run --publish {dest}"
                  + (f" --updates {updates}" if updates != UPDATES else ""), packages=["transformers", "matplotlib"])
    chosen = json.loads((out / "chosen_lr.json").read_text())
    arms = list(chosen)
    runs = _runs(out, chosen)
    if not runs:
        raise FileNotFoundError(f"{out}: no finished runs of the main grid")
    pts = sorted({k[0] for k in runs})
    seeds = sorted({k[2] for k in runs})
    cfg = json.loads((root(out, pts[0], chosen[arms[0]]) / arms[0] / f"seed{seeds[0]}" / "config.json").read_text())
    cfg = cfg.get("config", cfg)
    device = cfg.get("device", "cpu")
    command = ((out / "command.txt").read_text().strip() if (out / "command.txt").exists()
               else f"{PROG} study isreshape-lm --out DIR")

    # one row per run: windowed scores, the start, spikes with their update
    rows = []
    for (p, arm, s), recs in sorted(runs.items()):
        kl_peak, kl_at = an.peak(recs, "kl_ref")
        g_peak, g_at = an.peak(recs, "grad_norm")
        start_reward = an.windowed([r for r in recs if r["update"] < 10], "reward", window=1.0)
        row = {"initial_model": p, "arm": arm, "seed": s, "lr": chosen[arm], "updates": recs[-1]["update"] + 1,
               "heldout_init": recs[0].get("heldout_acc_init", float("nan")),
               "heldout": an.windowed(recs, "heldout_acc"), "reward_start": start_reward,
               "reward": an.windowed(recs, "reward"), "kl_ref": an.windowed(recs, "kl_ref"),
               "kl_ref_peak": kl_peak, "kl_ref_peak_update": kl_at, "grad_norm_peak": g_peak,
               "grad_norm_peak_update": g_at}
        row["collapsed"] = bool(row["reward"] != row["reward"] or row["reward"] < start_reward - 0.1)
        rows.append(row)
    with (dest / "summary.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    by = {(r["initial_model"], r["arm"], r["seed"]): r for r in rows}

    def two_level(arm, key):
        groups = {p: {s: by[(p, arm, s)][key] for s in seeds if (p, arm, s) in by} for p in pts}
        return an.paired_bootstrap(groups)  # a level, not a difference: the same resampling

    def paired(arm, key):
        diffs = {p: {s: by[(p, arm, s)][key] - by[(p, BASELINE, s)][key] for s in seeds
                     if (p, arm, s) in by and (p, BASELINE, s) in by} for p in pts}
        return an.paired_bootstrap(diffs)

    metrics = [("heldout", "held-out greedy accuracy"), ("reward", "batch reward"), ("kl_ref", "KL(π‖ref), k3")]
    rates = ("each arm at its best learning rate" if _sweep_table(out, arms)
             else f"every arm at lr {chosen[arms[0]]:g}" if len(set(chosen.values())) == 1
             else "learning rates given per arm")
    lines = [f"# IS Reshape v4 on a causal language model ({'larger model, ' if cfg.get('hidden', 64) > 64 else ''}"
             f"{device.upper() if device != 'cpu' else 'CPU'}, {rates})", "",
             "```", command.replace(str(out), "DIR") + f" --publish {dest.as_posix()}", "```", ""]
    timings = read_timings(out)
    if timings:
        cpu_s = sum(t["wall_s"] for t in timings if t.get("rc") == 0)
        phases = " (the sweep and the main grid)" if _sweep_table(out, arms) else ""
        lines += [f"The study ran {len(timings)} training runs{phases}, {cpu_s / 60:.0f} run-minutes in all, "
                  f"in parallel processes with one torch thread each (each run {min(t['wall_s'] for t in timings):.0f}-"
                  f"{max(t['wall_s'] for t in timings):.0f} s of wall time). Re-running the command continues an "
                  "interrupted study; finished runs are read, not rerun.", ""]
    lines += ["## Design", "",
              f"- **Grid.** {len(arms)} arms × {len(pts)} initial models (pre-train seeds {', '.join(map(str, pts))}) × "
              f"{len(seeds)} RL seeds, {updates} updates each. Runs with the same initial model and RL seed draw the "
              "same prompts and sampling noise, so each arm is compared with the baseline "
              f"`{BASELINE}` **in pairs**.",
              f"- **Model.** A {cfg.get('layers', 2)}-layer Llama, hidden {cfg.get('hidden', 64)}, "
              f"{cfg.get('heads', 4)} heads ({'4.2M' if cfg.get('hidden', 64) > 64 else '132k'} parameters), pre-trained {cfg.get('pretrain_steps', 300)} steps on the demonstrations; "
              f"addition with operands up to {cfg.get('max_operand', 14)}; {cfg.get('batch_prompts')} prompts × "
              f"{cfg.get('group_size')} responses per update; the behaviour policy lags {cfg.get('behaviour_lag')} "
              "updates and samples in bfloat16 (see the trainer's docstring for the whole setup).",
              "- **Score of a run.** The median over the last 20% of its updates (held-out accuracy: the evaluations "
              "in that window), never one end-of-run value.",
              "- **Intervals.** 95% percentile bootstrap of the mean, resampling initial models and then seeds within "
              f"each ({an.BOOTSTRAP:,} replicates): the spread between initial models counts as uncertainty.",
              "- **Claims.** Generated from the paired intervals: \"beats\" only when the interval excludes 0; "
              "otherwise the page says the study cannot tell the two apart.", ""]
    sweep = _sweep_table(out, arms)
    if sweep:
        edge = an.at_edge({a: chosen[a] for a in arms}, LRS)
        lines += ["## Learning rate, chosen per arm", "",
                  f"Each arm ran at every rate on a separate initial model (pre-train seed {SWEEP_PRETRAIN}, seeds "
                  f"{', '.join(map(str, SWEEP_SEEDS))}); the rate with the best windowed held-out accuracy was kept. "
                  "The selection never sees the runs it is judged on.", "", *sweep, "",
                  "Chosen: " + ", ".join(f"`{a}` {chosen[a]:g}" for a in arms) + "."]
        if edge:
            lines += ["", f"The rate of {', '.join(f'`{a}`' for a in edge)} is at an edge of the grid, so a wider "
                      "grid could still move it. Larger rates raise the batch reward and lower the held-out accuracy "
                      "(over-fitting the 180 training problems)."]
        lines += [""]
    else:
        lines += ["## Learning rate", "", "No sweep in this study: each arm runs at the rate given with `--lr-from` "
                  "(" + ", ".join(f"`{a}` {chosen[a]:g}" for a in arms) + ").", ""]
    lines += ["## Results", "", "Initial model (before RL): held-out accuracy "
              + ", ".join(f"{by[(p, arms[0], seeds[0])]['heldout_init']:.3f}" for p in pts if (p, arms[0], seeds[0]) in by)
              + " for pre-train seeds " + ", ".join(map(str, pts)) + ".", "",
              "| arm | lr | runs | " + " | ".join(f"{label} (mean, 95% CI)" for _, label in metrics) + " | collapsed |",
              "|---|---|---|" + "---|" * len(metrics) + "---|"]
    for arm in arms:
        n = sum(1 for k in by if k[1] == arm)
        cells = []
        for key, _ in metrics:
            m, lo, hi = two_level(arm, key)
            cells.append(f"{m:.3f} [{lo:.3f}, {hi:.3f}]")
        col = sum(1 for r in rows if r["arm"] == arm and r["collapsed"])
        lines.append(f"| `{arm}` | {chosen[arm]:g} | {n} | " + " | ".join(cells) + f" | {col} |")
    lines += ["", "![reward and held-out accuracy per arm](curves.png)", "",
              f"## Paired differences against `{BASELINE}`", ""]
    for arm in arms:
        if arm == BASELINE:
            continue
        for key, label in metrics[:2]:
            m, lo, hi = paired(arm, key)
            lines.append(f"- {an.claim(arm, BASELINE, label, m, lo, hi)}.")
    per_model = ["", "Per initial model (mean over seeds of the paired held-out difference):", ""]
    for arm in arms:
        if arm == BASELINE:
            continue
        parts = []
        for p in pts:
            d = [by[(p, arm, s)]["heldout"] - by[(p, BASELINE, s)]["heldout"] for s in seeds
                 if (p, arm, s) in by and (p, BASELINE, s) in by]
            parts.append(f"model {p}: {sum(d) / len(d):+.3f}" if d else f"model {p}: –")
        per_model.append(f"- `{arm}` − `{BASELINE}`: " + ", ".join(parts))
    lines += per_model
    collapsed = [r for r in rows if r["collapsed"]]
    lines += ["", "## Collapsed runs and spikes", "",
              "A run counts as collapsed when its windowed batch reward ends more than 0.1 below its first 10 "
              "updates' (or is NaN). Collapsed runs stay in every table and interval."
              + (" None collapsed." if not collapsed else ""), ""]
    for r in collapsed:
        lines.append(f"- `{r['arm']}`, initial model {r['initial_model']}, seed {r['seed']}: reward "
                     f"{r['reward_start']:.3f} → {r['reward']:.3f}")
    lines += ["", "The largest spike of each arm, with the update where it happened:", "",
              "| arm | KL(π‖ref) peak | at update (run) | windowed KL | grad-norm peak | at update (run) |",
              "|---|---|---|---|---|---|"]
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        k = max(mine, key=lambda r: r["kl_ref_peak"])
        g = max(mine, key=lambda r: r["grad_norm_peak"])
        med = sorted(r["kl_ref"] for r in mine)[len(mine) // 2]
        lines.append(f"| `{arm}` | {k['kl_ref_peak']:.3g} | {k['kl_ref_peak_update']} (model {k['initial_model']}, seed "
                     f"{k['seed']}) | {med:.3g} (median run) | {g['grad_norm_peak']:.3g} | {g['grad_norm_peak_update']} "
                     f"(model {g['initial_model']}, seed {g['seed']}) |")
    lines += ["", "## Reproducing", "",
              "The runs are deterministic on the CPU: a run re-run from the same commit reproduces its log bit for bit "
              "(resume included). On a GPU, sampling kernels are not bitwise deterministic, so a re-run reproduces the "
              "intervals, not each run. The raw logs of every run (one record per update) are in `runs.tar.gz`; "
              "`summary.csv` has each run's scores."]
    (dest / "results.md").write_text("\n".join(lines) + "\n")
    _plot(runs, arms, dest / "curves.png")
    _write_runs_archive(out, dest / "runs.tar.gz")
    extra = {"study_command": command, "study_dir_layout": "pt<P>/lr<L>/<arm>/seed<S>/metrics.jsonl", "device": device}
    if (out / "device.txt").exists():  # written beside a study that ran on another machine
        extra["device_name"] = (out / "device.txt").read_text().strip()
    (dest / "provenance.json").write_text(json.dumps({**facts, **extra}, indent=1) + "\n")
    return f"wrote {dest / 'results.md'} ({len(rows)} runs)"


def _write_runs_archive(out: Path, path: Path) -> None:
    """Every run's metrics.jsonl and config.json, with the study's chosen rates and timings."""
    files = [p for p in sorted(out.glob("pt*/lr*/*/seed*/*")) if p.name in ("metrics.jsonl", "config.json")]
    files += [out / n for n in ("chosen_lr.json", "timings.jsonl") if (out / n).exists()]
    write_archive(out, files, path)


def _plot(runs, arms, path: Path) -> None:

    arm_curves(runs, arms, [("reward", "batch reward (5-update mean; band: 10-90% of runs)", "reward", 5),
                            ("heldout_acc", "held-out greedy accuracy (band: 10-90% of runs)", "accuracy", 1)], path)
