"""The suite has teeth: every shipped mutant is killed on each clause it names."""
from __future__ import annotations

import pytest

from conformance_tests.mutants import discover
from rlconform.mutants import run_mutant

_MUTANTS = sorted(discover().values(), key=lambda m: (m.family, m.name))


@pytest.mark.meta
@pytest.mark.parametrize("mutant", [pytest.param(m, id=f"{m.family}:{m.name}") for m in _MUTANTS])
def test_mutant_is_killed_on_its_clauses(mutant):
    """One audit child per mutant (forked from the worker's warm server, see conftest), so xdist spreads them."""
    result = run_mutant(mutant)
    assert not result.survived, f"{mutant.name} survived: no test of {', '.join(mutant.kills)} failed on it"
    assert not result.missed, f"{mutant.name} was not killed by {', '.join(result.missed)} (only by {result.killed_by})"
