"""Train the reference masked PPO (connect four vs random) and MAPPO (CoopGrid) on several seeds; plot and gate.

    python -m tools.experiments.ppo_curves [--seeds 0,1,2] [--ppo-updates 150] [--mappo-updates 80] [--runs DIR]
                                           [--docs DIR]
    python -m tools.experiments.ppo_curves --replot            # redraw from the JSONL already in --docs/runs/

Writes to ``--docs`` (default docs/results/ppo): ``ppo_curves.png`` and ``mappo_curves.png`` (the learning
curves and the health SLOs of the seed's §11 per update: mean over seeds, min–max across seeds shaded, SLO
ranges and the random-play baseline drawn), ``runs/<trainer>/seed<S>/metrics.jsonl`` (the raw per-update
records), ``provenance.json`` (rlconform.provenance.stamp of this command) and ``results.md``. It prints
the SLO figures as the gate clauses aggregate them and the verdict of each PPO gate clause per seed.
Three seeds of both trainers take about three CPU minutes.

The band and legend helpers here are shared with the other results plots
(tools/experiments/isreshape_curves.py, tools/experiments/ccapo_curves.py).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]  # the repository
SEED_COLORS = ("#3949ab", "#e53935", "#43a047", "#fb8c00", "#8e24aa")


# ------------------------------------------------------------------------ shared plot helpers
def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]


def nanmean(values: Iterable[float]) -> float:
    v = [x for x in values if x is not None and not math.isnan(x)]
    return statistics.fmean(v) if v else math.nan


def smooth(values: Sequence[float], k: int = 5) -> list[float]:
    """Trailing mean over ``k`` updates, skipping NaN (updates where no episode ended)."""
    return [nanmean(values[max(0, i - k + 1): i + 1]) for i in range(len(values))]


def seed_band(ax, runs: Sequence[list[dict]], key: str, color: str, label: str, *, k: int = 1) -> list:
    """Mean over seeds of ``key`` (each seed smoothed over ``k`` updates) as a line, the min–max across
    seeds shaded; one seed draws a line only. Returns the legend handles."""
    n = min(len(r) for r in runs)
    x = [runs[0][i]["update"] for i in range(n)]
    per_seed = [smooth([r[i].get(key, math.nan) for i in range(n)], k) for r in runs]
    cols = list(zip(*per_seed))
    mean = [nanmean(c) for c in cols]
    handles = ax.plot(x, mean, color=color, lw=1.4, label=label)
    if len(runs) > 1:
        lo = [min((v for v in c if not math.isnan(v)), default=math.nan) for c in cols]
        hi = [max((v for v in c if not math.isnan(v)), default=math.nan) for c in cols]
        handles.append(ax.fill_between(x, lo, hi, color=color, alpha=0.18, lw=0,
                                       label=f"{label}: min–max of {len(runs)} seeds"))
    return handles


def hline(ax, y: float, label: str, color: str = "#616161", ls: str = "--"):
    return ax.axhline(y, color=color, ls=ls, lw=1, label=label)


def legend_below(fig, axes, ncol: int = 3) -> None:
    """One legend for the figure, under the panels (never over the data); duplicate labels merged."""
    seen: dict[str, object] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    fig.legend(list(seen.values()), list(seen), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol,
               fontsize=8, frameon=False)


def save(fig, path: Path) -> None:
    fig.savefig(path, dpi=90, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


def runnable(cmd: list[str]) -> list[str]:
    """A command written as the user types it (``rlconform train ...``), run by this interpreter: the
    ``rlconform`` on PATH may be another install, or none (a venv not activated)."""
    return [sys.executable, "-m", "rlconform.cli", *cmd[1:]] if cmd and cmd[0] == "rlconform" else cmd


def write_stamp(out_dir: Path, command: Sequence[str] | str, *, packages: Iterable[str] = (), extra: dict | None = None) -> dict:
    """``provenance.json`` beside the page: the site renders it under the page title."""
    from rlconform.provenance import stamp

    facts = stamp(command, packages=packages, extra=extra)
    (out_dir / "provenance.json").write_text(json.dumps(facts, indent=1) + "\n", encoding="utf-8")
    return facts


def fill(page: Path, name: str, body: str) -> None:
    """Replace the block between ``<!-- plot_curves:NAME -->`` and ``<!-- /plot_curves:NAME -->`` in ``page``."""
    start, end = f"<!-- plot_curves:{name} -->", f"<!-- /plot_curves:{name} -->"
    text = page.read_text(encoding="utf-8")
    if start not in text or end not in text:
        raise SystemExit(f"{page} has no {start} ... {end} block")
    head, rest = text.split(start, 1)
    # blank lines around the body: Markdown would read lines glued to the comment as raw HTML
    page.write_text(head + start + "\n\n" + body.strip() + "\n\n" + end + rest.split(end, 1)[1], encoding="utf-8")


def copy_runs(runs: dict[str, dict[int, Path]], dest: Path) -> None:
    """Each run's metrics.jsonl (and config.json) to ``dest/<name>/seed<S>/``, the raw data beside the plot."""
    for name, by_seed in runs.items():
        for seed, run in by_seed.items():
            d = dest / name / f"seed{seed}"
            d.mkdir(parents=True, exist_ok=True)
            for f in ("metrics.jsonl", "config.json"):
                if (run / f).is_file():
                    shutil.copyfile(run / f, d / f)


