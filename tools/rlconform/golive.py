"""The SAC go-live suite: the runs §10 asks for, and the one record every SAC gate reads.

``python -m rlconform.golive --out DIR [--seeds 0 1 2] [--updates N] [--jobs 2] [--preset cpu]
[--device cuda] [--set KEY=VALUE ...]`` then ``rlconform gate DIR/gates.jsonl``.

* ``DIR/seed<S>``: the configuration under test, once per seed (SAC-GATE-2: independent runs
  without divergence; the per-run gates pool over them, a gate passing only if every seed passes);
* ``DIR/ablate_<name>_seed<S>``: no BC (λ_BC = 0), no Top-p (p = 1: the backup over the whole legal
  set), fixed α (lr_α = 0), at each of the first ``--ablation-seeds`` seeds (default: every seed).
  SAC-GATE-8: each must lower the key metric by 5 points; the drop is paired, the same seed's full run
  minus its ablation, averaged over the seeds, and the record keeps each seed's drop.
  ``--ablation-updates M`` (default N) stops them earlier; they are then compared with the full runs'
  evaluation at update M, so both sides have trained equally long.

Runs that already finished are read, not rerun, so a suite resumes after an interruption (a run cut
short is started afresh). Each run is ``python -m reference_impl.sac.trainer`` in its own process.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlconform.spec import gates as gate

ABLATIONS = {"no_bc": ["lambda_bc=0.0"], "no_topp": ["top_p=1.0"], "fixed_alpha": ["lr_alpha=0.0"]}  # §10
KEY_METRIC = "top3_hit"  # the key metric of SAC-GATE-8: held-out top-3 next-character hits at the end of the run
LOSSES = ("critic_loss", "policy_loss", "bc_loss", "alpha_loss", "alpha")  # any non-finite value: diverged
TREND = "critic_loss"  # SAC-GATE-2: the critic Huber loss must go down


def read_run(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return gate.read_metrics(path)[1] if path.exists() else []


def finished(run: Path, updates: int) -> bool:
    recs = read_run(run)
    return bool(recs) and recs[-1].get("update") == updates and KEY_METRIC in recs[-1]


def key_at(records: list[dict], update: int) -> float:
    """The key metric of the evaluation at ``update`` (an evaluation record must exist there)."""
    hits = [r[KEY_METRIC] for r in records if r.get("update") == update and KEY_METRIC in r]
    if not hits:
        raise ValueError(f"no {KEY_METRIC} evaluation at update {update}: make it a multiple of eval_every")
    return hits[-1]


def run_one(run: Path, seed: int, updates: int, preset: str, sets: list[str], device: str = "cpu") -> Path:
    if finished(run, updates):
        return run
    if (run / "metrics.jsonl").exists():  # a run cut short: start it again from nothing
        for f in run.iterdir():
            f.unlink()
    cmd = [sys.executable, "-m", "reference_impl.sac.trainer", "--out", str(run), "--seed", str(seed),
           "--updates", str(updates), "--preset", preset, "--device", device,
           *[x for kv in sets for x in ("--set", kv)]]
    with open(run.parent / f"{run.name}.log", "w", encoding="utf-8") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TQDM_DISABLE": "1"})
    return run


def summarise(out: Path, seeds: list[int], updates: int, ablation_updates: int,
              ablation_seeds: list[int] | None = None) -> dict:
    """The suite's gate record: pooled per-run figures, diverged_runs, ablation_drop_pp and the details."""
    mains = {s: read_run(out / f"seed{s}") for s in seeds}
    rec = {"family": "sac", "update": updates, **gate.pooled_figures(list(mains.values()), "sac")}
    why = {s: gate.divergence(r, losses=LOSSES, trend=TREND) for s, r in mains.items()}
    rec["diverged_runs"] = sum(w is not None for w in why.values())  # SAC-GATE-2
    rec["divergence"] = {f"seed{s}": w for s, w in why.items() if w}
    ablation_seeds = ablation_seeds or seeds
    full = {s: key_at(mains[s], ablation_updates) for s in ablation_seeds}
    ablated = {name: {s: key_at(read_run(out / ablation_run(name, s)), ablation_updates) for s in ablation_seeds}
               for name in ABLATIONS}
    per_seed = {s: gate.ablation_drops(full[s], {name: v[s] for name, v in ablated.items()}) for s in ablation_seeds}
    by_seed = {name: {f"seed{s}": per_seed[s][name] for s in ablation_seeds} for name in ablated}
    drops = {name: sum(d.values()) / len(d) for name, d in by_seed.items()}  # paired, then averaged
    rec["ablation_drop_pp"] = min(drops.values())  # SAC-GATE-8: every ablation must cost 5 points
    rec["ablation_drops_pp"] = drops
    rec["ablation_drops_pp_by_seed"] = by_seed
    rec["key_metric"] = {"name": KEY_METRIC, "at_update": ablation_updates,
                         "full": {f"seed{s}": v for s, v in full.items()},
                         **{name: {f"seed{s}": x for s, x in v.items()} for name, v in ablated.items()}}
    return rec


def ablation_run(name: str, seed: int) -> str:
    return f"ablate_{name}_seed{seed}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--updates", type=int, default=1200)
    p.add_argument("--ablation-updates", type=int, default=None, help="length of the ablation runs (default: --updates)")
    p.add_argument("--ablation-seeds", type=int, default=None,
                   help="run the ablations at the first K seeds (default: every seed)")
    p.add_argument("--preset", default="cpu")
    p.add_argument("--device", default="cpu", help="device of every run (the trainer's --device)")
    p.add_argument("--jobs", type=int, default=2, help="runs at the same time")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed to every run")
    a = p.parse_args(argv)
    if a.ablation_seeds is not None and a.ablation_seeds < 1:
        p.error("--ablation-seeds must be at least 1")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    n_abl = a.ablation_updates or a.updates
    jobs = [(out / f"seed{s}", s, a.updates, a.set) for s in a.seeds]
    abl_seeds = a.seeds[:a.ablation_seeds] if a.ablation_seeds else a.seeds
    jobs += [(out / ablation_run(name, s), s, n_abl, a.set + extra) for s in abl_seeds for name, extra in ABLATIONS.items()]
    with ThreadPoolExecutor(a.jobs) as pool:  # threads only wait on the training subprocesses
        list(pool.map(lambda j: run_one(j[0], j[1], j[2], a.preset, j[3], a.device), jobs))
    rec = summarise(out, a.seeds, a.updates, n_abl, abl_seeds)
    (out / "gates.jsonl").write_text(json.dumps(rec) + "\n", encoding="utf-8")
    print(json.dumps(rec, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
