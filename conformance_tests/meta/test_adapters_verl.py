"""Meta: the verl adapter passes pre-flight with honest declarations, and each verl finding page's repro (the
library alone) still prints the defect it reports."""
from __future__ import annotations

import math

import pytest

from conformance_tests.meta.test_adapters_sb3_contrib import (
    check_declarations,
    repro_output,
)
from conformance_tests.preflight import build

pytestmark = pytest.mark.meta


def test_verl_adapter_preflight():
    pytest.importorskip("verl")
    check_declarations("conformance_tests.adapters.verl:make", {
        "ccapo": ["macro_advantage", "policy_loss"],
        "isreshape": ["aggregate_loss", "sapo_weight", "sapo_weight_signed"],
        "ppo": ["gae", "value_loss", "normalize_advantages"]})


def test_verl_normalize_advantages_is_masked_whiten():
    pytest.importorskip("verl")
    import torch

    impl = build("conformance_tests.adapters.verl:make")
    assert impl.capabilities["pinned"] == {"ppo.normalize_advantages": {"eps": 1e-8, "clamp": None}}
    # mean 2, Bessel var 1: (A - mean) * rsqrt(var + 1e-8) (torch_functional.py:343), the eps under the root
    got = impl.ppo.normalize_advantages(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    z = 1 / math.sqrt(1 + 1e-8)
    assert got.dtype == torch.float64 and torch.allclose(got, torch.tensor([-z, 0.0, z], dtype=torch.float64),
                                                         rtol=1e-15, atol=0)
    with pytest.raises(ValueError, match="sum of the mask is one"):  # masked_var rejects one element (:322-323)
        impl.ppo.normalize_advantages(torch.tensor([1.0], dtype=torch.float64))


# Each finding page's repro, and what its output must show while the defect is there.
REPROS = {
    "verl-sapo-ignores-loss-agg-mode.md": ["token-mean: got 0.088031, expected -0.930540"],
    "verl-agg-loss-empty-mask-nan.md": ["token-mean: nan", "token-sum: 0.0"],
    "verl-grpo-degenerate-group-not-zero.md": ["reward 9.8: advantages [1.7763568359436352e-09"],
    "verl-core-algos-no-input-checks.md": ["mismatched shapes: 0.25", "[nan, nan]"],
    "verl-masked-whiten-eps-inside-sqrt.md": ["std 0.0001: masked_whiten std 0.7071,",
                                              "advantages [1, nan]: [nan, nan]"],
}


@pytest.mark.parametrize("page", sorted(REPROS))
def test_verl_finding_repro_prints_the_defect(page, run_python):
    pytest.importorskip("verl")
    out = repro_output(page, run_python)
    assert all(needle in out for needle in REPROS[page]), out
