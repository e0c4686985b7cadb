"""Windowed metrics, paired bootstrap intervals, and claims no larger than the intervals.

- A run's score is a **windowed** metric: the median over the last ``WINDOW`` share of its logged
  values, never one end-of-run value.
- Arms are compared **in pairs**: runs that share an initial model and an RL seed (the same prompts and
  draws) give one difference each. The interval is a percentile bootstrap of the mean difference,
  resampling initial models and, within each, seeds (a two-level bootstrap: the spread between initial
  models is part of the uncertainty, not hidden by it).
- A claim "A beats B" is written only when the 95% interval excludes 0; otherwise the sentence says the
  study cannot tell them apart.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np

WINDOW = 0.2
BOOTSTRAP = 10_000


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def series(records: list[dict], key: str) -> list[tuple[int, float]]:
    """(update, value) for every record that logged ``key`` with a number."""
    return [(int(r["update"]), float(r[key])) for r in records
            if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]


def windowed(records: list[dict], key: str, window: float = WINDOW) -> float:
    """Median of ``key`` over the last ``window`` share of the run's updates (NaN when nothing was logged).

    The window is in updates, not in records, so a metric logged every 5th update uses the same span
    of training as one logged every update. A NaN value inside the window is kept, and makes the median
    NaN: a diverged run is shown, not dropped.
    """
    pts = series(records, key)
    if not pts:
        return math.nan
    last = max(int(r["update"]) for r in records)
    start = last + 1 - max(1, math.ceil(window * (last + 1)))
    vals = [v for u, v in pts if u >= start]
    if not vals:
        vals = [pts[-1][1]]
    if any(math.isnan(v) for v in vals):
        return math.nan
    return float(statistics.median(vals))


def peak(records: list[dict], key: str) -> tuple[float, int]:
    """The largest value of ``key`` and the update where it happened (spikes are reported with their update)."""
    pts = series(records, key)
    if not pts:
        return math.nan, -1
    u, v = max(pts, key=lambda p: (p[1] if not math.isnan(p[1]) else math.inf))
    return v, u


def paired_bootstrap(diffs: dict[int, dict[int, float]], *, reps: int = BOOTSTRAP, seed: int = 0,
                     level: float = 0.95) -> tuple[float, float, float]:
    """Mean paired difference and its percentile interval.

    ``diffs[initial_model][rl_seed]`` is one paired difference. Each replicate draws initial models with
    replacement, then seeds with replacement within each drawn model.
    """
    groups = [np.array([v for v in g.values() if not math.isnan(v)]) for g in diffs.values()]
    groups = [g for g in groups if g.size]
    if not groups:
        return math.nan, math.nan, math.nan
    mean = float(np.mean(np.concatenate(groups)))
    rng = np.random.default_rng(seed)
    stats = np.empty(reps)
    for i in range(reps):
        picked = rng.integers(len(groups), size=len(groups))
        stats[i] = np.mean(np.concatenate([groups[j][rng.integers(groups[j].size, size=groups[j].size)]
                                           for j in picked]))
    lo, hi = np.quantile(stats, [(1 - level) / 2, 1 - (1 - level) / 2])
    return mean, float(lo), float(hi)


def claim(a: str, b: str, metric: str, mean: float, lo: float, hi: float, *, higher_is_better: bool = True) -> str:
    """The sentence the interval allows, and no more."""
    if any(math.isnan(x) for x in (mean, lo, hi)):
        return f"no paired runs to compare `{a}` with `{b}` on {metric}"
    span = f"(paired difference {mean:+.3f}, 95% interval [{lo:+.3f}, {hi:+.3f}])"
    if lo > 0 or hi < 0:
        better = (lo > 0) == higher_is_better
        return f"`{a}` {'beats' if better else 'is worse than'} `{b}` on {metric} {span}"
    return f"this study cannot tell `{a}` and `{b}` apart on {metric} {span}"


Scores = dict  # (initial model, arm, RL seed) -> one run's score


def by_model(scores: Scores, arm: str) -> dict[int, dict[int, float]]:
    """One arm's scores as ``{initial model: {seed: score}}``, the shape :func:`paired_bootstrap` resamples
    (a level is bootstrapped the same two-level way as a difference)."""
    out: dict[int, dict[int, float]] = {}
    for (p, a, s), v in scores.items():
        if a == arm:
            out.setdefault(p, {})[s] = v
    return out


def paired_differences(scores: Scores, arm: str, baseline: str) -> dict[int, dict[int, float]]:
    """``{initial model: {seed: score(arm) - score(baseline)}}`` over the (model, seed) pairs where both ran:
    an unpaired run counts in its arm's level, never in a difference."""
    mine, base = by_model(scores, arm), by_model(scores, baseline)
    return {p: {s: v - base[p][s] for s, v in seeds.items() if s in base.get(p, {})} for p, seeds in mine.items()}


MIN_PAIRS = 5  # fewer paired runs than this make a bootstrap interval too narrow to carry a claim


def paired_claim(a: str, b: str, metric: str, diffs: dict[int, dict[int, float]], *,
                 higher_is_better: bool = True) -> str:
    """:func:`claim` from the paired interval of ``diffs``; with fewer than ``MIN_PAIRS`` pairs, the sentence
    says so instead (a percentile bootstrap of one or two pairs is a point, not an interval)."""
    n = sum(1 for g in diffs.values() for v in g.values() if not math.isnan(v))
    if n < MIN_PAIRS:
        return f"too few paired runs ({n}, fewer than {MIN_PAIRS}) to compare `{a}` with `{b}` on {metric}"
    return claim(a, b, metric, *paired_bootstrap(diffs), higher_is_better=higher_is_better)


# ----------------------------------------------------------------------------- learning-rate sweeps
Sweep = dict  # arm -> {learning rate: [windowed held-out score of each sweep run]}


def _mean(vals) -> float:
    vals = [v for v in vals if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def choose_rates(sweep: Sweep) -> dict[str, float]:
    """Per arm, the rate whose sweep runs have the best mean score (a NaN run left out, a rate with none never
    chosen over one with a score; ties: the smaller rate, the less aggressive choice)."""
    return {arm: max(sorted(by_lr), key=lambda lr: -math.inf if math.isnan(_mean(by_lr[lr])) else _mean(by_lr[lr]))
            for arm, by_lr in sweep.items()}


def sweep_table(sweep: Sweep) -> list[str]:
    """The sweep as a markdown table, arm x rate, each cell the mean score of its runs ('–' where none)."""
    lrs = sorted({lr for by_lr in sweep.values() for lr in by_lr})
    rows = ["| arm | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |", "|---|" + "---|" * len(lrs)]
    for arm, by_lr in sweep.items():
        cells = [_mean(by_lr.get(lr, [])) for lr in lrs]
        rows.append(f"| `{arm}` | " + " | ".join("–" if math.isnan(c) else f"{c:.3f}" for c in cells) + " |")
    return rows


def at_edge(chosen: dict[str, float], lrs) -> list[str]:
    """The arms whose chosen rate is the smallest or largest of the grid: a wider grid could still move it."""
    return [a for a, lr in chosen.items() if lr in (min(lrs), max(lrs))]
