"""Defaults of every family, generated from spec/ (one test per clause): the implementation's
``defaults()`` table carries the spec's values.

The go-live gates are judged by rlconform's own evaluator on a run's metrics, not by an implementation's
operations; its tests are in meta/test_gates_evaluator.py.
"""
from __future__ import annotations

import math

import pytest
from rlconform.spec import default_spec

from conformance_tests.harness import FamilyProxy, fail

_SPEC = default_spec()
_DEFAULTS = [c for c in _SPEC.clauses.values() if c.kind == "default"]


# ids carry the family (``isreshape-ISR-DEFAULT-1``), so that ``-k isreshape`` selects a family's defaults too
@pytest.mark.parametrize("clause", [pytest.param(c, id=f"{c.family}-{c.id}", marks=pytest.mark.clause(c.id))
                                    for c in _DEFAULTS])
def test_default_values(impl, clause):

    fam = FamilyProxy(clause.family, getattr(impl, clause.family, None))
    table = fam.defaults()
    for key, want in clause.value.items():
        if key not in table:
            fail(clause.id, f"no key {key!r} in defaults()", want)
        got = table[key]
        same = math.isclose(float(got), float(want), rel_tol=0, abs_tol=0) if isinstance(want, (int, float)) else got == want
        if not same:
            fail(clause.id, got, want, f"defaults()[{key!r}]")
