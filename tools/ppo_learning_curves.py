"""Train the reference masked PPO (connect four vs random) and MAPPO (CoopGrid) briefly; plot and gate.

    python tools/ppo_learning_curves.py [--ppo-updates 120] [--mappo-updates 80] [--runs DIR] [--docs DIR]

Writes ``ppo_curves.png`` and ``mappo_curves.png`` (learning curve and the health SLOs of the seed's
§11 per update, SLO ranges shaded) and ``results.md`` to ``--docs`` (default docs/results/ppo), prints
the SLO figures as the gate clauses aggregate them and the verdict of each PPO gate clause.
Both runs take a few CPU minutes in total.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rlconform.gate import evaluate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SLO_PANELS = [  # metric, gate clause (its range is shaded), y label
    ("approx_kl", "PPO-SLO-1", "approx_kl"),
    ("clip_fraction", "PPO-SLO-2", "clip fraction"),
    ("ratio_mean", "PPO-SLO-3", "ratio mean"),
    ("entropy_ratio", "PPO-SLO-4", "entropy / log|A_legal|"),
]


SETUP = [
    "- **PPO** (`rlconform train ppo`, `reference_impl/ppo/trainer.py`): PettingZoo `connect_four_v3`, the learner",
    "  alternates seats against a uniformly random legal opponent; reward +1 win, -1 loss, 0 draw. `win_rate` is",
    "  the share of the update's finished training games (stochastic policy) the learner won.",
    "- **MAPPO** (`rlconform train mappo`, `reference_impl/ppo/mappo_trainer.py`): `CoopGridEnv` (our ParallelEnv),",
    "  2 agents must cover 2 targets together on a 5x5 grid with 4 wall cells; per-agent action masks; shared",
    "  actor, centralised critic on the global state. `return` is the team return per finished episode",
    "  (about -0.6 for random play, at most about +0.95), `cover_rate` the share of episodes that covered every target.",
    "- Both use the default config of their trainer (see each run's `config.json`); the SLO figures are the gate",
    "  clauses' own aggregates (`rlconform gate RUN/metrics.jsonl` prints the same table).",
]


def run_trainer(name: str, updates: int, out: Path, seed: int) -> tuple[list[dict], float]:
    """Train ``reference_impl.ppo.<name>`` for ``updates`` updates into a fresh ``out``; (records, seconds)."""
    import importlib
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    cli = importlib.import_module(f"reference_impl.ppo.{name}").cli
    t0 = time.time()
    if cli(["--updates", str(updates), "--out", str(out), "--seed", str(seed)]) != 0:
        raise SystemExit(f"{name} failed")
    records = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return records, time.time() - t0


def smooth(values: list[float], k: int = 5) -> list[float]:
    """Trailing mean over ``k`` updates, skipping NaN (updates where no episode ended)."""
    out = []
    for i in range(len(values)):
        win = [v for v in values[max(0, i - k + 1): i + 1] if not math.isnan(v)]
        out.append(statistics.fmean(win) if win else math.nan)
    return out


def plot(records: list[dict], gates: dict, title: str, curve: list[tuple[str, str]], path: Path) -> None:
    """One row for the learning curve(s), one panel per SLO metric with its gate range shaded."""
    x = [r["update"] for r in records]
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    ax = axes[0, 0]
    for key, label in curve:
        ys = [r[key] for r in records]
        ax.plot(x, ys, alpha=0.25)
        ax.plot(x, smooth(ys), label=f"{label} (5-update mean)")
    ax.set_title(title)
    ax.set_xlabel("update")
    ax.legend(fontsize=8)
    panels = [axes[0, 1], axes[0, 2], axes[1, 0], axes[1, 1]]
    for ax, (metric, clause, label) in zip(panels, SLO_PANELS):
        ax.plot(x, [r[metric] for r in records], lw=1)
        g = gates.get(clause)
        if g is not None:
            lo, hi = g["threshold"] if g["op"] == "in" else (0.0, g["threshold"])
            ax.axhspan(lo, hi, color="tab:green", alpha=0.12, label=f"{clause} {g['op']} {g['threshold']}")
            ax.legend(fontsize=8)
        ax.set_title(label)
        ax.set_xlabel("update")
    ax = axes[1, 2]
    ax.plot(x, [r["value_loss"] for r in records], lw=1, label="value loss")
    ax.plot(x, [r["epochs_run"] for r in records], lw=1, label="epochs run (KL guard)")
    ax.set_xlabel("update")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def first_last(records: list[dict], key: str, k: int = 10) -> tuple[float, float]:
    """Mean of ``key`` over the first and the last ``k`` updates (NaN-free)."""
    def m(rs):
        v = [r[key] for r in rs if not math.isnan(r[key])]
        return statistics.fmean(v) if v else math.nan
    return m(records[:k]), m(records[-k:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--ppo-updates", type=int, default=150)
    p.add_argument("--mappo-updates", type=int, default=80)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", default="/tmp/rlconform_ppo_curves", help="where the two run directories go")
    p.add_argument("--docs", default=str(ROOT / "docs" / "results" / "ppo"), help="where PNGs and results.md go")
    args = p.parse_args(argv)
    runs, docs = Path(args.runs), Path(args.docs)
    docs.mkdir(parents=True, exist_ok=True)
    from rlconform.spec import default_spec

    gates = {c.id: c.gate for c in default_spec().families["ppo"].clauses if c.kind == "gate"}
    lines = ["# Reference PPO / MAPPO: learning curves and health SLOs", "",
             f"Generated by `python tools/ppo_learning_curves.py --ppo-updates {args.ppo_updates} "
             f"--mappo-updates {args.mappo_updates} --seed {args.seed}` on a shared 2-core CPU.", "", *SETUP, ""]
    for name, updates, title, curve, headline in [
        ("trainer", args.ppo_updates, "masked PPO, connect four vs random", [("win_rate", "win rate")], "win_rate"),
        ("mappo_trainer", args.mappo_updates, "MAPPO, CoopGrid (2 agents)",
         [("return", "team return"), ("cover_rate", "all targets covered")], "return"),
    ]:
        records, seconds = run_trainer(name, updates, runs / name, args.seed)
        png = docs / ("ppo_curves.png" if name == "trainer" else "mappo_curves.png")
        plot(records, gates, title, curve, png)
        results = evaluate(records, "ppo")
        a, b = first_last(records, headline)
        head = f"{title}: {headline} {a:.3f} -> {b:.3f} (mean of first/last 10 updates), " \
               f"{len(records)} updates in {seconds / 60:.1f} min"
        print(head)
        lines += [f"## {title}", "", f"![{title}]({png.name})", "", f"- {head}"]
        for key, _ in curve:
            if key != headline:
                a2, b2 = first_last(records, key)
                lines.append(f"- {key}: {a2:.3f} -> {b2:.3f}")
                print(f"  {key}: {a2:.3f} -> {b2:.3f}")
        lines += ["", "| gate | metric (aggregate) | figure | needs | verdict |", "|---|---|---|---|---|"]
        for r in results:
            g = r.clause.gate
            fig = "-" if r.figure is None else f"{r.figure:.4g}"
            lines.append(f"| {r.clause.id} | {g['metric']} ({g.get('aggregate', 'last')}) | {fig} | "
                         f"{g['op']} {g['threshold']} | {r.verdict} |")
            print("  " + r.line)
        lines.append("")
    (docs / "results.md").write_text("\n".join(lines))
    print(f"wrote {docs / 'ppo_curves.png'}, {docs / 'mappo_curves.png'}, {docs / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
