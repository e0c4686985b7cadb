"""Meta: a library that declares fewer dtypes than the reference (``capabilities['dtypes']``), even a single
half-precision one, is checked in them and only in them. The suite's own tests must not fail correct code for its
dtype: a test that mixes a hard-coded float64 tensor into float32 draws, an oracle that finds a kink or a bound only
to float64's precision, or a finite difference taken in float32 would each fail every float32 library on a clause
it meets."""
from __future__ import annotations

import pytest
import torch
from rlconform.audit import clause_report, run_suite

import reference_impl
from conformance_tests.impl import override

pytestmark = pytest.mark.meta
HERE = "conformance_tests.meta.test_declared_dtypes"


def reference_declaring(*dtypes: str):
    """The reference, declaring ``dtypes`` only: its values are right in each, so every clause must pass."""
    impl = reference_impl.make()
    impl.capabilities = {**impl.capabilities, "dtypes": list(dtypes)}
    return impl


def reference_in_float32():
    return reference_declaring("float32")


def reference_in_bfloat16():
    """A library that computes its losses in bfloat16 (no float32 at all): the suite's oracles, tolerances and
    kink probes must hold it to bfloat16's rounding, never to a finer one."""
    return reference_declaring("bfloat16")


def reference_in_float16():
    """float16 also has a narrow range (65504) and rounds 1e-8 to 0: the suite's fills, garbage and clipped
    probabilities must fit it, and an answer past the range may overflow."""
    return reference_declaring("float16")


def float32_only_ratio():
    """A float32 library whose ratio refuses float64, as a library built on float32 kernels does."""
    impl = reference_in_float32()

    def ratio(new_log_prob, old_log_prob):
        if new_log_prob.dtype != torch.float32:
            raise TypeError(f"float32 only, got {new_log_prob.dtype}")
        return torch.exp(new_log_prob - old_log_prob)

    return override(impl, "ppo", ratio=ratio)


@pytest.mark.parametrize("factory", ["reference_in_float32", "reference_in_bfloat16", "reference_in_float16"])
def test_the_reference_declaring_one_dtype_passes_every_clause(factory):
    report = clause_report(run_suite(f"{HERE}:{factory}", profile="smoke"))
    failed = {c["id"]: c.get("message", "")[:300] for c in report["clauses"]
              if c["status"] not in ("pass", "not_applicable")}
    assert not failed, failed
    assert report["summary"]["exit_code"] == 0


def test_refusing_an_undeclared_dtype_is_not_applicable_never_an_error():
    """The fixed-input tests that hand it a float64 tensor are not applicable; the float32 ones still check it."""
    report = clause_report(run_suite(f"{HERE}:float32_only_ratio", clauses=["PPO-RATIO-1"]))
    (c,) = report["clauses"]
    assert c["status"] == "pass", c.get("message")
    assert report["summary"]["tests_executed"] > 0
