"""Train, plot and tabulate the IS-Reshape token-bandit runs: four losses, ten seeds, claims from paired intervals.

    python -m tools.experiments.isreshape_curves --train     # train (about 6 CPU seconds per run), plot, fill the page
    python -m tools.experiments.isreshape_curves --runs DIR  # the same from runs made by the commands below

Each seed's runs come from ``rlconform train isreshape --loss v4,ppo-decoupled,ppo,doc --updates 150 --seed S
--out DIR/seedS`` (one directory per loss under it). Into ``--out`` (default docs/results/isreshape/) the script
copies every ``metrics.jsonl`` and ``config.json`` to ``runs/<loss>/seed<S>/``, draws ``reward_vs_update.png``, fills
the generated blocks of ``results.md`` and writes ``provenance.json``. The uniform-policy and optimal rewards are
computed here from the bandit's success table (rebuilt from the run's ``env_seed`` the way the trainer documents it),
not read from the runs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
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
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "results" / "isreshape"  # the page, its plot and runs

LOSSES = {"v4": "v4 (ISR-LOSS-1)", "ppo-decoupled": "decoupled PPO-clip around π_prox, ε = 0.2",
          "ppo": "PPO-clip against μ, ε = 0.2", "doc": "the document's §9 code"}
BASELINE = "ppo-decoupled"  # clipped around the policy being improved, importance-corrected from the stale mu
UPDATES = 150
TARGET = 0.9  # the reward whose first update measures speed
SEEDS = "0,1,2,3,4,5,6,7,8,9"


def train_command(seed: int, out: Path) -> list[str]:
    return ["rlconform", "train", "isreshape", "--loss", ",".join(LOSSES), "--updates", str(UPDATES),
            "--seed", str(seed), "--out", str(out / f"seed{seed}")]


def bandit_baselines(config: dict) -> tuple[float, float]:
    """(uniform policy's reward, optimal reward) of the success table p = sigmoid(sharpness · z)."""
    import torch

    g = torch.Generator().manual_seed(int(config["env_seed"]))
    z = torch.randn(int(config["contexts"]), int(config["tokens"]), generator=g, dtype=torch.float64)
    p = 1.0 / (1.0 + torch.exp(-float(config["reward_sharpness"]) * z))
    return float(p.mean()), float(p.max(dim=1).values.mean())


def first_reaching(records: list[dict], target: float = TARGET) -> int | None:
    """The first update whose exact reward is at least ``target`` (None: never within the run)."""
    return next((r["update"] for r in records if r["mean_reward"] >= target), None)


def run_row(records: list[dict]) -> dict:
    """One run's numbers: the windowed reward (the claims' metric), the curve at fixed updates, speed, drift."""
    from tools.experiments import analysis as an

    at = {r["update"] + 1: r["mean_reward"] for r in records}
    kl_peak, kl_at = an.peak(records, "kl")
    return {"reward": an.windowed(records, "mean_reward"), "at": [at.get(u, math.nan) for u in (10, 25, 50, UPDATES)],
            "t90": first_reaching(records), "kl": an.windowed(records, "kl"), "kl_peak": kl_peak, "kl_peak_update": kl_at,
            "grad_norm": an.windowed(records, "grad_norm")}


def table(rows: dict[str, dict[int, dict]]) -> str:
    lines = ["| loss | seeds | reward after 10 / 25 / 50 / 150 updates (mean) | reward, last 20% of updates "
             "(mean, min-max) | first update with reward >= 0.9 (median; never) | KL(μ‖π), last 20% (mean) |",
             "|---|---|---|---|---|---|"]
    for loss, label in LOSSES.items():
        rs = list(rows[loss].values())
        at = " / ".join(f"{nanmean(r['at'][i] for r in rs):.3f}" for i in range(4))
        w = [r["reward"] for r in rs]
        t = sorted(r["t90"] for r in rs if r["t90"] is not None)
        never = sum(r["t90"] is None for r in rs)
        speed = (f"{t[len(t) // 2] if len(t) % 2 else (t[len(t) // 2 - 1] + t[len(t) // 2]) / 2:g}" if t else "–") + \
            f"; {never} never"
        lines.append(f"| `{loss}`: {label} | {len(rs)} | {at} | {nanmean(w):.3f} ({min(w):.3f}-{max(w):.3f}) | {speed} "
                     f"| {nanmean(r['kl'] for r in rs):.3g} |")
    return "\n".join(lines)


def claims(rows: dict[str, dict[int, dict]]) -> str:
    """Paired comparisons over seeds (one initial model: the zero logits table) against each PPO, from intervals."""
    from tools.experiments import analysis as an

    lines = []
    for base in (BASELINE, "ppo"):
        for arm in ("v4", "ppo-decoupled"):
            if arm == base:
                continue
            seeds = sorted(set(rows[arm]) & set(rows[base]))
            d = {s: rows[arm][s]["reward"] - rows[base][s]["reward"] for s in seeds}
            lines.append(f"- {an.paired_claim(arm, base, 'the reward over the last 20% of updates', {0: d})}.")
            # updates to 0.9: a run that never gets there counts as UPDATES, so its difference is a bound
            cens = sum(rows[a][s]["t90"] is None for a in (arm, base) for s in seeds)
            t = {a: {s: rows[a][s]["t90"] if rows[a][s]["t90"] is not None else UPDATES for s in seeds} for a in (arm, base)}
            note = f" ({cens} runs never reached {TARGET}, counted as {UPDATES})" if cens else ""
            faster = an.paired_claim(arm, base, f"updates to reach reward {TARGET}",
                                     {0: {s: t[arm][s] - t[base][s] for s in seeds}}, higher_is_better=False)
            lines.append(f"- {faster}{note}.")
            g, glo, ghi = an.paired_bootstrap({0: {s: math.log(t[base][s] / t[arm][s]) for s in seeds}})
            lines.append(f"  - Speed-up of `{arm}` over `{base}` (geometric mean over seeds of the ratio of updates to "
                         f"{TARGET}): {math.exp(g):.2f}x, 95% interval [{math.exp(glo):.2f}x, {math.exp(ghi):.2f}x].")
    return "\n".join(lines)


def diagnostics(runs: dict[str, list[list[dict]]], seeds: list[int]) -> str:
    """v4's weight diagnostics at update 10; each loss's largest KL(mu || pi) and gradient norm, with its update."""
    v4 = [r[9] for r in runs["v4"] if len(r) > 9]
    parts = [f"{k} {nanmean(r[k] for r in v4):.3g}" for k in ("weight_mean", "weight_max", "ratio_mean", "gamma_mean")]
    lines = [f"- Diagnostics of v4 at update 10 (mean over {len(v4)} seeds): " + ", ".join(parts) + "."]
    from tools.experiments import analysis as an

    for loss in LOSSES:
        found = []
        for key, what in (("kl", "KL(μ‖π)"), ("grad_norm", "gradient norm")):
            peaks = [(an.peak(r, key), s) for s, r in zip(seeds, runs[loss])]
            (v, u), s = max(peaks, key=lambda p: p[0][0] if not math.isnan(p[0][0]) else -math.inf)
            found.append(f"largest {what} {v:.3g} at update {u} (seed {s})")
        lines.append(f"- `{loss}`: " + "; ".join(found) + ".")
    return "\n".join(lines)


def plot(runs: dict[str, list[list[dict]]], uniform: float, best: float, path: Path) -> None:
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for (loss, label), color in zip(LOSSES.items(), SEED_COLORS):
        seed_band(ax, runs[loss], "mean_reward", color, label)
        seed_band(ax2, runs[loss], "kl", color, label)
    hline(ax, uniform, f"uniform policy ({uniform:.3f})")
    hline(ax, best, f"optimal policy ({best:.3f})", ls=":")
    ax.set_ylabel("expected reward of π (success probability)")
    ax.set_title("reward (exact, no sampling noise)", fontsize=9)
    ax2.set_ylabel("KL(μ ‖ π) estimate, mean −log r (nats)")
    ax2.set_title("drift from the behaviour policy (ISR-METRIC-3)", fontsize=9)
    for a in (ax, ax2):
        a.set_xlabel("update")
    n = len(next(iter(runs.values())))
    fig.suptitle(f"IS Reshape v4 on an off-policy token bandit: mean of {n} seeds, min–max shaded", fontsize=10)
    fig.tight_layout()
    legend_below(fig, (ax, ax2), ncol=2)
    save(fig, path)


def train(seeds: list[int], src: Path) -> float:
    """Run the training commands one after another (one torch thread each); return their wall time in seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.time()
    for s in seeds:
        subprocess.run(runnable(train_command(s, src)), check=True, env=env, stdout=subprocess.DEVNULL)
    return time.time() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.experiments.isreshape_curves",
                                description=__doc__.strip().splitlines()[0])
    p.add_argument("--seeds", default=SEEDS)
    p.add_argument("--runs", default=None, help="directory holding seed<S>/<loss>/ runs (default: train into /tmp)")
    p.add_argument("--train", action="store_true", help="run the training commands first")
    p.add_argument("--out", default=str(DOCS), help="where the PNG, runs/ and provenance.json go")
    args = p.parse_args(argv)
    from rlconform.provenance import stamp

    # the stamp is taken before anything is written: it names the commit as it was, not a tree made dirty by this run
    command = ["python", "-m", "tools.experiments.isreshape_curves", *(sys.argv[1:] if argv is None else argv)]
    facts = stamp(command, packages=("matplotlib",))
    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    src = Path(args.runs or "/tmp/rlconform_isreshape_runs")
    stamp_extra = {}
    if args.train:
        stamp_extra["train_wall_s"] = round(train(seeds, src), 1)
    elif (out / "provenance.json").exists():  # a replot keeps the training time of the runs it plots
        old = json.loads((out / "provenance.json").read_text())
        stamp_extra = {k: old[k] for k in ("train_wall_s",) if k in old}
    if args.runs or args.train:
        copy_runs({loss: {s: src / f"seed{s}" / loss for s in seeds} for loss in LOSSES}, out / "runs")
    runs = {loss: [read_jsonl(out / "runs" / loss / f"seed{s}" / "metrics.jsonl") for s in seeds] for loss in LOSSES}
    config = json.loads((out / "runs" / "v4" / f"seed{seeds[0]}" / "config.json").read_text())
    config = config.get("config", config)
    uniform, best = bandit_baselines(config)
    plot(runs, uniform, best, out / "reward_vs_update.png")
    rows = {loss: {s: run_row(r) for s, r in zip(seeds, runs[loss])} for loss in LOSSES}
    page = out / "results.md"
    if page.exists():
        fill(page, "table", table(rows))
        fill(page, "claims", claims(rows))
        fill(page, "diagnostics", diagnostics(runs, seeds))
        wall = stamp_extra.get("train_wall_s")
        fill(page, "cost", f"{len(seeds)} seeds x {len(LOSSES)} losses, {len(seeds) * len(LOSSES)} runs"
             + (f", {wall:.0f} s of wall time in all, one after another with one torch thread each." if wall else "."))
    facts.update({"regenerate": f"python -m tools.experiments.isreshape_curves --train --seeds {args.seeds}",
                  "train_commands": [" ".join(train_command(s, Path("RUNS"))) for s in seeds],
                  "uniform_reward": uniform, "optimal_reward": best, **stamp_extra})
    (out / "provenance.json").write_text(json.dumps(facts, indent=1) + "\n", encoding="utf-8")
    print(table(rows), claims(rows), diagnostics(runs, seeds), sep="\n\n")
    print(f"uniform {uniform:.3f}, optimal {best:.3f}; wrote {out / 'reward_vs_update.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
