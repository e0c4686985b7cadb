"""What the implementation declares about itself (``impl.capabilities``): masks, dtypes, gradients,
conventions, and the *not applicable* verdict a test takes when its point is something undeclared.
"""
from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from rlconform.spec import DTYPES, default_spec, same_value

from conformance_tests import contract
from conformance_tests.harness import state
from conformance_tests.harness.state import NOT_APPLICABLE, ImplementationError


def set_capabilities(capabilities: dict | None) -> None:
    state._STATE["capabilities"] = dict(capabilities or {})


def declared_capabilities() -> dict:
    """A copy of everything the implementation declares (to restore after a meta-test changes it)."""
    return dict(state._STATE["capabilities"])


def capability(name: str, default: Any = None) -> Any:
    """What the implementation declares about itself (``impl.capabilities``), e.g. ``errors_name_clauses``."""
    return state._STATE["capabilities"].get(name, default)


# What an implementation may declare in ``impl.capabilities`` besides ``errors_name_clauses`` (documented
# in conformance_tests/contract/__init__.py); the defaults are what the reference does. Undeclared
# ``dtypes`` means every dtype the suite tests (the reference's, spec.DTYPES), so the reference keeps its half tests.
CAPABILITY_DEFAULTS = {"masks": True, "dtypes": list(DTYPES), "differentiable": True,
                       "terminated_truncated": False, "train_dtype": None, "pinned": {}, "steps_itself": {},
                       "conventions_by_clause": {}}


def not_applicable(reason: str) -> None:
    """End the current test as *not applicable*: its whole point is something the implementation declares
    it does not do (``masks: False`` for an illegal-action boundary...). Never an error, never a pass."""
    pytest.skip(f"{NOT_APPLICABLE} {reason}")


def reported(out: dict, key: str, op: str) -> Any:
    """``out[key]`` of an op's result dict; a diagnostic the implementation does not compute makes the check
    that reads it *not applicable* (never a KeyError): tests demand only the keys the contract requires."""
    if key not in out:
        not_applicable(f"{op} reports no {key!r}")
    return out[key]


def masks_supported() -> bool:
    """``masks`` (default True). False: masked ops only ever receive all-legal masks."""
    return bool(capability("masks", CAPABILITY_DEFAULTS["masks"]))


def require_masks(what: str = "this test needs an illegal action") -> None:
    """Not applicable unless the implementation handles masks with illegal actions."""
    if not masks_supported():
        not_applicable(f"{what}; the implementation declares masks=False")


def declared_dtypes() -> tuple[torch.dtype, ...]:
    """The floating dtypes the implementation declares (``dtypes``), in the order of :data:`DTYPES`."""
    names = capability("dtypes", CAPABILITY_DEFAULTS["dtypes"]) or ()
    unknown = sorted(set(names) - set(DTYPES))
    if unknown:
        raise ImplementationError(f"impl.capabilities['dtypes'] names unknown dtype(s) {unknown} (known: {DTYPES})")
    return tuple(getattr(torch, n) for n in DTYPES if n in names)


def supports_dtype(dtype: torch.dtype | str) -> bool:
    return str(dtype).replace("torch.", "") in {str(d).replace("torch.", "") for d in declared_dtypes()}


def require_dtype(dtype: torch.dtype | str) -> None:
    """Not applicable when the test is about a dtype the implementation does not declare."""
    if not supports_dtype(dtype):
        not_applicable(f"{str(dtype).replace('torch.', '')} is not among the declared dtypes")


def working_dtype(preferred: torch.dtype = torch.float64) -> torch.dtype:
    """``preferred`` when declared, else the widest declared dtype: fixed-input tests build their inputs in
    it and take the clause's tolerance for it."""
    dts = declared_dtypes()
    if not dts:
        not_applicable("the implementation declares no floating dtype")
    return preferred if preferred in dts else dts[-1]


def differentiable(op: str) -> bool:
    """``differentiable`` (default True): False, or a list of op names ("ppo.gae") without ``op``, says the
    op's outputs carry no gradient; gradient checks on them are then not applicable (values still checked)."""
    decl = capability("differentiable", CAPABILITY_DEFAULTS["differentiable"])
    return bool(decl) if isinstance(decl, bool) else op in set(decl or ())


def require_differentiable(op: str) -> None:
    if not differentiable(op):
        not_applicable(f"{op}: the implementation declares its outputs carry no gradient")


