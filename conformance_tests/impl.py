"""Loading implementations and building variants of them (mutants, partial adapters)."""
from __future__ import annotations

import importlib
import os
import types
from typing import Any, Callable

from conformance_tests import contract

DEFAULT_IMPL = "reference_impl:make"
ENV_VAR = "RLCONFORM_IMPL"


class ImplSpecError(ValueError):
    """The ``module:factory`` string does not name a usable factory."""


def resolve_impl_string(value: str | None) -> str:
    return value or os.environ.get(ENV_VAR) or DEFAULT_IMPL


def load_impl(value: str | None = None) -> Any:
    """Import ``module:factory`` and call the factory; the result is the implementation namespace."""
    value = resolve_impl_string(value)
    if ":" not in value:
        raise ImplSpecError(f"--impl expects 'module:factory', got {value!r}")
    mod_name, _, attr = value.partition(":")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:
        raise ImplSpecError(f"--impl {value!r}: cannot import module {mod_name!r}: {e}") from e
    factory = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            raise ImplSpecError(f"--impl {value!r}: module {mod_name!r} has no attribute {attr!r}")
        factory = getattr(factory, part)
    if not callable(factory):
        raise ImplSpecError(f"--impl {value!r}: {attr!r} is not callable")
    impl = factory()
    if not any(hasattr(impl, fam) for fam in contract.FAMILIES):
        raise ImplSpecError(
            f"--impl {value!r}: the factory returned {type(impl).__name__} with none of the family "
            f"attributes {', '.join(contract.FAMILIES)}"
        )
    return impl


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
    return types.SimpleNamespace(
        name=getattr(base, "name", "implementation"),
        version=getattr(base, "version", "?"),
        **fams,
    )


def without(base: Any, family: str, *names: str) -> types.SimpleNamespace:
    """A copy of ``base`` with some operations of ``family`` removed (they become not applicable)."""
    fams = {f: getattr(base, f) for f in contract.FAMILIES if hasattr(base, f)}
    kept = {k: v for k, v in vars(fams[family]).items() if k not in names}
    fams[family] = types.SimpleNamespace(**kept)
    return types.SimpleNamespace(name=getattr(base, "name", "implementation"), version=getattr(base, "version", "?"), **fams)
