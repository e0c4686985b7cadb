"""Smoke test of the isreshape trainer: three updates, the metrics the clauses name, then a resume."""
from __future__ import annotations

import json
import math

import pytest

from conformance_tests.harness import assert_that
from reference_impl.isreshape.trainer import cli

METRICS = ("gamma_mean", "gamma_std", "weight_mean", "weight_max", "sapo_weight_mean", "ratio_mean",
           "abs_adv_mean", "kl", "mean_reward", "loss")
SMALL = ["--contexts", "4", "--tokens", "6", "--batch-contexts", "8", "--group-size", "4", "--epochs", "2",
         "--checkpoint-every", "1"]


def _records(path):
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


@pytest.mark.meta
@pytest.mark.clause("ISR-LOSS-2", "ISR-METRIC-1", "ISR-METRIC-2", "ISR-METRIC-3")
def test_trainer_three_updates_then_resume(tmp_path):

    out = tmp_path / "run"
    assert cli(["--out", str(out), "--updates", "3", *SMALL]) == 0
    recs = _records(out / "metrics.jsonl")
    assert_that([r["update"] for r in recs] == [0, 1, 2], "ISR-METRIC-1", [r["update"] for r in recs], "updates 0, 1, 2")
    for r in recs:
        missing = [m for m in METRICS if m not in r or not math.isfinite(r[m])]
        assert_that(not missing, "ISR-METRIC-1", missing, "every metric present and finite")
        assert_that(r["gamma_mean"] >= 0.5 - 1e-12, "ISR-METRIC-1", r["gamma_mean"], ">= 0.5 with the default bounds")
    assert_that(recs[0]["grad_norm"] > 0, "ISR-LOSS-2", recs[0]["grad_norm"], "a non-zero policy gradient")
    assert_that((out / "checkpoint.pt").exists(), "ISR-METRIC-1", "no checkpoint.pt", "a checkpoint")
    assert cli(["--out", str(out), "--updates", "5", "--resume", *SMALL]) == 0
    recs = _records(out / "metrics.jsonl")
    assert_that([r["update"] for r in recs] == [0, 1, 2, 3, 4], "ISR-METRIC-1", [r["update"] for r in recs],
                "the resumed run continues at update 3")
    straight = tmp_path / "straight"
    assert cli(["--out", str(straight), "--updates", "5", *SMALL]) == 0
    same = [a["mean_reward"] == b["mean_reward"] for a, b in zip(_records(straight / "metrics.jsonl"), recs)]
    assert_that(all(same), "ISR-METRIC-1", same, "a resumed run replays the uninterrupted run exactly")


@pytest.mark.meta
@pytest.mark.clause("PPO-LOSS-1")
def test_the_decoupled_ppo_baseline_weights_by_pi_prox_over_mu_and_clips_around_pi_prox():
    """At pi = pi_prox the decoupled loss's gradient in log pi is -(pi_prox / mu) A / n (the importance-weighted
    policy gradient); a token already past 1 + eps of pi_prox with A > 0 gets none (clipped around pi_prox, not mu)."""
    import torch

    from reference_impl.isreshape.trainer import IsReshapeConfig, objective

    cfg = IsReshapeConfig(loss="ppo-decoupled", clip_eps=0.2)
    mu = torch.tensor([0.5, 0.1, 0.25], dtype=torch.float64)
    prox = torch.tensor([0.2, 0.3, 0.25], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    lp = prox.log().clone().requires_grad_(True)
    objective(cfg, lp, mu.log(), adv, torch.ones(3), prox.log()).backward()
    want = -(prox / mu) * adv / 3  # d/dlogpi of -(1/n) sum (pi_prox/mu) (pi/pi_prox) A at pi = pi_prox
    assert torch.allclose(lp.grad, want), (lp.grad, want)
    past = (prox * 1.5).log().clone().requires_grad_(True)  # r = 1.5 > 1.2 on every token
    objective(cfg, past, mu.log(), torch.ones(3, dtype=torch.float64), torch.ones(3), prox.log()).backward()
    assert torch.equal(past.grad, torch.zeros(3, dtype=torch.float64))
