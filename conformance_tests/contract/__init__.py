"""The contract between the suite and an implementation.

An implementation is any object with one attribute per family (``impl.sac``, ``impl.ppo``,
``impl.isreshape``, ``impl.ccapo``) whose operations are plain functions, plus ``name`` and
``version``. The operations each family may provide, with their signatures, shapes and dtypes, are
the typed Protocols in this package (one module per family); the docs site renders them.

An operation an implementation leaves out is *not applicable*: its clauses are reported apart,
never failed. A family left out entirely is not applicable as a whole. An operation that handles
some inputs but not others (a dtype, masks) raises :class:`conformance_tests.NotApplicable` for the
ones it does not claim: that example is discarded, and a test left with none is not applicable.

The implementation may declare ``capabilities``, a dict. ``errors_name_clauses: True`` says its
bad-input errors name the clause they enforce (the reference does); without it, an INPUT clause
passes on any exception that rejects the bad input and fails only when the input passes silently.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Protocol

FAMILIES = ("sac", "ppo", "isreshape", "ccapo")


def protocol(family: str) -> type[Protocol]:
    """The Protocol class that documents ``family``'s operations."""
    mod = importlib.import_module(f"conformance_tests.contract.{family}")
    return mod.CONTRACT


def op_names(family: str) -> tuple[str, ...]:
    """Names of the operations in ``family``'s contract, in declaration order."""
    proto = protocol(family)
    return tuple(
        name
        for name, member in vars(proto).items()
        if not name.startswith("_") and inspect.isfunction(member)
    )


def available(family: str) -> bool:
    return importlib.util.find_spec(f"conformance_tests.contract.{family}") is not None
