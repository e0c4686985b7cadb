"""Meta: a library that declares fewer dtypes than the reference (``capabilities['dtypes']``) is checked in them
and only in them. The suite's own tests must not fail correct code for its dtype: a test that mixes a
hard-coded float64 tensor into float32 draws, an oracle that finds a kink or a bound only to float64's precision,
or a finite difference taken in float32 would each fail every float32 library on a clause it meets."""
from __future__ import annotations

import pytest
import torch
from rlconform.audit import clause_report, run_suite

import reference_impl
from conformance_tests.impl import override

pytestmark = pytest.mark.meta
HERE = "conformance_tests.meta.test_declared_dtypes"


def reference_in_float32():
    """The reference, declaring float32 only: its values are right in float32, so every clause must pass."""
    impl = reference_impl.make()
    impl.capabilities = {**impl.capabilities, "dtypes": ["float32"]}
    return impl


def float32_only_ratio():
    """A float32 library whose ratio refuses float64, as a library built on float32 kernels does."""
    impl = reference_in_float32()

    def ratio(new_log_prob, old_log_prob):
        if new_log_prob.dtype != torch.float32:
            raise TypeError(f"float32 only, got {new_log_prob.dtype}")
        return torch.exp(new_log_prob - old_log_prob)

    return override(impl, "ppo", ratio=ratio)


def test_the_reference_declaring_float32_only_passes_every_clause():
    report = clause_report(run_suite(f"{HERE}:reference_in_float32", profile="smoke"))
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
