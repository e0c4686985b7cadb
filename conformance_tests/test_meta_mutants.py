"""The suite has teeth: every shipped mutant is killed on each clause it names."""
from __future__ import annotations

import pytest

from conformance_tests.mutants import discover
from rlconform.mutants import run_mutants

_MUTANTS = sorted(discover().values(), key=lambda m: (m.family, m.name))


@pytest.fixture(scope="module")
def results():
    """All mutants, run two child processes at a time (each is its own pytest run)."""
    return {r.name: r for r in run_mutants(_MUTANTS, jobs=2)}


@pytest.mark.meta
@pytest.mark.parametrize("mutant", [pytest.param(m, id=f"{m.family}:{m.name}") for m in _MUTANTS])
def test_mutant_is_killed_on_its_clauses(mutant, results):
    result = results[mutant.name]
    assert not result.survived, f"{mutant.name} survived: no test of {', '.join(mutant.kills)} failed on it"
    assert not result.missed, f"{mutant.name} was not killed by {', '.join(result.missed)} (only by {result.killed_by})"
