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
The other capabilities (defaults: what the reference does):

* ``masks: bool = True``. False: masked operations only ever receive all-legal masks, and the tests
  whose point is an illegal action or a mask boundary are not applicable.
* ``dtypes: list[str]`` (of "float16", "bfloat16", "float32", "float64"; default all four). The
  strategies draw only declared dtypes, fixed-input tests use the widest declared one, tolerances follow
  the declared input dtype, and a test about an undeclared dtype is not applicable. A half-precision dtype
  alone is a whole declaration: its inputs fit its range (float16 tops out at 65504, and its clipped
  probabilities are at least 6e-8, see SAC-MASK-2), and an answer past the range may overflow.
* ``differentiable: bool | list[str] = True``. False, or a list of op names ("ppo.value_loss") that
  leaves an op out: gradient checks on that op's outputs are not applicable; values are still checked.
* ``terminated_truncated: bool = False``. True: the operations whose contract names a ``truncated=``
  argument (``ppo.gae``, ``sac.losses``' batch) accept it, and the suite also draws truncations; their
  ``done`` then means *terminated*. Without it those ops see one ``done`` flag only.
* ``train_dtype: str | None = None`` ("float32", "bfloat16", ...): the dtype the library trains in. It changes
  no verdict: when a test fails on float64 inputs, the report also shows the failing call made again in this
  dtype, and its severity follows what users of that dtype get (a float64 residue that is 0.9 in float32 is
  major; one float32 does not show stays what it was).
* ``pinned: dict[str, dict]``: hyper-parameters the library hard-codes, by op and keyword
  (``{"sac.losses": {"kappa": 0.98}}``). The suite draws only that value for the keyword, a call that passes
  another is not applicable, and a value other than the contract's default (the seed's) is reported as a
  deviation.
* ``steps_itself: dict[str, list[str]]``: output keys of an op whose library code calls ``backward()`` and
  ``optimizer.step()`` itself, so their gradients are measured from that step
  (:func:`conformance_tests.adapters.step_gradients` with plain SGD at lr 1, returned through
  :func:`conformance_tests.adapters.measured_loss`). The report says so; only the leaves the library steps
  can show a gradient.
* ``conventions_by_clause: dict[str, dict[str, value]]``: a convention's value for some clauses only, where a
  library's ops follow different choices (verl standardises GRPO group advantages with one std and whitens PPO
  advantages with another): ``{"PPO-ADV-1": {"advantage_std": {...}}}`` overrides ``conventions`` for the tests of
  that clause.
* ``conventions: dict[str, value]``: declared departures from the seeds' conventions, by the ids and
  allowed values of ``spec/conventions.yaml`` (``{"value_loss_factor": 1.0, "mask_fill": "neg_inf"}``).
  The tests compute their oracle under the declared value and keep checking the clause's normative part;
  a clause that passes only thanks to a declared departure is reported as a *deviation* with the
  documented consequence, never as a failure. An undeclared departure still fails.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Protocol

FAMILIES = ("sac", "ppo", "isreshape", "ccapo")

# The arguments an operation updates in place, by the contract's names: the update loops step their
# networks, optimisers and temperature, and a generator advances wherever one is taken. The suite hands
# these over as the caller's own objects (an update must reach the caller); every other argument, modules'
# parameters and gradients and nested containers included, must come back unchanged.
UPDATED_IN_PLACE = {
    "sac.update_step": ("policy", "critic", "target", "log_alpha", "optimizers"),
    "ppo.ppo_update": ("actor", "critic", "optimizer"),
    "ccapo.ccapo_update": ("policy", "optimizer"),
}
ALWAYS_UPDATED = ("generator",)


def updated_in_place(op: str) -> tuple[str, ...]:
    """The contract names of the arguments ``op`` ("family.op") may, and is meant to, change in place."""
    return UPDATED_IN_PLACE.get(op, ()) + ALWAYS_UPDATED


@dataclasses.dataclass(frozen=True)
class Output:
    """One key of an op's result dict: the clause that fixes its value, what it holds, and whether the suite
    requires it (an optional key is checked when present)."""
    clause: str
    meaning: str
    required: bool = True


def outputs(op: str) -> dict[str, Output]:
    """The documented result dict of ``op`` ("family.op"), by key, in order (a family module's ``OUTPUTS``)."""
    family, _, name = op.partition(".")
    return dict(getattr(importlib.import_module(f"conformance_tests.contract.{family}"), "OUTPUTS", {}).get(name, {}))


def required_outputs(op: str) -> tuple[str, ...]:
    return tuple(k for k, o in outputs(op).items() if o.required)


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
