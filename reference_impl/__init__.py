"""The rlconform torch reference: pure math per family, then environments and trainers on top.

``make()`` is the factory the suite loads by default (``--impl reference_impl:make``).
"""
from __future__ import annotations

import importlib
import importlib.util
import types

__version__ = "0.1.0"


def make() -> types.SimpleNamespace:
    """The reference implementation: one namespace per family holding its contract operations."""
    from conformance_tests import contract
    from conformance_tests.impl import family_namespace

    fams = {}
    for fam in contract.FAMILIES:
        if importlib.util.find_spec(f"reference_impl.{fam}") and contract.available(fam):
            fams[fam] = family_namespace(importlib.import_module(f"reference_impl.{fam}"), fam)
    # errors_name_clauses: every bad-input error names the clause it enforces (the INPUT clauses check it);
    # terminated_truncated: ops that take `done` also take `truncated=` (bootstrap through truncation only)
    return types.SimpleNamespace(name="rlconform-reference", version=__version__,
                                 capabilities={"errors_name_clauses": True, "terminated_truncated": True}, **fams)
