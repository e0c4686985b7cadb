"""Plot the CCAPO key-and-chest runs: success and episode length per update, CCAPO vs macro-only, seed spread shaded.

    python -m tools.experiments.ccapo_curves --train --seeds 0,1,2   # 12 runs of about 1 CPU minute, then plot
    python -m tools.experiments.ccapo_curves --runs DIR              # plot runs made by the commands below

Runs: ``rlconform train ccapo --out DIR/<setting>/<variant>/seed<S> --seed S [--beta 0] [--layout-prior 0.8]``
for the settings ``uniform`` (key and chest anywhere) and ``prior`` (``--layout-prior 0.8``) and the variants
``ccapo`` (β = 0.5, the default) and ``macro`` (β = 0). Into ``--out`` (default docs/results/ccapo/) the script
copies each run's ``metrics.jsonl`` and ``config.json`` to ``runs/<setting>/<variant>/seed<S>/``, draws
``ccapo_training.png`` and ``ccapo_training_prior.png``, fills the tables of ``results.md`` (between its
``plot_curves`` markers) and writes ``provenance.json``.
Random play is measured here on fresh layouts of the same generator; the optimum is the shortest episode.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from tools.experiments.ppo_curves import (
    SEED_COLORS,
    copy_runs,
    fill,
    hline,
    legend_below,
    nanmean,
    plt,
    read_jsonl,
    runnable,
    save,
    seed_band,
    write_stamp,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "results" / "ccapo"  # the page, its plots and runs

SETTINGS = {"uniform": ("uniform layouts", []), "prior": ("layouts with a shared regularity (prior 0.8)",
                                                          ["--layout-prior", "0.8"])}
VARIANTS = {"ccapo": ("CCAPO, β = 0.5", []), "macro": ("macro only, β = 0", ["--beta", "0"])}
PNG = {"uniform": "ccapo_training.png", "prior": "ccapo_training_prior.png"}


def train_command(setting: str, variant: str, seed: int, root: Path) -> list[str]:
    return ["rlconform", "train", "ccapo", "--out", str(root / setting / variant / f"seed{seed}"), "--seed", str(seed),
            *VARIANTS[variant][1], *SETTINGS[setting][1]]


def random_play(prior: float, episodes: int = 2000, max_steps: int = 20, seed: int = 0) -> tuple[float, float]:
    """(success rate, mean episode length) of uniformly random admissible commands on fresh layouts."""
    import numpy as np

    from reference_impl.ccapo.env import KeyChestEnv, make_layout

    rng = np.random.default_rng(seed)
    wins, steps = [], []
    for _ in range(episodes):
        env = KeyChestEnv(make_layout(rng, prior=prior), max_steps)
        while not env.done:
            env.step(int(rng.choice(np.flatnonzero(env.legal()))))
        wins.append(float(env.success))
        steps.append(env.t)
    return statistics.fmean(wins), statistics.fmean(steps)


def plot(setting: str, runs: dict[str, list[list[dict]]], rand: tuple[float, float], path: Path) -> None:
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for (variant, (label, _)), color in zip(VARIANTS.items(), SEED_COLORS):
        seed_band(ax, runs[variant], "success_rate", color, label + " (5-update trailing mean)", k=5)
        seed_band(ax2, runs[variant], "mean_steps", color, label + " (5-update trailing mean)", k=5)
    shortest = nanmean(r.get("shortest_steps") for rs in runs.values() for run in rs for r in run)
    hline(ax, rand[0], "random play (measured)")
    hline(ax, 1.0, "best possible", ls=":")
    hline(ax2, rand[1], "random play (measured)")
    hline(ax2, shortest, "best possible (shortest episode, mean over sampled layouts)", ls=":")
    ax.set_ylabel("success rate (share of episodes)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("episodes that open the chest", fontsize=9)
    ax2.set_ylabel("episode length (steps; horizon 20)")
    ax2.set_title("steps per episode", fontsize=9)
    for a in (ax, ax2):
        a.set_xlabel("update (8 layouts × 8 trajectories)")
    n = len(next(iter(runs.values())))
    fig.suptitle(f"CCAPO v4.1 reference trainer, {SETTINGS[setting][0]}: mean of {n} seeds, min–max shaded",
                 fontsize=10)
    fig.tight_layout()
    legend_below(fig, (ax, ax2), ncol=2)
    save(fig, path)


def table(by_variant: dict[str, list[list[dict]]], seeds: list[int], rand: tuple[float, float]) -> str:
    """The figures the page quotes, from the raw records: success early and late, per seed, steps, R_τ."""
    lines = [f"Random play: success {rand[0]:.3f}, {rand[1]:.1f} steps per episode.", "",
             "| | success, updates 0–9 | success, last 20 updates | per seed (" + " / ".join(map(str, seeds))
             + ") | mean steps, last 20 | R_τ, last 20 |", "|---|---|---|---|---|---|"]
    for variant, rs in by_variant.items():
        first = nanmean(r["success_rate"] for run in rs for r in run[:10])
        last = [nanmean(r["success_rate"] for r in run[-20:]) for run in rs]
        steps = nanmean(r["mean_steps"] for run in rs for r in run[-20:])
        rt = nanmean(r.get("r_tau_mean") for run in rs for r in run[-20:])
        lines.append(f"| {VARIANTS[variant][0]} | {first:.3f} | {statistics.fmean(last):.3f} | "
                     + " / ".join(f"{x:.3f}" for x in last) + f" | {steps:.1f} | {rt:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.experiments.ccapo_curves",
                                description=__doc__.strip().splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--runs", default=None, help="directory holding <setting>/<variant>/seed<S>/ runs")
    p.add_argument("--train", action="store_true", help="run the training commands first")
    p.add_argument("--out", default=str(DOCS),
                   help="where the PNGs, runs/ and provenance.json go (results.md there gets the tables)")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    src = Path(args.runs or "/tmp/rlconform_ccapo_runs")
    if args.train:
        for setting in SETTINGS:
            for s in seeds:
                for variant in VARIANTS:
                    subprocess.run(runnable(train_command(setting, variant, s, src)), check=True)
    if args.runs or args.train:
        for setting in SETTINGS:
            copy_runs({v: {s: src / setting / v / f"seed{s}" for s in seeds} for v in VARIANTS}, out / "runs" / setting)
    runs = {st: {v: [read_jsonl(out / "runs" / st / v / f"seed{s}" / "metrics.jsonl") for s in seeds] for v in VARIANTS}
            for st in SETTINGS}
    rand = {"uniform": random_play(0.0), "prior": random_play(0.8)}
    for setting in SETTINGS:
        plot(setting, runs[setting], rand[setting], out / PNG[setting])
    for setting in SETTINGS:
        fill(out / "results.md", f"table-{setting}", table(runs[setting], seeds, rand[setting]))
    write_stamp(out, ["python", "-m", "tools.experiments.ccapo_curves", *(sys.argv[1:] if argv is None else argv)],
                packages=("matplotlib",),
                extra={"regenerate": f"python -m tools.experiments.ccapo_curves --train --seeds {args.seeds}",
                       "train_commands": [" ".join(train_command(st, v, s, Path("RUNS")))
                                          for st in SETTINGS for s in seeds for v in VARIANTS],
                       "random_play": {k: {"success_rate": a, "mean_steps": b} for k, (a, b) in rand.items()}})
    for setting in SETTINGS:
        print(setting, table(runs[setting], seeds, rand[setting]), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
