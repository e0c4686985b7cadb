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
LRS = (3e-5, 1e-4, 3e-4, 1e-3)  # a best rate at an edge of the grid would call for a wider one
SWEEP_PRETRAIN, SWEEP_SEEDS = 100, (0, 1)
PRETRAIN_SEEDS, SEEDS = (0, 1, 2), (0, 1, 2, 3, 4)
UPDATES = 150
# the task and model of the published configuration (docs/results/isreshape/lm)
TASK = {"max_operand": 14, "pretrain_steps": 300}
# model sizes: the published tiny Llama (132k parameters, CPU) and a larger one for a GPU (4.2M parameters)
VARIANTS = {"tiny": {}, "large": {"hidden": 256, "layers": 4, "heads": 8}}


def _flags(d: dict) -> tuple[str, ...]:
    return tuple(x for k, v in d.items() for x in (f"--{k.replace('_', '-')}", str(v)))


def root(out: Path, pretrain: int, lr: float) -> Path:
    return Path(out) / f"pt{pretrain}" / f"lr{lr:g}"


def job(out: Path, arm: str, pretrain: int, lr: float, seed: int, updates: int = UPDATES, *,
        device: str = "cpu", variant: str = "tiny") -> Job:
    r = root(out, pretrain, lr)
    argv = ("--arms", arm, "--seed", str(seed), "--pretrain-seed", str(pretrain), "--lr", f"{lr:g}",
            "--updates", str(updates), "--resume", "--out", str(r), "--device", device, "--threads", "1",
            "--checkpoint-every", "50", *_flags(TASK), *_flags(VARIANTS[variant]))
    return Job(key=(f"pt{pretrain}", f"lr{lr:g}", arm, f"seed{seed}"), trainer="isreshape-lm", argv=argv,
               run_dir=r / arm / f"seed{seed}", updates=updates)


def prepare_inits(out: Path, pairs, variant: str = "tiny") -> None:
    """Pre-train each initial model once, before parallel runs could race to build it; every learning-rate
    root of one pre-train seed gets a copy of the same files, so arms at different rates start identical."""
    import shutil

    from reference_impl.isreshape.lm.trainer import LmConfig, init_path

    first: dict[int, Path] = {}
    for pretrain, lr in pairs:
        dest = root(out, pretrain, lr) / "init"
        if pretrain in first and not dest.exists():
            shutil.copytree(first[pretrain], dest)
        cfg = LmConfig(pretrain_seed=pretrain, lr=lr, **TASK, **VARIANTS[variant])
        first.setdefault(pretrain, Path(init_path(cfg, root(out, pretrain, lr))))


def run(out: Path, *, parallel: int, updates: int = UPDATES, device: str = "cpu", variant: str = "tiny",
        chosen: dict[str, float] | None = None, arms=ARMS, seeds=SEEDS, pretrains=PRETRAIN_SEEDS,
        echo=print) -> dict[str, float]:
    """The sweep (unless ``chosen`` gives each arm's rate), then the main grid; returns the rates used
    (also written to ``DIR/chosen_lr.json``)."""
    from rlconform.study import analysis

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    kw = {"device": device, "variant": variant}
    if chosen is None:
        prepare_inits(out, [(SWEEP_PRETRAIN, lr) for lr in LRS], variant)
        echo(f"sweep: {len(arms)} arms x {len(LRS)} learning rates x {len(SWEEP_SEEDS)} seeds on initial model "
             f"{SWEEP_PRETRAIN}")
        run_grid([job(out, a, SWEEP_PRETRAIN, lr, s, updates, **kw) for lr in LRS for s in SWEEP_SEEDS for a in arms],
                 out, parallel=parallel, echo=echo)
        chosen = analysis.choose_lr(out, arms, LRS, SWEEP_PRETRAIN, SWEEP_SEEDS)
    chosen = {a: chosen[a] for a in arms}
    (out / "chosen_lr.json").write_text(json.dumps(chosen, indent=1) + "\n")
    echo("learning rates: " + ", ".join(f"{a} {lr:g}" for a, lr in chosen.items()))
    prepare_inits(out, sorted({(p, lr) for p in pretrains for lr in chosen.values()}), variant)
    echo(f"main: {len(arms)} arms x {len(pretrains)} initial models x {len(seeds)} seeds")
    run_grid([job(out, a, p, chosen[a], s, updates, **kw) for p in pretrains for s in seeds for a in arms],
             out, parallel=parallel, echo=echo)
    return chosen
