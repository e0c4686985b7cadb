"""Meta: the verl adapter passes pre-flight with honest declarations, and each verl finding page's repro (the
library alone) still prints the defect it reports."""
from __future__ import annotations

import pytest

from conformance_tests.meta.test_adapters_sb3_contrib import (
    check_declarations,
    repro_output,
)

pytestmark = pytest.mark.meta


def test_verl_adapter_preflight():
    pytest.importorskip("verl")
    check_declarations("conformance_tests.adapters.verl:make", {
        "ccapo": ["macro_advantage", "policy_loss"],
        "isreshape": ["aggregate_loss", "sapo_weight", "sapo_weight_signed"],
        "ppo": ["gae", "value_loss"]})


# Each finding page's repro, and what its output must show while the defect is there.
REPROS = {
    "verl-sapo-ignores-loss-agg-mode.md": ["token-mean: got 0.088031, expected -0.930540"],
    "verl-agg-loss-empty-mask-nan.md": ["token-mean: nan", "token-sum: 0.0"],
    "verl-grpo-degenerate-group-not-zero.md": ["reward 9.8: advantages [1.7763568359436352e-09"],
    "verl-core-algos-no-input-checks.md": ["mismatched shapes: 0.25", "[nan, nan]"],
}


@pytest.mark.parametrize("page", sorted(REPROS))
def test_verl_finding_repro_prints_the_defect(page, run_python):
    pytest.importorskip("verl")
    out = repro_output(page, run_python)
    assert all(needle in out for needle in REPROS[page]), out
