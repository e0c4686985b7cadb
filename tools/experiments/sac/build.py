"""Regenerate docs/results/sac from a finished suite and the n-gram ceiling probe (run from the repository root).

    python -m rlconform.golive --out SUITE --seeds 0 1 2 --updates 600 --ablation-updates 300 --jobs 2
    python -m tools.experiments.sac.ngram_ceiling CEILING.jsonl --windows 1 2 4 8
    python -m tools.experiments.sac.reevaluate SUITE REEVAL.jsonl     # optional: figures added after the suite ran
    python -m tools.experiments.sac.build SUITE CEILING.jsonl [REEVAL.jsonl [SUPERVISED.jsonl [EXTRA_DIR]]]

Writes into docs/results/sac/: ``runs.tar.gz`` (every run's full ``metrics.jsonl``, from which each gate
recomputes), ``curves.jsonl`` (every evaluation record and every 5th training record of each run, tagged
with ``run``, for the plot), ``gates.jsonl`` (the suite's gate record), ``ceiling.jsonl``,
``provenance.json``, ``curves.png`` and the figures block of ``results.md`` (between the
``<!-- figures -->`` markers; the prose around it is kept as written).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from rlconform.spec import gates as gate
from rlconform.provenance import render_markdown, stamp

from tools.experiments.grid import write_archive
from tools.experiments.sac import run_positional

ROOT = Path(__file__).resolve().parents[3]  # the repository
DOCS = ROOT / "docs" / "results" / "sac"  # the page and its data
THIN = 5  # keep every THIN-th training record (all evaluation records are kept)
BEGIN, END = "<!-- figures -->", "<!-- /figures -->"


def _records(run: Path) -> list[dict]:
    return gate.read_metrics(run / "metrics.jsonl")[1]


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def curves(suite: Path) -> list[dict]:
    out = []
    for run in sorted(p for p in suite.iterdir() if (p / "metrics.jsonl").exists()):
        for r in _records(run):
            if "top1_hit" in r or r["update"] % THIN == 0:
                out.append({"run": run.name, **{k: v for k, v in r.items() if k not in ("family", "time")}})
    return out


def figures_md(suite: Path, ceiling: list[dict], summary: dict) -> str:
    runs = {p.name: _records(p) for p in sorted(suite.iterdir()) if (p / "metrics.jsonl").exists()}
    last_eval = {name: [r for r in recs if "top1_hit" in r][-1] for name, recs in runs.items()}
    base = next(iter(last_eval.values()))
    lines = ["| run | updates | wall-clock min | top-1 hit | top-3 hit | 4-gram coverage | consistency | ood_gain_pp | consistency_gain_pp |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
             f"| unigram-frequency baseline | – | – | {_pct(base['baseline_top1_hit'])} | {_pct(base['baseline_top3_hit'])} "
             f"| {_pct(base['baseline_coverage'])} | {_pct(base['baseline_consistency'])} | – | – |"]
    for name, r in last_eval.items():
        lines.append(f"| {name} | {r['update']} | {r['minutes']:.0f} | {_pct(r['top1_hit'])} | {_pct(r['top3_hit'])} "
                     f"| {_pct(r['coverage'])} | {_pct(r['consistency'])} | {r['ood_gain_pp']:+.2f} | {r['consistency_gain_pp']:+.2f} |")
    lines += ["", "Count-model estimate of what the observation window allows (`tools.experiments.sac.ngram_ceiling`, "
              "same evaluation):", "",
              "| writer | top-1 hit | top-3 hit | 4-gram coverage | consistency | ood_gain_pp |", "|---|---:|---:|---:|---:|---:|"]
    for c in ceiling:
        if "window" in c:
            lines.append(f"| back-off count model, window {c['window']} | {_pct(c['top1_hit'])} | {_pct(c['top3_hit'])} "
                         f"| {_pct(c['coverage'])} | {_pct(c['consistency'])} | {c['ood_gain_pp']:+.2f} |")
        else:
            lines.append(f"| real news text: the 64 characters before the passage | – | – | {_pct(c['preceding_text'])} | – | – |")
            lines.append(f"| real news text: another held-out passage | – | – | {_pct(c['other_passage'])} | – | – |")
    lines += ["", "Gates of the suite (`rlconform gate docs/results/sac/gates.jsonl`):", "", "| clause | metric | figure | needs | verdict |",
              "|---|---|---:|---|---|"]
    for res in gate.evaluate([summary], "sac"):
        g = res.clause.gate
        fig = "—" if res.figure is None else f"{res.figure:.4g}"
        lines.append(f"| {res.clause.id} | {g['metric']} | {fig} | {g['op']} {g['threshold']} | **{res.verdict}** |")
    lines += ["", *ablation_md(summary)]
    if summary.get("divergence"):
        lines += ["", "Divergence (SAC-GATE-2): " + "; ".join(f"{k}: {v}" for k, v in summary["divergence"].items()) + "."]
    return "\n".join(lines)


def ablation_md(summary: dict) -> list[str]:
    """SAC-GATE-8's table: the key metric of each seed's full run and of its ablations, and the paired drops."""
    km, by_seed = summary["key_metric"], summary["ablation_drops_pp_by_seed"]
    seeds = list(km["full"])
    out = [f"Ablations (SAC-GATE-8): the key metric {km['name']} at update {km['at_update']}, each ablation against the "
           "same seed's full run; the gate reads the smallest mean drop, and needs 5 points.", "",
           "| run | " + " | ".join(seeds) + " | mean drop (points) |", "|---|" + "---:|" * (len(seeds) + 1),
           "| full | " + " | ".join(_pct(km["full"][s]) for s in seeds) + " | – |"]
    for name, drops in by_seed.items():
        cells = " | ".join(f"{_pct(km[name][s])} ({drops[s]:+.2f})" for s in seeds)
        out.append(f"| {name.replace('_', ' ')} | {cells} | {summary['ablation_drops_pp'][name]:+.2f} |")
    return out


def reeval_md(rows: list[dict]) -> str:
    lines = ["Final checkpoints scored again by `tools.experiments.sac.reevaluate` (same positions and passages; the "
             "figures match the training log, plus the corpus-level diagnostic):", "",
             "| run | update | top-1 hit | 4-gram coverage | heldout_4gram_share | unigram baseline's share |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['update']} | {_pct(r['top1_hit'])} | {_pct(r['coverage'])} "
                     f"| {_pct(r['heldout_4gram_share'])} | {_pct(r['baseline_heldout_4gram_share'])} |")
    return "\n".join(lines)


def extra_md(runs: dict[str, list[dict]]) -> str:
    lines = ["Single-seed runs outside the suite (`extra_runs.jsonl`; the settings are in the run names):", "",
             "| run | update | top-1 hit | top-3 hit | 4-gram coverage | consistency | entropy (nats) | α |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, recs in runs.items():
        for r in (x for x in recs if "top1_hit" in x and x["update"] > 0):
            lines.append(f"| {name} | {r['update']} | {_pct(r['top1_hit'])} | {_pct(r['top3_hit'])} | {_pct(r['coverage'])} "
                         f"| {_pct(r['consistency'])} | {r.get('entropy', float('nan')):.2f} | {r.get('alpha', float('nan')):.3f} |")
    return "\n".join(lines)


def main(suite: str, ceiling_path: str, reeval_path: str | None = None, supervised_path: str | None = None,
         extra_dir: str | None = None) -> None:
    suite_dir = Path(suite)
    summary = json.loads((suite_dir / "gates.jsonl").read_text(encoding="utf-8").splitlines()[0])
    ceiling = [json.loads(ln) for ln in Path(ceiling_path).read_text(encoding="utf-8").splitlines() if ln.strip()]
    (DOCS / "curves.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in curves(suite_dir)),
                                       encoding="utf-8")
    shutil.copyfile(suite_dir / "gates.jsonl", DOCS / "gates.jsonl")
    shutil.copyfile(ceiling_path, DOCS / "ceiling.jsonl")
    # every run's full per-update log (curves.jsonl is thinned for the plot): each gate recomputes from it
    write_archive(suite_dir, sorted(p / "metrics.jsonl" for p in suite_dir.iterdir() if (p / "metrics.jsonl").exists()),
                  DOCS / "runs.tar.gz")
    data = ["runs.tar.gz", "curves.jsonl", "gates.jsonl", "ceiling.jsonl", "provenance.json"]
    extra = ""
    if reeval_path:
        shutil.copyfile(reeval_path, DOCS / "reeval.jsonl")
        data.insert(3, "reeval.jsonl")
        extra += "\n\n" + reeval_md([json.loads(ln) for ln in Path(reeval_path).read_text(encoding="utf-8").splitlines()
                                      if ln.strip()])
    if extra_dir:  # single runs the prose quotes (a resumed longer seed, variants): their evaluation records
        runs = {p.name: [r for r in _records(p) if "top1_hit" in r] for p in sorted(Path(extra_dir).iterdir())
                if (p / "metrics.jsonl").exists()}
        (DOCS / "extra_runs.jsonl").write_text(
            "".join(json.dumps({"run": n, **{k: v for k, v in r.items() if k != "time"}}, ensure_ascii=False) + "\n"
                    for n, recs in runs.items() for r in recs), encoding="utf-8")
        data.insert(3, "extra_runs.jsonl")
        extra += "\n\n" + extra_md(runs)
    if supervised_path:  # the BC-alone probe the prose quotes
        shutil.copyfile(supervised_path, DOCS / "supervised.jsonl")
        data.insert(3, "supervised.jsonl")
    subprocess.run([sys.executable, "-m", "tools.experiments.sac.plot_curves", str(DOCS / "curves.jsonl"),
                    str(DOCS / "ceiling.jsonl"), str(DOCS / "curves.png")], check=True, cwd=ROOT)
    cmd = ("python -m rlconform.golive --out SUITE --seeds 0 1 2 --updates 600 --ablation-updates 300 --jobs 2; "
           "python -m tools.experiments.sac.ngram_ceiling CEILING.jsonl --windows 1 2 4 8; "
           "python -m tools.experiments.sac.reevaluate SUITE REEVAL.jsonl; "
           "python -m tools.experiments.sac.supervised_probe SUPERVISED.jsonl --steps 4000 --eval-every 500; "
           "cp -r SUITE/seed0 EXTRA/seed0_to_1500 && python -m reference_impl.sac.trainer --out EXTRA/seed0_to_1500 "
           "--updates 1500 --resume; python -m reference_impl.sac.trainer --out EXTRA/rho025_bc3 --updates 1200 "
           "--eval-every 300 --set rho=0.25 --set lambda_bc=3.0 (and EXTRA/rho025_bc3_kappa05 with --set kappa=0.5); "
           "python -m tools.experiments.sac.build SUITE CEILING.jsonl REEVAL.jsonl SUPERVISED.jsonl EXTRA")
    facts = stamp(cmd, packages=("snownlp", "jieba", "matplotlib"))
    (DOCS / "provenance.json").write_text(json.dumps(facts, indent=1) + "\n", encoding="utf-8")
    block = "\n".join([BEGIN, render_markdown(facts, data_files=data), "![curves](curves.png)", "",
                       figures_md(suite_dir, ceiling, summary) + extra, END])
    page = (DOCS / "results.md").read_text(encoding="utf-8")
    if BEGIN in page and END in page:
        page = page[: page.index(BEGIN)] + block + page[page.index(END) + len(END):]
    else:
        page = page.rstrip() + "\n\n" + block + "\n"
    (DOCS / "results.md").write_text(page, encoding="utf-8")


if __name__ == "__main__":
    run_positional(main, __doc__, 2, 5)
