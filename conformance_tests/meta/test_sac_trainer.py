"""Meta smoke tests of the bundled SAC trainer (reference_impl/sac/trainer.py; its environment: test_sac_env.py).

They check our own loop, not a third-party implementation: a two-update run writes the metrics the gates
read and resumes where it stopped, the presets carry the spec's sizes, overrides are typed, and the go-live
summary recomputes from the published logs.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlconform.golive import ablation_run, summarise
from rlconform.spec import default_spec
from rlconform.spec.gates import evaluate

from reference_impl.sac.trainer import (
    PRESETS,
    Config,
    apply_overrides,
    cli,
)

pytestmark = pytest.mark.meta

TINY = ["--set", "vocab_size=400", "--set", "max_lines=1500", "--set", "env.n_envs=8", "--set", "env.horizon=6",
        "--set", "batch_size=16", "--set", "learning_starts=8", "--set", "eval_positions=64",
        "--set", "eval_passages=4", "--set", "eval_len=8", "--set", "eval_every=1", "--set", "ckpt_every=1"]
KEYS = {"update", "critic_loss", "policy_loss", "alpha", "entropy", "target_entropy", "top_p_coverage",
        "illegal_rate", "early_termination_rate", "coverage", "top1_hit", "top3_hit", "bigram_hit_rate",
        "teacher_ratio", "relabel_rate", "popart_cov_mu", "popart_cov_sigma", "popart_nce_mu", "popart_nce_sigma"}


def test_two_update_smoke_run_writes_metrics_and_resumes(tmp_path):

    out = tmp_path / "run"
    assert cli(["--out", str(out), "--updates", "2", *TINY]) == 0
    recs = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in recs] == [0, 1, 2]  # 0: the untrained policy
    missing = KEYS - set(recs[-1])
    assert not missing, f"metrics lack {sorted(missing)}"
    assert all(v == v for r in recs for v in r.values() if isinstance(v, float))  # no NaN
    verdicts = {r.clause.id: r.verdict for r in evaluate(recs, "sac")}
    for gate in ("SAC-GATE-1", "SAC-GATE-3", "SAC-GATE-4", "SAC-GATE-5", "SAC-GATE-6", "SAC-GATE-7", "SAC-TOPP-4"):
        assert verdicts[gate] != "missing", gate
    with pytest.raises(FileExistsError):
        cli(["--out", str(out), "--updates", "2", *TINY])  # no silent overwrite
    assert cli(["--out", str(out), "--updates", "3", "--resume", *TINY]) == 0
    recs = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in recs] == [0, 1, 2, 3]


def test_full_preset_carries_the_v2_sizes_of_the_spec():

    cfg = apply_overrides(Config(), [f"{k}={v!r}" for k, v in PRESETS["full"].items()])
    spec = default_spec().clauses
    want = {**spec["SAC-DEFAULT-4"].value, **spec["SAC-DEFAULT-5"].value, **spec["SAC-DEFAULT-7"].value}
    for key in ("batch_size", "lr_pi", "lr_q", "d_model", "gru_hidden", "rho", "lambda_bc", "dagger_horizon"):
        assert getattr(cfg, key) == want[key], key
    assert cfg.env.popart_beta == spec["SAC-DEFAULT-6"].value["popart_beta"]
    assert cfg.encoder == "gru"  # §9: GRU hidden 256


@pytest.mark.parametrize("pair", ["cuda_graph=maybe", "lr_pi=fast", "batch_size=2.5", "env.n_envs=x"])
def test_an_override_of_the_wrong_type_is_an_error(pair):
    """``--set`` values keep their field's type: a string for a flag would be a true value, silently."""

    with pytest.raises(ValueError, match=r"wrong type: " + pair.split("=")[0]):
        apply_overrides(Config(), [pair])
    cfg = apply_overrides(Config(), ["lr_pi=1", "cuda_graph=False", "max_lines=None", "kpi_rows=None"])
    assert (cfg.lr_pi, cfg.cuda_graph, cfg.max_lines, cfg.kpi_rows) == (1, False, None, None)


def _write_run(path, critic, top3_at):
    """A metrics.jsonl as the trainer writes it: training records, and evaluation records at ``top3_at``."""
    path.mkdir(parents=True)
    recs = [{"family": "sac", "update": u, "critic_loss": c, "alpha": 0.2, "illegal_rate": 0.0}
            for u, c in enumerate(critic, 1)]
    for u, top3 in top3_at.items():
        recs[u - 1].update(top3_hit=top3, top1_hit=0.1, coverage=0.0, ood_gain_pp=0.0)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.mark.clause("SAC-GATE-2", "SAC-GATE-8")
def test_suite_summary_counts_diverged_seeds_and_the_smallest_paired_ablation_drop(tmp_path):

    down, up = [3.0, 2.0, 2.0, 1.0] * 2, [1.0, 1.0, 2.0, 3.0] * 2  # quarters: 3.0/2.0 -> 1.0/1.0; 1.0/1.0 -> 3.0/3.0
    _write_run(tmp_path / "seed0", down, {4: 0.30, 8: 0.35})
    _write_run(tmp_path / "seed1", up, {4: 0.20, 8: 0.33})
    ablated = {"no_bc": (0.10, 0.10), "no_topp": (0.27, 0.13), "fixed_alpha": (0.31, 0.21)}  # (seed 0, seed 1)
    for name, top3 in ablated.items():
        for seed, v in enumerate(top3):
            _write_run(tmp_path / ablation_run(name, seed), down[:4], {4: v})
    rec = summarise(tmp_path, [0, 1], updates=8, ablation_updates=4)
    assert rec["diverged_runs"] == 1 and list(rec["divergence"]) == ["seed1"]
    # each seed's ablation against the same seed's full run at update 4 (0.30 and 0.20), in points:
    # no_bc 20 and 10, no_topp 3 and 7, fixed_alpha -1 and -1; the gate reads the smallest mean
    assert rec["ablation_drops_pp_by_seed"]["no_topp"] == pytest.approx({"seed0": 3.0, "seed1": 7.0})
    assert rec["ablation_drops_pp"] == pytest.approx({"no_bc": 15.0, "no_topp": 5.0, "fixed_alpha": -1.0})
    assert rec["ablation_drop_pp"] == pytest.approx(-1.0)
    one = summarise(tmp_path, [0, 1], updates=8, ablation_updates=4, ablation_seeds=[1])  # ablations at seed 1 only
    assert one["ablation_drops_pp"] == pytest.approx({"no_bc": 10.0, "no_topp": 7.0, "fixed_alpha": -1.0})


@pytest.mark.clause("SAC-GATE-2", "SAC-GATE-8")
def test_the_published_sac_gate_record_recomputes_from_the_published_full_logs(tmp_path):
    """docs/results/sac keeps every run's full per-update log (runs.tar.gz): the suite's gate record
    (gates.jsonl, which the page's gate table reads) comes back from it exactly."""
    import tarfile

    here = Path(__file__).resolve().parents[2] / "docs" / "results" / "sac"
    with tarfile.open(here / "runs.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    published = json.loads((here / "gates.jsonl").read_text(encoding="utf-8").splitlines()[0])
    seeds = sorted(int(p.name[4:]) for p in tmp_path.glob("seed*"))
    assert seeds == [0, 1, 2]
    again = summarise(tmp_path, seeds, published["update"], published["key_metric"]["at_update"])
    assert again == published
