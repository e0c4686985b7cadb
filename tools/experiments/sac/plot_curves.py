"""Plot the SAC suite: ``python -m tools.experiments.sac.plot_curves curves.jsonl ceiling.jsonl OUT.png``.

``curves.jsonl`` holds the records of every run of the suite, each tagged with ``run`` (``seed0``..,
``ablate_no_bc``..): evaluation records (held-out figures) and training records (losses, α, ...).
``ceiling.jsonl`` is the output of ``tools.experiments.sac.ngram_ceiling`` (count-model and real-text reference levels).

Top row: the four held-out figures the gates read, in percent, with the unigram baseline, the gate's
threshold (baseline + 10 points, or + 8 for consistency), uniform random play where it is defined,
and the count-model estimate of what the window allows. Bottom row: the training signals. Several
seeds: their mean as a line, min..max shaded; ablations (mean over their seeds) as dashed lines.
"""
from __future__ import annotations

import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from tools.experiments.sac import run_positional

ABLATION_STYLE = {"ablate_no_bc": ("C3", "no BC"), "ablate_no_topp": ("C2", "no Top-p (p = 1)"),
                  "ablate_fixed_alpha": ("C4", "fixed α")}
TOP = [("top1_hit", "held-out top-1 next-character hit", 10), ("top3_hit", "held-out top-3 next-character hit", 10),
       ("coverage", "4-gram coverage of greedy free writing", 10), ("consistency", "paragraph consistency", 8)]
YLABEL = {"top1_hit": "hits (% of 2048 held-out positions)", "top3_hit": "hits (% of 2048 held-out positions)",
          "coverage": "agent 4-grams found in the reference (%)", "consistency": "distinct lexicon word pairs (% of pairs)"}
BOTTOM = [("critic_loss", "critic Huber loss (TD part)", "Huber loss of the TD error (δ = 1, reward scale)"),
          ("entropy", "policy entropy H(π) and its target", "entropy (nats)"),
          ("alpha", "temperature α", "α (dimensionless)"),
          ("teacher_ratio", "DAgger teacher ratio", "teacher share of steps (fraction)")]


def _load(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def _series(recs: list[dict], key: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    by_run = defaultdict(list)
    for r in recs:
        if r.get(key) is not None:
            by_run[r["run"]].append((r["update"], r[key]))
    return {k: tuple(np.array(v, dtype=float).T) for k, v in by_run.items()}


def _seed_band(ax, series: dict, scale: float, label: str) -> None:
    seeds = [v for k, v in series.items() if k.startswith("seed")]
    if not seeds:
        return
    n = min(len(x) for x, _ in seeds)
    x = seeds[0][0][:n]
    ys = np.stack([y[:n] for _, y in seeds]) * scale
    ax.plot(x, ys.mean(0), color="C0", lw=1.6, label=f"{label} (mean of {len(seeds)} seeds)")
    if len(seeds) > 1:
        ax.fill_between(x, ys.min(0), ys.max(0), color="C0", alpha=0.25, lw=0, label="seed min..max")


def _ablations(ax, series: dict, scale: float) -> None:
    """Each ablation's mean over its seeds (runs ``ablate_<name>_seed<S>``), dashed."""
    for prefix, (color, name) in ABLATION_STYLE.items():
        runs = [v for k, v in series.items() if k.startswith(prefix + "_seed")]
        if runs:
            n = min(len(x) for x, _ in runs)
            y = np.stack([y[:n] for _, y in runs]).mean(0)
            ax.plot(runs[0][0][:n], y * scale, color=color, ls="--", lw=1.2,
                    label=f"ablation: {name} (mean of {len(runs)} seed{'s' if len(runs) > 1 else ''})")


def main(curves: str, ceiling: str, out: str) -> None:
    recs, ceil = _load(curves), _load(ceiling)
    ev = [r for r in recs if "top1_hit" in r]
    base = ev[0]
    count4 = next((c for c in ceil if c.get("window") == 4), None)
    fig, axes = plt.subplots(2, 4, figsize=(20, 9.5))
    for ax, (key, title, gain) in zip(axes[0], TOP):
        s = _series(ev, key)
        _seed_band(ax, s, 100, "SAC")
        _ablations(ax, s, 100)
        b = 100 * base[f"baseline_{key}"]
        ax.axhline(b, color="grey", ls="-", lw=1, label=f"unigram baseline ({b:.2f}%)")
        ax.axhline(b + gain, color="k", ls=":", lw=1.2, label=f"gate: baseline + {gain} points ({b + gain:.2f}%)")
        if count4 is not None and key in count4:
            c = 100 * count4[key]
            ax.axhline(c, color="C5", ls="-.", lw=1.2, label=f"count model, window 4 ({c:.2f}%)")
        if key in ("top1_hit", "top3_hit"):  # uniform play over the ~2000 legal characters
            k = 1 if key == "top1_hit" else 3
            ax.axhline(100 * k / 2000, color="C7", ls=(0, (1, 3)), lw=1, label=f"uniform random ({100 * k / 2000:.2f}%)")
        if key == "coverage":
            real = next((c for c in ceil if c.get("writer")), None)
            if real is not None:
                for k2, name, st in (("preceding_text", "real text before the passage", (0, (5, 2))),
                                     ("other_passage", "another real passage", (0, (2, 2)))):
                    ax.axhline(100 * real[k2], color="C8", ls=st, lw=1.2, label=f"{name} ({100 * real[k2]:.2f}%)")
        ax.set(title=title, xlabel="update (one env step of 256 passages + one gradient step)", ylabel=YLABEL[key])
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1, frameon=False)
    tr = [r for r in recs if "critic_loss" in r]
    for ax, (key, title, ylabel) in zip(axes[1], BOTTOM):
        s = _series(tr, key)
        _seed_band(ax, s, 1, key)
        _ablations(ax, s, 1)
        if key == "entropy":
            t = _series(tr, "target_entropy")
            x, y = next(iter(v for k, v in t.items() if k.startswith("seed")))
            ax.plot(x, y, color="k", ls=":", lw=1.2, label="target κ·log|A(s)| (seed 0)")
        ax.set(title=title, xlabel="update", ylabel=ylabel)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1, frameon=False)
    mins = max(r.get("minutes", 0) for r in ev)
    fig.suptitle(f"Discrete SAC on the char-level POMDP (People's Daily 1998-01, held-out later January); "
                 f"longest run {mins:.0f} wall-clock minutes on a shared 2-core CPU")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    run_positional(main, __doc__, 3)
