"""What every test module uses: the operation proxy, the call recorder, and the assertion helpers.

A test never calls an implementation directly: it goes through :class:`FamilyProxy` (the ``sac``,
``ppo``, ... fixtures), which

* turns a missing operation into *not applicable* (a skip the report counts apart),
* wraps an exception raised by the implementation in :class:`ImplementationError`, so the report
  can say ``error`` rather than ``fail``,
* hands the operation copies of its tensor arguments and fails the test if the operation changed
  one in place (the caller's tensors stay intact, so the oracle and the repro see the original values),
* enforces the test's time budget inside the call (a hung operation marks the test *timeout*),
* records every call, so a failure message can name it and carry a runnable repro snippet.

Assertion helpers word their failures as ``got X, but should be Y [CLAUSE: call]``.

One module per concern, each importing only those above it: :mod:`.state` (the session's and the current
test's state, its only home), :mod:`.capabilities` (what the implementation declares), :mod:`.device` (the
audited device), :mod:`.repro` (repro snippets), :mod:`.fingerprints` (the copies an operation gets and the
input-mutation check), :mod:`.tolerances`, :mod:`.failures` (failure messages), :mod:`.proxy` (the call
wrapper and :class:`FamilyProxy`), :mod:`.assertions` and :mod:`.convention_oracles`. This package re-exports
their names, and those of :mod:`conformance_tests.dtypes` (what a dtype holds), so ``harness.X`` and
``from conformance_tests.harness import X`` name the same object.
"""
from __future__ import annotations

from conformance_tests.harness.state import (
    NOT_APPLICABLE, ImplementationError, InputMutated, OpTimeout, reset_calls, begin_test, RESIDUE,
    failure_severity, _severity_of, first_failure, not_applicable_calls, end_test, session_impl, session_device,
    simulated, recorded_calls, configure,
)
from conformance_tests.harness.capabilities import (
    set_capabilities, declared_capabilities, capability, DTYPES, CAPABILITY_DEFAULTS, not_applicable, reported,
    masks_supported, require_masks, declared_dtypes, supports_dtype, require_dtype, working_dtype, differentiable,
    require_differentiable, terminated_truncated, declares, convention, deviations, pinned, pin, pin_value, contract_default, steps_itself,
)
from conformance_tests.harness.device import generator, on_device, device_leaf, map_leaves, named_leaves, host, to_numpy
from conformance_tests.harness.repro import _literal, _REPRO_HELPERS, describe_call, repro_snippet
from conformance_tests.harness.tolerances import tolerance, slack, input_dtype
from conformance_tests.harness.failures import plain, plain_text, fail
from conformance_tests.harness.proxy import (
    call_op, contract_return, suite_side_error, evidence_in_train_dtype, FamilyProxy,
)
from conformance_tests.dtypes import fits, prob_floor
from conformance_tests.harness.assertions import (
    assert_close, assert_dtype, assert_low_precision, assert_no_grad, grad_of, assert_no_grad_into, grad_leaves,
    assert_equal, assert_between, assert_that, assert_rejects, clause_ids_in, no_grad_leak, finite_difference,
    one_sided_difference,
)
from conformance_tests.harness.convention_oracles import (
    np_standardise, np_approx_kl, np_clip_fraction, np_clip_fraction_bounds, np_critic_penalty, critic_delta,
    log_ratio_clamp, temperature_loss_scale, np_temperature_loss,
)

__all__ = [
    "NOT_APPLICABLE", "ImplementationError", "InputMutated", "OpTimeout", "reset_calls", "begin_test", "RESIDUE",
    "failure_severity", "_severity_of", "first_failure", "not_applicable_calls", "end_test", "session_impl",
    "session_device", "simulated", "recorded_calls", "configure",
    "set_capabilities", "declared_capabilities", "capability", "DTYPES", "CAPABILITY_DEFAULTS", "not_applicable",
    "reported", "masks_supported", "require_masks", "declared_dtypes", "supports_dtype", "require_dtype",
    "working_dtype", "differentiable", "require_differentiable", "terminated_truncated", "declares", "convention",
    "deviations", "pinned", "pin", "pin_value", "contract_default", "steps_itself",
    "generator", "on_device", "device_leaf", "map_leaves", "named_leaves", "host", "to_numpy",
    "_literal", "_REPRO_HELPERS", "describe_call", "repro_snippet",
    "tolerance", "slack", "input_dtype",
    "plain", "plain_text", "fail",
    "call_op", "contract_return", "suite_side_error", "evidence_in_train_dtype", "FamilyProxy",
    "assert_close", "assert_dtype", "assert_low_precision", "assert_no_grad", "grad_of", "assert_no_grad_into",
    "grad_leaves", "assert_equal", "assert_between", "assert_that", "assert_rejects", "clause_ids_in", "no_grad_leak",
    "finite_difference", "one_sided_difference",
    "fits", "prob_floor",
    "np_standardise", "np_approx_kl", "np_clip_fraction", "np_clip_fraction_bounds", "np_critic_penalty",
    "critic_delta", "log_ratio_clamp", "temperature_loss_scale", "np_temperature_loss",
]
