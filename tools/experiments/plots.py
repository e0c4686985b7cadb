"""Per-arm learning curves of a study: the mean over runs with a 10-90% band, one panel per metric."""
from __future__ import annotations

from pathlib import Path

from tools.experiments.analysis import series


def arm_curves(runs: dict[tuple, list[dict]], arms, panels: list[tuple[str, str, str, int]], path: Path) -> None:
    """``runs[(initial model, arm, seed)]`` are metric records; each panel is (key, title, y label, k): the
    curve of ``key`` per arm, smoothed by a k-update trailing mean when k > 1 (a batch metric is noisy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for arm in arms:
        for ax, (key, _, _, k) in zip(axes[0], panels):
            curves = [dict(series(recs, key)) for (p, a, s), recs in runs.items() if a == arm]
            xs = sorted(set().union(*curves))
            if not xs:
                continue
            ys = np.array([[c.get(x, np.nan) for x in xs] for c in curves])
            if 1 < k <= len(xs):  # a curve shorter than the window is drawn as it is
                ys = np.array([np.convolve(y, np.ones(k) / k, mode="valid") for y in ys])
                xs = xs[k - 1:]
            mean = np.nanmean(ys, axis=0)
            lo, hi = np.nanpercentile(ys, 10, axis=0), np.nanpercentile(ys, 90, axis=0)
            (line,) = ax.plot(xs, mean, label=f"{arm} ({len(curves)} runs)")
            ax.fill_between(xs, lo, hi, alpha=0.15, color=line.get_color())
    for ax, (_, title, ylabel, _) in zip(axes[0], panels):
        ax.set(title=title, xlabel="update", ylabel=ylabel)
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
