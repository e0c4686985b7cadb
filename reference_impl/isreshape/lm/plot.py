"""Results of a multi-arm run: reward and held-out accuracy against update (seed spread shaded) and a table.

``python -m reference_impl.isreshape.lm.plot OUT [--threshold 0.5]`` reads ``OUT/<arm>/seed*/metrics.jsonl``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

SMOOTH = 5  # updates in the trailing moving average of the (noisy) batch reward


def load_runs(out: Path, arms: list[str]) -> dict[str, list[list[dict]]]:
    """arm -> one list of metric records per seed (records sorted by update)."""
    runs = {}
    for arm in arms:
        seeds = sorted((out / arm).glob("seed*/metrics.jsonl"))
        recs = [sorted((json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()), key=lambda r: r["update"])
                for p in seeds]
        if recs:
            runs[arm] = recs
    return runs


def smoothed(x: np.ndarray, k: int = SMOOTH) -> np.ndarray:
    """Trailing mean over the last k values (fewer at the start)."""
    c = np.cumsum(np.insert(x, 0, 0.0))
    idx = np.arange(1, len(x) + 1)
    lo = np.maximum(idx - k, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def series(recs: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [(r["update"], r[key]) for r in recs if key in r]
    if key == "heldout_acc" and recs and "heldout_acc_init" in recs[0]:
        pts = [(-1, recs[0]["heldout_acc_init"])] + pts  # accuracy before the first update
    u, v = zip(*pts) if pts else ((), ())
    return np.asarray(u, float) + 1, np.asarray(v, float)  # x = number of updates done


def updates_to(recs: list[dict], threshold: float) -> float:
    """First number of updates after which the smoothed batch reward reaches ``threshold`` (nan: never)."""
    u, v = series(recs, "reward")
    full = np.arange(len(v)) >= SMOOTH - 1  # only full windows: the first draws are too few to count
    hit = np.nonzero((smoothed(v) >= threshold) & full)[0]
    return float(u[hit[0]]) if len(hit) else float("nan")


def _fmt(xs: list[float], digits: int = 3) -> str:
    a = np.asarray(xs, float)
    if np.isnan(a).all():
        return "never"
    ok = a[~np.isnan(a)]
    never = f" ({int(np.isnan(a).sum())} never)" if np.isnan(a).any() else ""
    return f"{ok.mean():.{digits}f} ± {ok.std():.{digits}f}{never}"


def table(runs: dict[str, list[list[dict]]], threshold: float, last: int = 10) -> str:
    """Markdown table: mean ± population std over seeds of end-of-run numbers."""
    head = (f"| arm | seeds | batch reward (last {last} updates) | held-out greedy accuracy (end) | KL(pi‖ref) k3 (end) "
            f"| KL(mu‖pi) k1 (last {last}) | updates to smoothed reward ≥ {threshold} |\n|---|---|---|---|---|---|---|")
    rows = []
    for arm, seeds in runs.items():
        rew = [np.mean([r["reward"] for r in s[-last:]]) for s in seeds]
        acc = [series(s, "heldout_acc")[1][-1] for s in seeds]
        kl = [s[-1]["kl_ref"] for s in seeds]
        klmu = [np.mean([r["kl_mu_pi"] for r in s[-last:]]) for s in seeds]
        hit = [updates_to(s, threshold) for s in seeds]
        rows.append(f"| `{arm}` | {len(seeds)} | {_fmt(rew)} | {_fmt(acc)} | {_fmt(kl, 4)} | {_fmt(klmu, 4)} | {_fmt(hit, 1)} |")
    return head + "\n" + "\n".join(rows)


def plot(runs: dict[str, list[list[dict]]], png: Path, title: str) -> None:
    """Two panels (smoothed batch reward, held-out accuracy): mean over seeds, min-max band shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), dpi=120)
    for i, (arm, seeds) in enumerate(runs.items()):
        color = f"C{i}"
        for ax, key, smooth in ((axes[0], "reward", True), (axes[1], "heldout_acc", False)):
            curves = [series(s, key) for s in seeds]
            n = min(len(c[0]) for c in curves)
            x = curves[0][0][:n]
            ys = np.stack([smoothed(c[1][:n]) if smooth else c[1][:n] for c in curves])
            ax.plot(x, ys.mean(0), color=color, label=arm)
            ax.fill_between(x, ys.min(0), ys.max(0), color=color, alpha=0.18, linewidth=0)
    axes[0].set_ylabel(f"batch reward from mu ({SMOOTH}-update trailing mean)")
    axes[1].set_ylabel("held-out greedy exact-match accuracy")
    for ax in axes:
        ax.set_xlabel("updates")
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    n_seeds = min(len(s) for s in runs.values())
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(0.875, 0.5), frameon=False,
               title=f"arm\nline: mean of {n_seeds} seeds\nband: min-max")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 0.87, 1))
    fig.savefig(png, bbox_inches="tight")
    plt.close(fig)


def write_summary(out: Path, arms: list[str], threshold: float = 0.6) -> str:
    runs = load_runs(Path(out), arms)
    png = Path(out) / "reward_vs_update.png"
    plot(runs, png, "IS Reshape v4 and baselines on a tiny causal LM (addition, exact-match reward)")
    md = table(runs, threshold)
    (Path(out) / "summary.md").write_text(md + "\n")
    return md + f"\n\nplot: {png}"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m reference_impl.isreshape.lm.plot")
    p.add_argument("out")
    p.add_argument("--arms", default="v4,ppo,sapo,is,sft")
    p.add_argument("--threshold", type=float, default=0.6)
    a = p.parse_args(argv)
    print(write_summary(Path(a.out), a.arms.split(","), a.threshold))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
