"""Loading implementations and building variants of them (mutants, partial adapters)."""
from __future__ import annotations

import types
from typing import Any, Callable

from conformance_tests import contract
from conformance_tests.preflight import DEFAULT_IMPL, ENV_VAR, build, resolve_impl_string  # noqa: F401
from conformance_tests.preflight import PreflightError as ImplSpecError  # noqa: F401  (the historical name)


def load_impl(value: str | None = None) -> Any:
    """Import ``module:factory`` and call the factory; the result is the implementation namespace."""
    return build(value)


def family_namespace(module: Any, family: str) -> types.SimpleNamespace:
    """The contract operations that ``module`` defines, as a namespace (absent ones are left out)."""
    names = contract.op_names(family)
    return types.SimpleNamespace(**{n: getattr(module, n) for n in names if hasattr(module, n)})


def override(base: Any, family: str, **ops: Callable) -> types.SimpleNamespace:
    """A copy of ``base`` whose ``family`` has ``ops`` replaced: the few lines a mutant needs."""
    known = set(contract.op_names(family))
    unknown = sorted(set(ops) - known)
    if unknown:
        raise ValueError(f"override: {family} has no contract operation(s) {unknown}")
    fams = {f: getattr(base, f) for f in contract.FAMILIES if hasattr(base, f)}
    fams[family] = types.SimpleNamespace(**{**vars(fams[family]), **ops})
    return types.SimpleNamespace(**_identity(base), **fams)


def _identity(base: Any) -> dict:
    """What a variant keeps of its base besides the families: name, version, declared capabilities."""
    return {"name": getattr(base, "name", "implementation"), "version": getattr(base, "version", "?"),
            "capabilities": dict(getattr(base, "capabilities", {}) or {})}


def without(base: Any, family: str, *names: str) -> types.SimpleNamespace:
    """A copy of ``base`` with some operations of ``family`` removed (they become not applicable)."""
    fams = {f: getattr(base, f) for f in contract.FAMILIES if hasattr(base, f)}
    kept = {k: v for k, v in vars(fams[family]).items() if k not in names}
    fams[family] = types.SimpleNamespace(**kept)
    return types.SimpleNamespace(**_identity(base), **fams)
