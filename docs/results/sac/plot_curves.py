"""Plot a SAC run's learning curves: ``python docs/results/sac/plot_curves.py RUN/metrics.jsonl OUT.png``."""
from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(metrics: str, out: str) -> None:
    recs = [json.loads(ln) for ln in open(metrics, encoding="utf-8") if ln.strip()]
    ev = [r for r in recs if "top1_hit" in r]
    tr = [r for r in recs if "critic_loss" in r]
    fig, ax = plt.subplots(2, 2, figsize=(11, 7.5))
    x = [r["update"] for r in ev]
    a = ax[0, 0]
    for key, col in (("top1_hit", "C0"), ("top3_hit", "C1")):
        a.plot(x, [100 * r[key] for r in ev], color=col, marker="o", ms=3, label=f"{key} (policy)")
        a.axhline(100 * ev[-1][f"baseline_{key}"], color=col, ls="--", lw=1, label=f"{key} (unigram baseline)")
    a.set(title="held-out next-character hits", xlabel="update", ylabel="%")
    a.legend(fontsize=8)
    a = ax[0, 1]
    a.plot(x, [100 * r["coverage"] for r in ev], color="C2", marker="o", ms=3, label="policy (greedy writing)")
    a.axhline(100 * ev[-1]["baseline_coverage"], color="C2", ls="--", lw=1, label="unigram baseline")
    a.set(title="held-out 4-gram coverage of free writing", xlabel="update", ylabel="%")
    a.legend(fontsize=8)
    a = ax[1, 0]
    u = [r["update"] for r in tr]
    a.plot(u, [r["critic_loss"] for r in tr], lw=0.6, color="C3", label="critic Huber loss")
    a.plot(u, [r["bc_loss"] for r in tr], lw=0.6, color="C4", label="BC loss")
    a.set(title="losses", xlabel="update", yscale="log")
    a.legend(fontsize=8)
    a = ax[1, 1]
    a.plot(u, [r["entropy"] for r in tr], lw=0.6, color="C5", label="H(pi) (nats)")
    a.plot(u, [r["target_entropy"] for r in tr], lw=1, color="C5", ls="--", label="H_tgt = kappa log|A|")
    b = a.twinx()
    b.plot(u, [r["alpha"] for r in tr], color="C6", label="alpha")
    b.plot(u, [r["teacher_ratio"] for r in tr], color="C7", label="teacher ratio")
    a.set(title="entropy, alpha, DAgger ratio", xlabel="update")
    a.legend(fontsize=8, loc="lower left")
    b.legend(fontsize=8, loc="upper right")
    mins = ev[-1].get("minutes", float("nan"))
    fig.suptitle(f"discrete SAC on the char-level POMDP (People's Daily 1998-01), {x[-1]} updates, {mins:.1f} CPU min")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
