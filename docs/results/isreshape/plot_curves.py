"""Plot the IS-Reshape token-bandit runs: reward and drift per update, three losses, seed spread shaded.

    python docs/results/isreshape/plot_curves.py --train --seeds 0,1,2   # train (about 1 CPU minute per seed), then plot
    python docs/results/isreshape/plot_curves.py --runs DIR              # plot runs made by the commands below

Each seed's runs come from ``rlconform train isreshape --loss v4,doc,ppo --updates 150 --seed S --out DIR/seedS``
(one directory per loss under it). The script copies every ``metrics.jsonl`` and ``config.json`` to
``runs/<loss>/seed<S>/`` beside this file, draws ``reward_vs_update.png`` and writes ``provenance.json``.
The uniform-policy and optimal rewards are computed here from the bandit's success table (rebuilt from the
run's ``env_seed`` the way the trainer documents it), not read from the runs.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "tools"))
from ppo_learning_curves import SEED_COLORS, copy_runs, hline, legend_below, nanmean, plt, read_jsonl, save, seed_band, write_stamp  # noqa: E402

LOSSES = {"v4": "v4 (ISR-LOSS-1)", "ppo": "PPO-clip, ε = 0.2", "doc": "the document's §9 code"}
UPDATES = 150


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
    legend_below(fig, (ax, ax2), ncol=3)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--runs", default=None, help="directory holding seed<S>/<loss>/ runs (default: train into /tmp)")
    p.add_argument("--train", action="store_true", help="run the training commands first")
    p.add_argument("--out", default=str(HERE), help="where the PNG, runs/ and provenance.json go")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    src = Path(args.runs or "/tmp/rlconform_isreshape_runs")
    if args.train:
        for s in seeds:
            subprocess.run(train_command(s, src), check=True)
    if args.runs or args.train:
        copy_runs({loss: {s: src / f"seed{s}" / loss for s in seeds} for loss in LOSSES}, out / "runs")
    runs = {loss: [read_jsonl(out / "runs" / loss / f"seed{s}" / "metrics.jsonl") for s in seeds] for loss in LOSSES}
    import json

    config = json.loads((out / "runs" / "v4" / f"seed{seeds[0]}" / "config.json").read_text())
    config = config.get("config", config)
    uniform, best = bandit_baselines(config)
    plot(runs, uniform, best, out / "reward_vs_update.png")
    write_stamp(out, ["python", "docs/results/isreshape/plot_curves.py", *(argv if argv is not None else sys.argv[1:])],
                packages=("matplotlib",),
                extra={"regenerate": f"python docs/results/isreshape/plot_curves.py --train --seeds {args.seeds}",
                       "train_commands": [" ".join(train_command(s, Path("RUNS"))) for s in seeds],
                       "uniform_reward": uniform, "optimal_reward": best})
    for loss in LOSSES:
        finals = [r[-1]["mean_reward"] for r in runs[loss]]
        print(f"{loss}: final reward {nanmean(finals):.3f} ({min(finals):.3f}-{max(finals):.3f})")
    print(f"uniform {uniform:.3f}, optimal {best:.3f}; wrote {out / 'reward_vs_update.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
