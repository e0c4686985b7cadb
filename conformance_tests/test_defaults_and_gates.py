"""Defaults and go-live gates of every family, generated from spec/ (one test per clause).

Defaults: the implementation's ``defaults()`` table carries the spec's values. Gates: the evaluator
in ``rlconform.gate`` passes a figure on the right side of the threshold and fails one on the wrong
side, so a run's metrics are judged exactly as the clause says.
"""
from __future__ import annotations

import math

import pytest

from conformance_tests.harness import assert_that, fail
from rlconform import gate as gates
from rlconform.spec import default_spec

_SPEC = default_spec()
_DEFAULTS = [c for c in _SPEC.clauses.values() if c.kind == "default"]
_GATES = [c for c in _SPEC.clauses.values() if c.kind == "gate"]


@pytest.mark.parametrize("clause", [pytest.param(c, id=c.id, marks=pytest.mark.clause(c.id)) for c in _DEFAULTS])
def test_default_values(impl, clause):
    from conformance_tests.harness import FamilyProxy

    fam = FamilyProxy(clause.family, getattr(impl, clause.family, None))
    table = fam.defaults()
    for key, want in clause.value.items():
        if key not in table:
            fail(clause.id, f"no key {key!r} in defaults()", want)
        got = table[key]
        same = math.isclose(float(got), float(want), rel_tol=0, abs_tol=0) if isinstance(want, (int, float)) else got == want
        if not same:
            fail(clause.id, got, want, f"defaults()[{key!r}]")


def _inside_and_outside(op, thr):
    """A figure that satisfies the gate and one that violates it, derived from the threshold alone."""
    if op == "in":
        lo, hi = thr
        return (lo + hi) / 2, hi * 2 + 1
    step = max(abs(thr) * 0.5, 1e-3)
    return {
        "<": (thr - step, thr), "<=": (thr, thr + step), ">": (thr + step, thr),
        ">=": (thr, thr - step), "==": (thr, thr + 1),
    }[op]


@pytest.mark.meta
@pytest.mark.parametrize("clause", [pytest.param(c, id=c.id, marks=pytest.mark.clause(c.id)) for c in _GATES])
def test_gate_verdicts(clause):
    g = clause.gate
    good, bad = _inside_and_outside(g["op"], g["threshold"])
    agg = g.get("aggregate", "last")
    # per-update records whose aggregate is exactly the figure: a constant series
    for figure, want in ((good, "pass"), (bad, "fail")):
        recs = [{g["metric"]: figure} for _ in range(4)]
        got = [r for r in gates.evaluate(recs, clause.family) if r.clause.id == clause.id][0]
        assert_that(got.verdict == want, clause.id, f"{got.verdict} for {g['metric']}={figure} ({agg})", want)
    missing = [r for r in gates.evaluate([{"other": 1.0}], clause.family) if r.clause.id == clause.id][0]
    assert_that(missing.verdict == "missing", clause.id, missing.verdict, "missing when the metric is absent")
