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


def clause_test_files(families: Iterable[str] | None = None) -> list[Path]:
    """The clause-test modules of ``families`` (every family: None), shared modules included, sorted."""
    wanted = set(FAMILIES if families is None else families)
    unknown = wanted - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown families {sorted(unknown)} (known: {', '.join(FAMILIES)})")
    files = []
    for path in sorted(ROOT.glob("test_*.py")):
        owner = next((f for f in FAMILIES if path.name.startswith(f"test_{f}_")), None)
        if owner is None or owner in wanted:
            files.append(path)
    return files
