"""The rlconform torch reference: pure math per family, then environments and trainers on top.

``make()`` is the factory the suite loads by default (``--impl reference_impl:make``).
"""
from __future__ import annotations

import importlib
import types

__version__ = "0.1.0"
FAMILIES = ("sac", "ppo", "isreshape", "ccapo")  # the reference implements every family of the spec


def make() -> types.SimpleNamespace:
    """The reference implementation: one namespace per family holding what its ``__all__`` exports (the
    contract's operations; the suite reads those and nothing else)."""
    fams = {}
    for fam in FAMILIES:
        mod = importlib.import_module(f"reference_impl.{fam}")
        fams[fam] = types.SimpleNamespace(**{name: getattr(mod, name) for name in mod.__all__})
    # errors_name_clauses: every bad-input error names the clause it enforces (the INPUT clauses check it);
    # terminated_truncated: ops that take `done` also take `truncated=` (bootstrap through truncation only)
    return types.SimpleNamespace(name="rlconform-reference", version=__version__,
                                 capabilities={"errors_name_clauses": True, "terminated_truncated": True}, **fams)
