"""Meta: the TRL adapter passes pre-flight with honest declarations, and each TRL finding page's repro (the
library alone) still prints the defect it reports."""
from __future__ import annotations

import pytest

from conformance_tests.meta.test_adapters_sb3_contrib import (
    check_declarations,
    repro_output,
)

pytestmark = pytest.mark.meta


def test_trl_adapter_preflight():
    pytest.importorskip("trl")
    check_declarations("conformance_tests.adapters.trl:make", {
        "ccapo": ["policy_loss", "macro_advantage"], "isreshape": ["aggregate_loss", "sapo_weight", "sapo_weight_signed"]})


# Each finding page's repro, and what its output must show while the defect is there.
REPROS = {
    "trl-sapo-temperatures-float32.md": [
        "got 1.239646381766967, expected r*sech^2(tau*(r-1)/2) = 1.2396464192224685"],
    "trl-grpo-loss-counts-masked-completions.md": [
        "1 completion(s), 2 unmasked tokens: loss -1.0", "2 completion(s), 2 unmasked tokens: loss -0.5"],
    "trl-grpo-loss-no-input-checks.md": ["clip range (-0.5, 2.5)", "loss with a NaN log-prob: nan"],
    "trl-grpo-advantages-degenerate-group.md": ["advantages: [-0.002377975033596158, -0.002377975033596158"],
}


@pytest.mark.parametrize("page", sorted(REPROS))
def test_trl_finding_repro_prints_the_defect(page, run_python):
    pytest.importorskip("trl")
    out = repro_output(page, run_python)
    assert all(needle in out for needle in REPROS[page]), out
