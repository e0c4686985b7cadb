"""The session's and the current test's state, and the outcomes a test can end in.

The one home of the harness's mutable state: ``_STATE`` (the session's implementation string and device; the
current test's calls, clauses, deadline, first failure, severity, capabilities and deviations), ``_HUNG`` (the
operations that hung) and ``_CALL_LOG`` (the audit's call-log file). Every other harness module reads and
writes them as ``state._STATE``..., never through a copy.
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from conformance_tests import simdevice

NOT_APPLICABLE = "not applicable:"

# The session's state: the implementation string printed in repros, the device, and the current
# test's calls, clauses and deadline.
_STATE: dict[str, Any] = {"impl": "reference_impl:make", "device": "cpu", "calls": [], "clauses": (),
                          "deadline": None, "timed_out": None, "first_failure": None, "not_applicable": 0,
                          "severity": None, "last_result": None, "capabilities": {},
                          "deviations": {}, "mutated": None}


# operation (the implementation's callable) -> the message of the time-out it hit in this process: a hung
# operation is not called again, so an op that hangs under every test costs one test's budget, not one
# per test that calls it
_HUNG: dict[tuple[int, int], tuple[Callable, str]] = {}  # keyed by _op_key; the value keeps the op alive


class ImplementationError(Exception):
    """The implementation raised where the test expected a result."""


class InputMutated(AssertionError):
    """The implementation changed one of its input tensors in place."""


class OpTimeout(BaseException):
    """The test's time budget ran out inside the implementation.

    A BaseException, so that Hypothesis neither retries nor shrinks the hung call: the test ends at once.
    """


# ``rlconform audit`` names a file here: the call about to be made is written to it (one short line,
# replaced at each call), so if the implementation kills the process (a segfault, os._exit) the audit
# can still say which call did it. One os.pwrite per call; nothing when the variable is unset.
_CALL_LOG: dict[str, Any] = {"fd": None, "path": None}


def reset_calls() -> None:
    _STATE["calls"] = []


@contextlib.contextmanager
def oracle_calls() -> Iterator[None]:
    """Calls made to compute an expected value (a finite difference probing the operation at float64 points)
    are the oracle's, not the test's: afterwards the record is as it was, so tolerances follow the dtype of
    the call under test and failures name it. A call that raises keeps its record: the error is that call's."""
    saved = (list(_STATE["calls"]), _STATE.get("last_fn"), _STATE["last_result"], _STATE["mutated"])
    yield
    _STATE["calls"], _STATE["last_fn"], _STATE["last_result"], _STATE["mutated"] = saved


def begin_test(*, clauses: Iterable[str] = (), timeout: float | None = None) -> None:
    """Start a test: no recorded calls, its clauses (named in failures), and its time budget."""
    _STATE.update(calls=[], clauses=tuple(clauses), timed_out=None, first_failure=None, not_applicable=0,
                  deviations={}, severity=None, last_result=None, mutated=None,
                  deadline=time.monotonic() + timeout if timeout else None)


# Severity (rlconform.spec.SEVERITIES): critical when training breaks (NaN/inf where the answer is finite,
# or the implementation raised), major for a wrong result or decision, minor for a numerical residue within
# RESIDUE of the answer's scale that a tight tolerance still rejects.
RESIDUE = 1e-6


def _note_failure(kind: str, message: str, severity: str | None = None) -> None:
    """Remember the test's first failure: if the time budget then runs out while Hypothesis shrinks it,
    the verdict is that failure (unshrunk), not a timeout. The severity is the latest failure's: after
    shrinking, Hypothesis replays the minimal example last, and that is the one the report shows."""
    if _STATE["first_failure"] is None:
        _STATE["first_failure"] = (kind, message)
    _STATE["severity"] = severity or ("critical" if kind == "error" else "major")


def failure_severity() -> str | None:
    """The severity of the current test's reported failure (None when nothing failed)."""
    return _STATE["severity"]


def _severity_of(got: np.ndarray, expected: np.ndarray, err: float, residue: float = RESIDUE) -> str:
    """critical (non-finite where ``expected`` is finite), minor (``err`` within ``residue`` of the scale of
    ``expected``, at least 1) or major."""
    if (~np.isfinite(got) & np.isfinite(expected)).any():
        return "critical"
    scale = float(np.max(np.abs(expected[np.isfinite(expected)]), initial=0.0))
    return "minor" if math.isfinite(err) and err <= residue * max(scale, 1.0) else "major"


def first_failure() -> tuple[str, str] | None:
    """("fail" | "error", message) of the current test's first failure, or None."""
    return _STATE["first_failure"]


def not_applicable_calls() -> int:
    """How many calls of the current test the implementation declared not applicable."""
    return _STATE["not_applicable"]


def end_test() -> None:
    _STATE.update(deadline=None, timed_out=None)


def session_impl() -> str:
    return _STATE["impl"]


def session_device() -> str:
    """The torch device the session's tensors live on (``cuda:0`` for ``--device sim``)."""
    dev = _STATE["device"]
    return str(simdevice.DEVICE) if dev == simdevice.NAME else dev


def simulated() -> bool:
    """Whether the session runs on the simulated device (``--device sim``)."""
    return _STATE["device"] == simdevice.NAME


def recorded_calls() -> list[tuple[str, tuple, dict]]:
    return list(_STATE["calls"])


def configure(impl: str, device: str) -> tuple[str, str]:
    """Set the session's implementation string and device; returns the previous pair (nested sessions)."""
    prev = (_STATE["impl"], _STATE["device"])
    _STATE["impl"] = impl
    _STATE["device"] = device
    return prev
