"""Meta-test of report fidelity: a failure's message is the failure itself (the assertion's own line, or
the exception), the same whether the audit runs serially or on xdist workers (issue 22: under ``--jobs``
some messages were the worker's header, ``[gw1] linux -- Python ...``, or a line of carets)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import reference_impl
from conformance_tests.impl import override
from rlconform.audit import clause_report, run_suite

pytestmark = pytest.mark.meta
CLAUSES = ["CCAPO-C-1", "CCAPO-MACRO-1", "ISR-GAMMA-2"]


def failing_impl():
    """Three kinds of failure: a wrong value (the suite's message), a result of the wrong type that breaks the
    test's own code (a foreign exception), and an operation that raises (an implementation error)."""
    base = reference_impl.make()
    criticality, macro = base.ccapo.criticality, base.ccapo.macro_advantage

    def reward_gamma(*args, **kwargs):
        raise RuntimeError("gamma table not loaded")

    impl = override(base, "ccapo", criticality=lambda *a, **k: 2 * criticality(*a, **k),
                    macro_advantage=lambda r, **k: np.asarray(macro(r, **k)))
    return override(impl, "isreshape", reward_gamma=reward_gamma)


def _messages(jobs: int) -> dict[str, str]:
    report = clause_report(run_suite("conformance_tests.test_meta_messages:failing_impl", clauses=CLAUSES,
                                     profile="mutant", jobs=jobs))
    return {c["id"]: re.sub(r"0x[0-9a-f]+", "0x…", c.get("message") or "") for c in report["clauses"]
            if c["id"] in CLAUSES}


def test_messages_are_the_failures_and_do_not_depend_on_xdist():
    serial, parallel = _messages(1), _messages(2)
    assert serial == parallel
    assert set(serial) == set(CLAUSES)
    for cid, msg in serial.items():
        first = msg.splitlines()[0]
        assert not first.startswith("[gw") and not re.fullmatch(r"[\s^~_\-\"']*", first), (cid, msg)
    assert re.match(r"got .*, but should be .* \[CCAPO-C-1: ccapo\.criticality\(", serial["CCAPO-C-1"])
    assert serial["CCAPO-MACRO-1"].startswith(("TypeError: ", "AttributeError: ")), serial["CCAPO-MACRO-1"]
    assert "raised RuntimeError: gamma table not loaded" in serial["ISR-GAMMA-2"]