# ------------------------------------------------------------------------------- PPO / MAPPO
# metric, gate clause whose range is shaded (or None), y label with units
PANELS = {
    "approx_kl": ("PPO-SLO-1", "approx KL to π_old (nats)"),
    "clip_fraction": ("PPO-SLO-2", "clip fraction (share of samples)"),
    "ratio_mean": ("PPO-SLO-3", "mean ratio π/π_old"),
    "entropy_ratio": ("PPO-SLO-4", "entropy / log|A_legal|"),
    "log_prob_min": ("PPO-SLO-5", "min log π(a|s) in batch (nats)"),
    "value_loss": (None, "value loss (MSE, return²)"),
    "epochs_run": (None, "epochs run (KL guard; count)"),
}
TRAINERS = {  # run name: title, learning-curve metrics (one panel each), headline metric
    "trainer": ("masked PPO, connect four vs random", [("win_rate", "win rate (share of finished games)")], "win_rate"),
    "mappo_trainer": ("MAPPO, CoopGrid (2 agents)", [("return", "team return per episode"),
                                                     ("cover_rate", "all targets covered (share of episodes)")],
                      "return"),
}

SETUP = [
    "- **PPO** (`rlconform train ppo`, `reference_impl/ppo/trainer.py`): PettingZoo `connect_four_v3`, the learner",
    "  alternates seats against a uniformly random legal opponent; reward +1 win, -1 loss, 0 draw. `win_rate` is",
    "  the share of the update's finished training games (stochastic policy) the learner won.",
    "- **MAPPO** (`rlconform train mappo`, `reference_impl/ppo/mappo_trainer.py`): `CoopGridEnv` (our ParallelEnv),",
    "  2 agents must cover 2 targets together on a 5x5 grid with 4 wall cells; per-agent action masks; shared",
    "  actor, centralised critic on the global state. `return` is the team return per finished episode (at most",
    "  the cover bonus, 1.0), `cover_rate` the share of episodes that covered every target.",
    "- Both use the default config of their trainer (see each run's `config.json`); the SLO figures are the gate",
    "  clauses' own aggregates (`rlconform gate RUN/metrics.jsonl` prints the same table).",
    "- **Baselines** (dashed grey), measured by this script with uniformly random legal play, independently of",
    "  the trainers: the random learner's win rate against the random opponent (seats alternating), and the",
    "  random team's return and cover rate on CoopGrid. Dotted: the best value the quantity can take.",
]


def random_connect_four(games: int = 400, seed: int = 0) -> float:
    """Win rate of a uniformly random legal player against another, alternating seats (PettingZoo)."""
    from pettingzoo.classic import connect_four_v3

    rng = random.Random(seed)
    env = connect_four_v3.env()
    wins = 0
    for g in range(games):
        env.reset(seed=seed + g)
        learner = env.possible_agents[g % 2]
        for agent in env.agent_iter():
            obs, reward, term, trunc, _ = env.last()
            if term or trunc:
                if agent == learner and reward > 0:
                    wins += 1
                env.step(None)
                continue
            legal = [i for i, ok in enumerate(obs["action_mask"]) if ok]
            env.step(rng.choice(legal))
    env.close()
    return wins / games


def random_coop_grid(episodes: int = 400, seed: int = 0) -> tuple[float, float]:
    """(mean team return, cover rate) of uniformly random legal actions on the default CoopGridEnv."""
    import numpy as np

    from reference_impl.ppo.envs.coop_grid import CoopGridEnv

    rng = np.random.default_rng(seed)
    env = CoopGridEnv()
    returns, covers = [], []
    for e in range(episodes):
        env.reset(seed=seed + e)
        total, covered = 0.0, False
        while True:
            acts = {a: int(rng.choice(np.flatnonzero(env.action_mask(i)))) for i, a in enumerate(env.agents)}
            _, rew, term, trunc, _ = env.step(acts)
            total += next(iter(rew.values()))
            if any(term.values()) or any(trunc.values()):
                covered = any(term.values())
                break
        returns.append(total)
        covers.append(float(covered))
    return statistics.fmean(returns), statistics.fmean(covers)


