"""Held-out curves and the results table of a `rlconform train ccapo-textworld` directory.

    python -m reference_impl.ccapo.textworld.plot RUNS_DIR --out docs/results/ccapo/textworld

Writes heldout.png (mean over seeds, min..max across seeds shaded), train.png, table.md (final
held-out evaluation, mean +- std over seeds, population std) and raw.jsonl (every record, tagged
with its run).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

METRICS = [("success_rate", "success rate"), ("mean_steps", "steps per episode"),
           ("score_frac", "score / max_score"), ("stdb_hit_rate", "STDB hit rate")]


def load(runs_dir: Path) -> dict[str, dict[int, list[dict]]]:
    """arm -> seed -> records, from <runs_dir>/<arm>-s<seed>/metrics.jsonl."""
    out: dict[str, dict[int, list[dict]]] = {}
    for f in sorted(runs_dir.glob("*-s*/metrics.jsonl")):
        arm, _, seed = f.parent.name.rpartition("-s")
        out.setdefault(arm, {})[int(seed)] = [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()]
    return out


def curves(seeds: dict[int, list[dict]], split: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    """Updates (x) and a [seeds, points] array, cut to the points every seed has."""
    per = [[(r["update"], r[key]) for r in recs if r["split"] == split] for recs in seeds.values()]
    n = min(len(p) for p in per)
    return np.array([u for u, _ in per[0][:n]]) + 1, np.array([[v for _, v in p[:n]] for p in per])


def plot(runs: dict, split: str, path: Path, smooth: int = 1) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METRICS), figsize=(4.2 * len(METRICS), 3.4))
    for arm, seeds in runs.items():
        for ax, (key, title) in zip(axes, METRICS):
            x, y = curves(seeds, split, key)
            if y.shape[1] < smooth or y.shape[1] == 0:
                continue
            if smooth > 1:  # moving average along updates, per seed
                k = np.ones(smooth) / smooth
                y = np.array([np.convolve(r, k, mode="valid") for r in y])
                x = x[smooth - 1:]
            line, = ax.plot(x, y.mean(0), marker="o" if split == "heldout" else None, label=f"{arm} ({len(y)} seeds)")
            ax.fill_between(x, y.min(0), y.max(0), color=line.get_color(), alpha=0.2)
            ax.set_xlabel("policy update")
            ax.set_ylabel(title)
            ax.set_title(f"{split}: {title}")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=max(1, len(labels)), bbox_to_anchor=(0.5, 1.02), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def table(runs: dict) -> str:
    rows = ["| arm | seeds | " + " | ".join(t for _, t in METRICS) + " |", "|---" * (len(METRICS) + 2) + "|"]
    for arm, seeds in runs.items():
        cells = []
        for key, _ in METRICS:
            final = np.array([[r[key] for r in recs if r["split"] == "heldout"][-1] for recs in seeds.values()])
            cells.append(f"{final.mean():.2f} ± {final.std():.2f}")
        rows.append(f"| {arm} | {len(seeds)} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", type=Path)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    runs = load(a.runs)
    plot(runs, "heldout", a.out / "heldout.png")
    plot(runs, "train", a.out / "train.png", smooth=5)
    (a.out / "table.md").write_text(table(runs))
    with open(a.out / "raw.jsonl", "w") as f:
        for arm, seeds in runs.items():
            for seed, recs in seeds.items():
                for r in recs:
                    f.write(json.dumps({"run": f"{arm}-s{seed}", "seed": seed, **r}) + "\n")
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
