"""Meta: the TorchRL adapter passes pre-flight with honest declarations, and each TorchRL finding page's
repro (the library alone) still prints the defect it reports, so a fixed upstream release is noticed."""
from __future__ import annotations

import re

import pytest

from conformance_tests.meta.test_adapters_sb3_contrib import (
    check_declarations,
    repro_output,
)

pytestmark = pytest.mark.meta


@pytest.fixture(autouse=True)
def _torchrl():
    pytest.importorskip("torchrl")


def test_torchrl_adapter_preflight():
    check_declarations("conformance_tests.adapters.torchrl:make", {
        "sac": ["entropy_from_logits", "policy_loss_from_logits", "losses", "temperature_loss", "temperature_update",
                "td_target"],
        "ppo": ["masked_distribution", "sample_actions", "evaluate_actions", "gae", "losses", "clipped_policy_loss"],
        "ccapo": ["macro_advantage"]})


def test_torchrl_discrete_sac_masked_nan_repro_prints_nan(run_python):
    out = repro_output("torchrl-discrete-sac-masked-nan.md", run_python)
    assert "'loss_actor': nan" in out and "'loss_alpha': nan" in out and "'entropy': nan" in out, out


def test_torchrl_mcadvantage_degenerate_group_repro_prints_non_zero_advantages(run_python):
    out = repro_output("torchrl-mcadvantage-degenerate-group.md", run_python)
    values = [float(v) for v in re.search(r"advantage: \[(.*?)\]", out).group(1).split(",")]
    assert len(values) == 7 and all(abs(v - 0.9258201122283936) < 1e-6 for v in values), out  # equal returns


def test_torchrl_mcadvantage_non_finite_returns_repro_prints_nan(run_python):
    out = repro_output("torchrl-mcadvantage-non-finite-returns.md", run_python)
    assert "advantage: [nan, nan]" in out, out


def test_torchrl_masked_categorical_repro_prints_silent_scores(run_python):
    out = repro_output("torchrl-masked-categorical-unchecked-inputs.md", run_python)
    assert "illegal replayed action 1, log_prob: [-inf]" in out, out  # scored instead of raising
    assert "NaN logit, log_prob(0): [-inf]" in out and "probs: [[nan, nan, nan]]" in out, out


def test_torchrl_td0_accepts_any_gamma_repro_prints_the_targets(run_python):
    out = repro_output("torchrl-td0-accepts-any-gamma.md", run_python)
    assert "gamma=-0.5: target [-1.5, 1.0]" in out and "gamma=1.5: target [8.5, 1.0]" in out, out
    assert "TD0Estimator(gamma=-0.5) accepted" in out, out


def test_torchrl_clipppoloss_clip_epsilon_repro_prints_nan(run_python):
    out = repro_output("torchrl-clipppoloss-unvalidated-clip-epsilon.md", run_python)
    assert "clip_epsilon=1.5: log-ratio clip bounds [nan, 0.916], loss_objective nan" in out, out
    assert "NaN advantage: loss_objective nan" in out, out