def terminated_truncated() -> bool:
    """``terminated_truncated`` (default False): ops that take ``done`` also accept ``truncated=``."""
    return bool(capability("terminated_truncated", CAPABILITY_DEFAULTS["terminated_truncated"]))


def declared_conventions(clauses) -> dict:
    """The conventions the implementation declares for a test of ``clauses``: ``conventions``, with the values
    ``conventions_by_clause`` gives one of these clauses in their place (a library whose ops follow different
    choices, e.g. one std for group advantages and another for whitened PPO advantages)."""
    declared = dict(capability("conventions") or {})
    by_clause = capability("conventions_by_clause") or {}
    for c in clauses:
        declared.update(by_clause.get(c) or {})
    return declared


def declares(name: str) -> bool:
    """Whether the implementation declares convention ``name`` at all (even at the seed's value)."""
    return name in declared_conventions(state._STATE["clauses"])


def convention(name: str, clause: str | None = None, *, record: bool = True) -> Any:
    """The value of convention ``name`` (spec/conventions.yaml) the test's oracle must follow.

    The implementation's declared value (``impl.capabilities["conventions"][name]``) or, undeclared, the
    seed's value for ``clause`` (default: the current test's clauses; a family's document may fix its own).
    A declared value other than the seed's is recorded as a deviation of the current test, which then
    passes with status *deviation*, never plain pass. A value outside the convention's allowed values is
    the implementation's error. ``record=False`` only peeks: for an oracle that follows the declared value
    on the inputs where it binds and records it there (a clamp that no drawn token reaches is no deviation).
    """
    conv = default_spec().convention(name)
    clauses = (clause,) if clause else state._STATE["clauses"]
    seed = conv.seed_for(clauses)
    declared = declared_conventions(clauses)
    if name not in declared:
        return seed
    value = declared[name]
    if not conv.allows(value):
        raise ImplementationError(f"impl.capabilities convention {name!r} = {value!r} is not an allowed value "
                                  f"(spec/conventions.yaml: {conv.allowed})")
    if record and not same_value(value, seed):
        state._STATE["deviations"][name] = {"convention": name, "declared": value, "seed": seed,
                                            "consequence": conv.consequence(value)}
    return value


def pinned(op: str) -> dict[str, Any]:
    """The keyword hyper-parameters of ``op`` ("family.op") the library hard-codes (``pinned``), by name."""
    return dict((capability("pinned") or {}).get(op) or {})


def contract_default(op: str, name: str) -> Any:
    """The default the contract gives keyword ``name`` of ``op`` (the seed's value), or ``inspect.Parameter.empty``."""
    family, fn = op.split(".", 1)
    param = inspect.signature(getattr(contract.protocol(family), fn)).parameters.get(name)
    return param.default if param is not None else inspect.Parameter.empty


def pin(op: str, kwargs: dict) -> dict:
    """``kwargs`` with the library's hard-coded values in place of the drawn ones, so that the audit checks the
    value users actually get instead of discarding every example. A hard-coded value other than the contract's
    default is recorded as a deviation of the current test, like a declared convention."""
    out = dict(kwargs)
    for name, value in pinned(op).items():
        if name not in out:
            continue
        out[name] = value
        seed = contract_default(op, name)
        if seed is not inspect.Parameter.empty and not same_value(value, seed):
            state._STATE["deviations"][f"pinned {op}({name})"] = {
                "convention": f"pinned {op}({name})", "declared": value, "seed": seed,
                "consequence": f"hard-coded by the library: a user cannot set {name}, and the audit checks {op} "
                               f"at {value!r} only"}
    return out


def pin_value(op: str, name: str, value: Any) -> Any:
    """One keyword through :func:`pin`: the library's hard-coded value when it declares one, else ``value``."""
    return pin(op, {name: value})[name]


def steps_itself(op: str) -> tuple[str, ...]:
    """The output keys of ``op`` whose gradients the adapter measured from the library's own optimiser step
    (``steps_itself``): the library calls backward() and step() itself, so only the leaves it steps are seen."""
    return tuple((capability("steps_itself") or {}).get(op) or ())


def deviations() -> list[dict]:
    """The deviations the current test's oracle followed (see :func:`convention`), by convention id."""
    return [dict(d) for _, d in sorted(state._STATE["deviations"].items())]
