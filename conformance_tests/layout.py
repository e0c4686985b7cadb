"""Where the clause tests live, so a runner picks the files of a family without collecting the suite.

Clause tests are the modules ``test_<family>_<section>.py`` at this package's top; a module named after no
family (``test_defaults.py``) holds sections every family shares. Tests of the suite itself and of
the reference's own machinery live in ``meta/`` and are never part of an audit.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from rlconform.spec import FAMILIES

ROOT = Path(__file__).resolve().parent


def clause_test_files(families: Iterable[str] | None = None, clauses: Iterable[str] = ()) -> list[Path]:
    """The clause-test modules of ``families`` (every family: None), shared modules included, sorted. With
    ``clauses``, a family's module only if its text names one of them: a clause test carries its id as a literal
    mark, so this is every module that can hold one of their tests (meta/test_harness.py checks it against a
    collection), at a fraction of collecting them all."""
    wanted = set(FAMILIES if families is None else families)
    unknown = wanted - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown families {sorted(unknown)} (known: {', '.join(FAMILIES)})")
    ids = tuple(clauses)
    files = []
    for path in sorted(ROOT.glob("test_*.py")):
        owner = next((f for f in FAMILIES if path.name.startswith(f"test_{f}_")), None)
        if owner is None or (owner in wanted and (not ids or any(i in path.read_text(encoding="utf-8") for i in ids))):
            files.append(path)
    return files
