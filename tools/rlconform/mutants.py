"""Run the suite against every shipped mutant and say which clause killed it."""
from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

from rlconform import launch
from rlconform.audit import FAILED, clause_report, run_suite

KILLED = FAILED


@dataclasses.dataclass
class MutantResult:
    name: str
    family: str
    doc: str
    expected: tuple[str, ...]
    killed_by: list[str]  # expected clauses that failed on it
    also_tripped: list[str]  # other clauses that failed (only known with --full)
    exit_code: int = 1  # the audit's: a mutant is killed only when the audit fails (exit 1)

    @property
    def survived(self) -> bool:
        """A failing test is not enough: the audit a user runs must exit 1 on the mutant."""
        return not self.killed_by or self.exit_code != 1

    @property
    def missed(self) -> list[str]:
        """Expected clauses that did not fail: the mutant is killed, but not where it claims."""
        return [c for c in self.expected if c not in self.killed_by]


def select(names: Iterable[str] | None = None, families: Iterable[str] | None = None):
    # the mutants build on the reference (torch): imported when chosen, so the CLI starts without torch
    from conformance_tests.mutants import discover

    reg = discover()
    chosen = list(reg.values())
    if names:
        unknown = sorted(set(names) - set(reg))
        if unknown:
            raise ValueError(f"unknown mutant(s) {unknown}; known: {', '.join(sorted(reg))}")
        chosen = [reg[n] for n in names]
    if families:
        chosen = [m for m in chosen if m.family in set(families)]
    return chosen


def run_mutant(m, *, full: bool = False, profile: str = "mutant") -> MutantResult:
    payload = run_suite(m.impl_string, profile=profile, clauses=None if full else m.kills)
    report = clause_report(payload)
    failed = [c["id"] for c in report["clauses"] if c["status"] in KILLED]
    return MutantResult(
        name=m.name, family=m.family, doc=m.doc, expected=m.kills,
        killed_by=[c for c in m.kills if c in failed],
        also_tripped=[c for c in failed if c not in m.kills], exit_code=report["summary"]["exit_code"],
    )


def run_mutants(mutants, *, jobs: int | None = None, full: bool = False, profile: str = "mutant",
                on_result: Callable[[MutantResult], None] | None = None) -> list[MutantResult]:
    """Every mutant, ``jobs`` at a time, in order; each is its own pytest process, forked from the warm forkserver."""
    mutants = list(mutants)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(mutants) or 1))

    def one(m):
        result = run_mutant(m, full=full, profile=profile)
        if on_result:
            on_result(result)
        return result

    with launch.warm(), ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, mutants))