def gate_ranges(gates: dict, clause: str | None) -> tuple[float, float] | None:
    g = gates.get(clause) if clause else None
    if g is None:
        return None
    if g["op"] == "in":
        return tuple(g["threshold"])
    return None


def plot_trainer(runs: list[list[dict]], gates: dict, name: str, baselines: dict[str, tuple[float, str]],
                 best: dict[str, tuple[float, str]], path: Path) -> None:
    """3×3 panels, one quantity each: the learning curve(s), then each SLO metric and the diagnostics."""
    title, curves, _ = TRAINERS[name]
    metrics = [(k, None, lab) for k, lab in curves] + [(k, *PANELS[k]) for k in PANELS]
    fig, grid = plt.subplots(3, 3, figsize=(13, 9.5))
    axes = list(grid.flat)
    for ax, (key, clause, label) in zip(axes, metrics):
        smoothing = 5 if (key, None, label) in [(k, None, lab) for k, lab in curves] else 1
        seed_band(ax, runs, key, SEED_COLORS[0],
                  "mean over seeds" + (" (5-update trailing mean)" if smoothing > 1 else ""), k=smoothing)
        rng = gate_ranges(gates, clause)
        if rng is not None:
            ax.axhspan(*rng, color="tab:green", alpha=0.12, label="SLO range of the gate clause")
        g = gates.get(clause) if clause else None
        if g is not None and g["op"] != "in":
            hline(ax, g["threshold"], "SLO threshold of the gate clause", color="tab:green", ls="-.")
        if key in baselines:
            hline(ax, baselines[key][0], "random play (measured)")
        if key in best:
            hline(ax, best[key][0], best[key][1], ls=":")
        ax.set_title(label + (f"  [{clause}]" if clause else ""), fontsize=9)
        ax.set_ylabel(label, fontsize=8)
        ax.set_xlabel("update")
    for ax in axes[len(metrics):]:
        ax.set_visible(False)
    fig.suptitle(f"{title}: {len(runs)} seed(s)", fontsize=11)
    fig.tight_layout()
    legend_below(fig, axes[:len(metrics)], ncol=3)
    save(fig, path)


def first_last(records: list[dict], key: str, k: int = 10) -> tuple[float, float]:
    """Mean of ``key`` over the first and the last ``k`` updates (NaN-free)."""
    return nanmean(r[key] for r in records[:k]), nanmean(r[key] for r in records[-k:])


def run_trainer(name: str, updates: int, out: Path, seed: int) -> float:
    """Train ``reference_impl.ppo.<name>`` for ``updates`` updates into a fresh ``out``; seconds taken."""
    import importlib

    shutil.rmtree(out, ignore_errors=True)
    cli = importlib.import_module(f"reference_impl.ppo.{name}").cli
    t0 = time.time()
    if cli(["--updates", str(updates), "--out", str(out), "--seed", str(seed)]) != 0:
        raise SystemExit(f"{name} seed {seed} failed")
    return time.time() - t0


