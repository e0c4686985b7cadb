"""Known-bad implementations: the reference with one operation replaced.

A mutant is a few lines::

    @mutant("SAC-TEMP-1", doc="V1's temperature update: log α moves with H − H_tgt")
    def v1_temperature_sign(ref):
        def temperature_update(log_alpha, entropy, target_entropy, *, lr):
            ...
        return override(ref, "sac", temperature_update=temperature_update)

``kills`` names the clause(s) whose tests must fail on it; the meta-test and ``rlconform mutants``
run only those clauses' tests. A mutant is itself a factory, so
``pytest conformance_tests --impl conformance_tests.mutants.sac:v1_temperature_sign`` works.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any, Callable

import reference_impl
from conformance_tests.impl import override, without  # noqa: F401  (re-exported for mutant modules)

REGISTRY: dict[str, "Mutant"] = {}


@dataclasses.dataclass
class Mutant:
    name: str
    family: str
    kills: tuple[str, ...]
    doc: str
    build: Callable[[Any], Any]
    source: str = ""

    @property
    def impl_string(self) -> str:
        return f"conformance_tests.mutants.{self.family}:{self.name}"

    def __call__(self):
        return self.build(reference_impl.make())


def mutant(*kills: str, doc: str, source: str = "") -> Callable[[Callable], Mutant]:
    """Register a mutant; ``kills`` are the clauses expected to fail on it; ``source`` cites the bug's origin."""
    if not kills:
        raise ValueError("a mutant must name at least one clause expected to kill it")

    def wrap(fn: Callable[[Any], Any]) -> Mutant:
        family = fn.__module__.rsplit(".", 1)[-1]
        m = Mutant(fn.__name__, family, tuple(kills), " ".join(doc.split()), fn, source)
        if m.name in REGISTRY and REGISTRY[m.name].family != family:
            raise ValueError(f"mutant name {m.name!r} is used twice")
        REGISTRY[m.name] = m
        return m

    return wrap


def deaf_to(ref, family: str, op: str, **forced):
    """The reference with ``family.op`` deaf to some keywords: whatever the caller passes, they take the given
    values (their defaults). The bug of a keyword accepted but never plumbed through."""
    base = getattr(getattr(ref, family), op)

    def deaf(*args, **kwargs):
        return base(*args, **{**kwargs, **forced})

    return override(ref, family, **{op: deaf})


def discover() -> dict[str, Mutant]:
    """Import every mutant module in this package and return the registry."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    return dict(REGISTRY)
