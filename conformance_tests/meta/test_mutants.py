"""The suite has teeth: every shipped mutant is killed on each clause it names."""
from __future__ import annotations

import pytest
from rlconform.mutants import run_mutant

from conformance_tests.mutants import discover

_MUTANTS = sorted(discover().values(), key=lambda m: (m.family, m.name))


@pytest.mark.meta
@pytest.mark.parametrize("mutant", [pytest.param(m, id=f"{m.family}:{m.name}") for m in _MUTANTS])
def test_mutant_is_killed_on_its_clauses(mutant):
    """One audit child per mutant (forked from the worker's warm server, see conftest), so xdist spreads them."""
    result = run_mutant(mutant)
    assert not result.survived, (f"{mutant.name} survived: no test of {', '.join(mutant.kills)} failed on it"
                                 if not result.killed_by else
                                 f"{mutant.name} survived: its clauses failed but the audit exited {result.exit_code}")
    assert not result.missed, f"{mutant.name} was not killed by {', '.join(result.missed)} (only by {result.killed_by})"


# Classes of bugs a conformance suite easily misses, each with a shipped mutant that the audit's exit code
# kills (the test above runs every mutant): a class without one could pass the audit unseen.
SUBTLE_BUG_CLASSES = {
    "1 SHOULD behaviour present and wrong": "ppo:advantage_eps_inside_sqrt",
    "2 declared convention honoured in part": "ppo:advantage_std_declared_float64_only",
    "3 side effect outside the result": "sac:losses_call_backward",
    "4 dtype promotion from integer inputs": "ccapo:macro_return_in_the_counts_dtype",
    "5 mechanism past a threshold": "ppo:dual_clip_left_on",
    "6 the harness's copies hide a mutation": "sac:update_clamps_a_copy_of_log_alpha",
    "7 narrow draws": "sac:masked_softmax_float32_for_large_vocabularies",
}


@pytest.mark.meta
def test_every_subtle_bug_class_has_a_shipped_mutant():
    shipped = {f"{m.family}:{m.name}" for m in _MUTANTS}
    assert {c: m for c, m in SUBTLE_BUG_CLASSES.items() if m not in shipped} == {}