def report(name: str, runs: list[list[dict]], seeds: list[int], minutes: float | None, gates_fn: Callable) -> list[str]:
    title, curves, headline = TRAINERS[name]
    png = "ppo_curves.png" if name == "trainer" else "mappo_curves.png"
    lines = [f"## {title}", "", f"![{title}: learning curve and health SLOs, {len(runs)} seeds]({png})", "",
             f'<p class="caption">{title}. Solid: mean over seeds {", ".join(map(str, seeds))}; shaded: the '
             "min–max across seeds; green: the SLO range of the gate clause named in the panel title; dashed grey: "
             "uniformly random play, measured; dotted: the best possible value (for the team return, its upper bound).</p>", ""]
    for key, _ in curves:
        fl = [first_last(r, key) for r in runs]
        per = " / ".join(f"{a:.3f} → {b:.3f}" for a, b in fl)
        lines.append(f"- {key} (mean of the first / last 10 updates), per seed: {per}")
    if minutes is not None:
        lines.append(f"- {len(runs[0])} updates per seed, {minutes:.1f} min per seed on average")
    lines += ["", "| gate | metric (aggregate) | needs | " + " | ".join(f"seed {s}" for s in seeds) + " |",
              "|---|---|---|" + "---|" * len(seeds)]
    per_seed = [gates_fn(r) for r in runs]
    for rows in zip(*per_seed):
        g = rows[0].clause.gate
        cells = [("-" if r.figure is None else f"{r.figure:.4g}") + f" {r.verdict}" for r in rows]
        lines.append(f"| {rows[0].clause.id} | {g['metric']} ({g.get('aggregate', 'last')}) | {g['op']} {g['threshold']} | "
                     + " | ".join(cells) + " |")
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    from rlconform.spec.gates import evaluate
    from rlconform.spec import default_spec

    p = argparse.ArgumentParser(prog="python -m tools.experiments.ppo_curves",
                                description=__doc__.strip().splitlines()[0])
    p.add_argument("--ppo-updates", type=int, default=150)
    p.add_argument("--mappo-updates", type=int, default=80)
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one run of each trainer per seed")
    p.add_argument("--runs", default="/tmp/rlconform_ppo_curves", help="where the run directories go")
    p.add_argument("--docs", default=str(ROOT / "docs" / "results" / "ppo"), help="where PNGs, JSONL and results.md go")
    p.add_argument("--replot", action="store_true", help="do not train: redraw from --docs/runs/")
    p.add_argument("--trainers", default=",".join(TRAINERS), help="which trainers to train (default: both)")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    runs_dir, docs = Path(args.runs), Path(args.docs)
    docs.mkdir(parents=True, exist_ok=True)
    gates = {c.id: c.gate for c in default_spec().families["ppo"].clauses if c.kind == "gate"}
    updates = {"trainer": args.ppo_updates, "mappo_trainer": args.mappo_updates}
    minutes: dict[str, float | None] = {}
    if not args.replot:
        for name in args.trainers.split(","):
            secs = [run_trainer(name, updates[name], runs_dir / name / f"seed{s}", s) for s in seeds]
            minutes[name] = statistics.fmean(secs) / 60
        # every finished run under --runs (a trainer trained by an earlier call included)
        copy_runs({n: {s: runs_dir / n / f"seed{s}" for s in seeds if (runs_dir / n / f"seed{s}" / "metrics.jsonl").is_file()}
                   for n in TRAINERS}, docs / "runs")
    win = random_connect_four()
    ret, cover = random_coop_grid()
    baselines = {"trainer": {"win_rate": (win, "random")}, "mappo_trainer": {"return": (ret, "random"),
                                                                             "cover_rate": (cover, "random")}}
    best = {"trainer": {"win_rate": (1.0, "best possible")},
            "mappo_trainer": {"return": (1.0, "upper bound (the cover bonus)"), "cover_rate": (1.0, "best possible")}}
    cmd = ["python", "-m", "tools.experiments.ppo_curves", "--seeds", args.seeds,
           "--ppo-updates", str(args.ppo_updates), "--mappo-updates", str(args.mappo_updates)]
    write_stamp(docs, ["python", "-m", "tools.experiments.ppo_curves", *(sys.argv[1:] if argv is None else argv)],
                packages=("pettingzoo", "matplotlib"),
                extra={"regenerate": " ".join(cmd), "baselines": {"connect_four_random_win_rate": win, "coop_grid_random_return": ret,
                                     "coop_grid_random_cover_rate": cover}})
    lines = ["# Reference PPO / MAPPO: learning curves and health SLOs", "",
             f"Generated by `{' '.join(cmd)}` on a shared 2-core CPU (`--replot` redraws from the stored runs); "
             "the raw per-update records of every run are in `runs/<trainer>/seed<S>/metrics.jsonl` beside this page.",
             "", *SETUP, "",
             f"Measured baselines: random play wins {win:.3f} of connect-four games against the random opponent; "
             f"a random CoopGrid team returns {ret:.3f} per episode and covers every target in {cover:.3f} of them.", ""]
    for name, (title, curves, headline) in TRAINERS.items():
        runs = [read_jsonl(docs / "runs" / name / f"seed{s}" / "metrics.jsonl") for s in seeds]
        png = docs / ("ppo_curves.png" if name == "trainer" else "mappo_curves.png")
        plot_trainer(runs, gates, name, baselines[name], best[name], png)
        lines += report(name, runs, seeds, minutes.get(name), lambda r: evaluate(r, "ppo"))
        for s, r in zip(seeds, runs):
            for res in evaluate(r, "ppo"):
                print(f"{name} seed {s}: " + res.line)
    (docs / "results.md").write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {docs}/ppo_curves.png, mappo_curves.png, results.md, provenance.json, runs/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
