"""The IS-Reshape LM study: every arm x 5 RL seeds x 3 initial models, at each arm's best learning rate.

Two phases, one command (``rlconform study isreshape-lm --out DIR``):

1. **Sweep.** Each arm at every learning rate of ``LRS``, on a separate initial model (pre-train seed
   ``SWEEP_PRETRAIN``) and ``SWEEP_SEEDS`` RL seeds, so the selection never sees the runs it is judged on.
   The best learning rate per arm is the one with the highest windowed held-out accuracy.
2. **Main.** Each arm at its chosen rate, on ``PRETRAIN_SEEDS`` x ``SEEDS``. Runs of the same
   (initial model, RL seed) share prompts and sampling draws across arms, so arms are compared in pairs.

Layout: ``DIR/pt<P>/lr<L>/<arm>/seed<S>/metrics.jsonl`` with each root's initial model in ``DIR/pt<P>/lr<L>/init``.
"""
from __future__ import annotations

import json
from pathlib import Path

from rlconform.study.grid import Job, run_grid

ARMS = ("v4", "ppo", "sapo", "is", "sft")
BASELINE = "ppo"  # the clipped objective every reshaped loss is set against
LRS = (1e-4, 3e-4, 1e-3)
SWEEP_PRETRAIN, SWEEP_SEEDS = 100, (0, 1)
PRETRAIN_SEEDS, SEEDS = (0, 1, 2), (0, 1, 2, 3, 4)
UPDATES = 150
# the task and model of the published configuration (docs/results/isreshape/lm)
FIXED = ("--max-operand", "14", "--pretrain-steps", "300", "--threads", "1", "--checkpoint-every", "50")


def root(out: Path, pretrain: int, lr: float) -> Path:
    return Path(out) / f"pt{pretrain}" / f"lr{lr:g}"


def job(out: Path, arm: str, pretrain: int, lr: float, seed: int, updates: int = UPDATES) -> Job:
    r = root(out, pretrain, lr)
    argv = ("--arms", arm, "--seed", str(seed), "--pretrain-seed", str(pretrain), "--lr", f"{lr:g}",
            "--updates", str(updates), "--resume", "--out", str(r), *FIXED)
    return Job(key=(f"pt{pretrain}", f"lr{lr:g}", arm, f"seed{seed}"), trainer="isreshape-lm", argv=argv,
               run_dir=r / arm / f"seed{seed}", updates=updates)


def sweep_jobs(out: Path, updates: int = UPDATES) -> list[Job]:
    return [job(out, a, SWEEP_PRETRAIN, lr, s, updates) for lr in LRS for s in SWEEP_SEEDS for a in ARMS]


def main_jobs(out: Path, chosen: dict[str, float], updates: int = UPDATES) -> list[Job]:
    return [job(out, a, p, chosen[a], s, updates) for p in PRETRAIN_SEEDS for s in SEEDS for a in ARMS]


def prepare_inits(out: Path, pairs: list[tuple[int, float]]) -> None:
    """Pre-train each root's initial model once, before parallel runs could race to build it."""
    from reference_impl.isreshape.lm.trainer import LmConfig, init_path

    for pretrain, lr in pairs:
        init_path(LmConfig(pretrain_seed=pretrain, lr=lr, max_operand=14, pretrain_steps=300), root(out, pretrain, lr))


def run(out: Path, *, parallel: int, updates: int = UPDATES, echo=print) -> dict[str, float]:
    """Both phases; returns the learning rate chosen per arm (also written to ``DIR/chosen_lr.json``)."""
    from rlconform.study import analysis

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prepare_inits(out, [(SWEEP_PRETRAIN, lr) for lr in LRS])
    echo(f"sweep: {len(ARMS)} arms x {len(LRS)} learning rates x {len(SWEEP_SEEDS)} seeds on initial model {SWEEP_PRETRAIN}")
    run_grid(sweep_jobs(out, updates), out, parallel=parallel, echo=echo)
    chosen = analysis.choose_lr(out, ARMS, LRS, SWEEP_PRETRAIN, SWEEP_SEEDS)
    (out / "chosen_lr.json").write_text(json.dumps(chosen, indent=1) + "\n")
    echo("chosen learning rates: " + ", ".join(f"{a} {lr:g}" for a, lr in chosen.items()))
    prepare_inits(out, sorted({(p, lr) for p in PRETRAIN_SEEDS for lr in chosen.values()}))
    echo(f"main: {len(ARMS)} arms x {len(PRETRAIN_SEEDS)} initial models x {len(SEEDS)} seeds")
    run_grid(main_jobs(out, chosen, updates), out, parallel=parallel, echo=echo)
    return chosen
