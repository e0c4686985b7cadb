"""The call wrapper and the operation proxy: every call an implementation gets goes through
:func:`call_op` (recorded, copied, within the test's deadline, checked for input mutation), and what the
report says when a test fails outside the implementation (:func:`suite_side_error`,
:func:`evidence_in_train_dtype`).
"""
from __future__ import annotations

import copy
import functools
import inspect
import os
import re
import signal
import threading
import time
from typing import Any, Callable

import numpy as np
import pytest
import torch
from rlconform.spec import same_value

from conformance_tests import contract, crashes, simdevice
from conformance_tests.errors import NotApplicable
from conformance_tests.options import KILLED_OPS_VAR
from conformance_tests.harness import state
from conformance_tests.harness.capabilities import capability, masks_supported, pinned, supports_dtype
from conformance_tests.harness.device import _to_device, _to_numpy, host, map_leaves, named_leaves
from conformance_tests.harness.failures import _fmt, fail
from conformance_tests.harness.fingerprints import _changed, _fingerprint, _hand, _snapshot
from conformance_tests.harness.repro import describe_call
from conformance_tests.harness.state import (
    NOT_APPLICABLE,
    ImplementationError,
    InputMutated,
    OpTimeout,
    _note_failure,
    _severity_of,
)


def _op_key(fn: Callable) -> tuple[int, int]:
    """The same key for every bound-method object of one method of one object (any callable, hashable or not)."""
    return id(getattr(fn, "__func__", fn)), id(getattr(fn, "__self__", None))


def _note_call_outside(name: str, args: tuple, kwargs: dict) -> None:
    path = crashes.own_path(crashes.CALL_LOG_VAR)
    if not path:
        return
    if state._CALL_LOG["path"] != path:
        state._CALL_LOG.update(fd=os.open(path, os.O_WRONLY | os.O_CREAT, 0o644), path=path)
    data = describe_call((name, args, kwargs)).encode("utf-8", "replace")[:4000]
    os.ftruncate(state._CALL_LOG["fd"], 0)
    os.pwrite(state._CALL_LOG["fd"], data, 0)


def _arg_names(fn: Callable, args: tuple, kwargs: dict) -> list[str]:
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs)
        return list(bound.arguments)[: len(args)] + list(kwargs)
    except (TypeError, ValueError):
        return [f"argument #{i + 1}" for i in range(len(args))] + list(kwargs)


def _clause_tag() -> str:
    return ", ".join(state._STATE["clauses"]) or "contract"


def _run_within_deadline(fn: Callable, name: str, args: tuple, kwargs: dict) -> Any:
    """Call ``fn``; past the test's deadline raise :class:`OpTimeout` (SIGALRM, main thread only)."""
    if state._STATE["timed_out"]:
        raise OpTimeout(state._STATE["timed_out"])
    if (hung := state._HUNG.get(_op_key(fn))) is not None:
        state._STATE["timed_out"] = (f"{name} is not called again: it did not return within an earlier test's time "
                                     f"budget ({hung[1]}) [{_clause_tag()}: {name}]")
        raise OpTimeout(state._STATE["timed_out"])
    if name in os.environ.get(KILLED_OPS_VAR, "").split(","):
        state._STATE["timed_out"] = (f"{name} is not called again: it hung an earlier test where no signal reached it, "
                                     f"and the audit had to kill that test's process [{_clause_tag()}: {name}]")
        raise OpTimeout(state._STATE["timed_out"])
    deadline = state._STATE["deadline"]
    if deadline is None or threading.current_thread() is not threading.main_thread():
        with simdevice.implementation_call():
            return fn(*args, **kwargs)
    remaining = deadline - time.monotonic()
    msg = f"{name} did not return within the test's time budget [{_clause_tag()}: {name}]"

    if state._STATE["first_failure"]:
        msg = (f"{state._STATE['first_failure'][1]}\n(the test's time budget ran out while Hypothesis was shrinking "
               "this failure: the example is the first one found, not the smallest)")

    def expire(signum, frame):
        state._STATE["timed_out"] = msg
        if not state._STATE["first_failure"]:  # a real hang, not a shrink that ran long
            state._HUNG.setdefault(_op_key(fn), (fn, msg))
        raise OpTimeout(msg)

    if remaining <= 0:
        expire(None, None)
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, remaining)
    try:
        with simdevice.implementation_call():
            return fn(*args, **kwargs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _declared_not_applicable(name: str, e: NotApplicable):
    """Discard this example (hypothesis) or skip this test (a fixed-input test) as not applicable."""
    import hypothesis
    from hypothesis.control import currently_in_test_context

    state._STATE["not_applicable"] += 1
    if currently_in_test_context():
        hypothesis.reject()
    pytest.skip(f"{NOT_APPLICABLE} {name}: {e}")


# Families whose ``*mask*`` arguments are action masks (isreshape's and ccapo's mask tokens or steps).
_ACTION_MASK_FAMILIES = ("sac", "ppo")


def _illegal_action_mask(name: str, fn: Callable, args: tuple, kwargs: dict) -> str | None:
    """The argument holding an illegal action (a False in a bool action mask), for ``masks: False``."""
    if name.split(".")[0] not in _ACTION_MASK_FAMILIES:
        return None

    def illegal(x, key: str) -> bool:
        if isinstance(x, dict):
            return any(illegal(v, k) for k, v in x.items())
        return ("mask" in key and isinstance(x, torch.Tensor) and x.dtype == torch.bool
                and x.device.type != "meta" and not bool(x.all()))

    return next((n for n, v in zip(_contract_arg_names(name, fn, args, kwargs), list(args) + list(kwargs.values()))
                 if illegal(v, n)), None)


def _contract_arg_names(name: str, fn: Callable, args: tuple, kwargs: dict) -> list[str]:
    """Argument names as the contract spells them (an adapter's own names, or ``*args``, may differ)."""
    family, op = name.split(".", 1)
    try:
        proto = getattr(contract.protocol(family), op)
    except (AttributeError, ImportError):
        return _arg_names(fn, args, kwargs)
    return _arg_names(functools.partial(proto, None), args, kwargs)


def call_op(fn: Callable, name: str, args: tuple, kwargs: dict, *, wrap_errors: bool) -> Any:
    """Record, copy, call within the deadline, then check that no input was changed in place.

    The state an operation updates (``contract.updated_in_place``: networks, optimisers, the temperature
    of an update step, a generator) is handed over as the caller's own object. Every other argument goes
    to the device as a copy, and must come back as it went: tensors, nested containers and their plain
    values, modules' parameters and gradients (an op that only computes losses must not call backward),
    optimisers' state.

    With ``masks: False`` declared, a call whose action mask holds an illegal action is never made: the
    example (or the fixed-input test) is not applicable."""
    if not masks_supported() and (where := _illegal_action_mask(name, fn, args, kwargs)):
        _declared_not_applicable(name, NotApplicable(f"{where} holds an illegal action; the implementation "
                                                     "declares masks=False"))
    if clash := _pinned_clash(name, kwargs):
        _declared_not_applicable(name, NotApplicable(clash))
    snap_args, snap_kwargs = _snapshot(args), _snapshot(kwargs)
    state._STATE["calls"].append((name, snap_args, snap_kwargs))
    state._STATE["last_fn"] = fn
    _note_call_outside(name, snap_args, snap_kwargs)
    names = _contract_arg_names(name, fn, args, kwargs)
    updated = _updated_in_place(name)
    handed = [v if n in updated else _hand(_to_device(v)) for n, v in zip(names, [*args, *kwargs.values()])]
    handed_args, handed_kwargs = tuple(handed[:len(args)]), dict(zip(kwargs, handed[len(args):]))
    before = {n: _fingerprint(v) for n, v in zip(names, handed) if n not in updated}
    settings = _global_settings()
    try:
        out = _run_within_deadline(fn, name, handed_args, handed_kwargs)
        state._STATE["last_result"] = (name, _describe_result(out))
    except NotApplicable as e:
        _declared_not_applicable(name, e)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - any exception from the implementation is an error
        if not wrap_errors:
            raise
        if undeclared := _undeclared_dtypes(args, kwargs):  # refusing what it never claimed is its right
            _declared_not_applicable(name, NotApplicable(f"it raised {type(e).__name__} on {undeclared} input, "
                                                         "a dtype it does not declare (capabilities['dtypes'])"))
        err = f"{describe_call((name, args, kwargs))} raised {type(e).__name__}: {e}"
        _note_failure("error", err)
        raise ImplementationError(err) from e
    finally:
        changed = _restore_global_settings(settings)
    if changed:
        fail(_clause_tag(), f"{name} left {', '.join(changed)}", "every process-wide setting as the call found it",
             "later calls, the caller's training loop included, would run under the changed setting")
    _check_result_type(name, out)
    _check_result_device(name, handed_args, handed_kwargs, out)
    _check_outputs(name, out)
    for position, (arg_name, h) in enumerate(zip(names, handed)):
        where = arg_name in before and _changed(_fingerprint(h), before[arg_name], arg_name)
        if where:
            state._STATE["mutated"] = (len(state._STATE["calls"]) - 1, position, arg_name)  # the repro shows it
            what = (f"left a gradient in {where!r} (it called backward)" if ".grad'" in where
                    else f"modified its input {where!r} in place")
            msg = (f"{name} {what}; an operation must leave its arguments unchanged: it computes, the caller "
                   f"steps [{_clause_tag()}: {describe_call((name, args, kwargs))}]")
            _note_failure("fail", msg)
            raise InputMutated(msg)
    return out


def _undeclared_dtypes(args: tuple, kwargs: dict) -> str:
    """The floating dtypes among a call's tensors that the implementation does not declare, as text."""
    found = {str(v.dtype).replace("torch.", "") for _, v in named_leaves((args, kwargs))
             if isinstance(v, torch.Tensor) and v.is_floating_point()}
    return "/".join(sorted(d for d in found if not supports_dtype(d)))


def _flushes_denormals() -> bool:
    """torch.set_flush_denormal has no getter: a subnormal double reads as zero while it is on."""
    return bool(torch.tensor([1e-323], dtype=torch.float64, device="cpu")[0] == 0)


# Process-wide settings an operation could change and leave for every later call: (read, restore).
_SETTINGS = {
    "grad mode": (torch.is_grad_enabled, torch.set_grad_enabled),
    "deterministic algorithms": (torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms),
    "the float32 matmul precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    "TF32 matmuls on CUDA": (lambda: torch.backends.cuda.matmul.allow_tf32,
                             lambda v: setattr(torch.backends.cuda.matmul, "allow_tf32", v)),
    "cuDNN's TF32": (lambda: torch.backends.cudnn.allow_tf32, lambda v: setattr(torch.backends.cudnn, "allow_tf32", v)),
    "cuDNN benchmarking": (lambda: torch.backends.cudnn.benchmark,
                           lambda v: setattr(torch.backends.cudnn, "benchmark", v)),
    "the default dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "anomaly detection": (torch.is_anomaly_enabled, torch.set_anomaly_enabled),
    "denormal flushing": (_flushes_denormals, torch.set_flush_denormal),
    "numpy's floating-point error handling": (np.geterr, lambda v: np.seterr(**v)),
}


def _global_settings() -> dict[str, Any]:
    return {what: read() for what, (read, _) in _SETTINGS.items()}


def _restore_global_settings(before: dict[str, Any]) -> list[str]:
    """Put back every setting the call changed (the rest of the test must not inherit it); what it changed."""
    changed = []
    for what, (read, restore) in _SETTINGS.items():
        now = read()
        if now != before[what]:
            restore(before[what])
            changed.append(f"{what} {now!r} (it was {before[what]!r})")
    return changed


def _contract_member(name: str) -> Any:
    """The contract Protocol's method for ``family.op``, or None."""
    fam, _, op = name.partition(".")
    try:
        return getattr(contract.protocol(fam), op)
    except (AttributeError, ModuleNotFoundError):
        return None


@functools.lru_cache(maxsize=None)
def _return_annotation(name: str) -> str | None:
    """The contract's return annotation of ``family.op`` as written (``Tensor``, ``tuple[Tensor, Tensor]``)."""
    member = _contract_member(name)
    if member is None:
        return None
    ret = inspect.signature(member).return_annotation
    return ret if isinstance(ret, str) else getattr(ret, "__name__", str(ret))


def _check_result_type(name: str, out: Any) -> None:
    """A result the contract types as a Tensor (or a tuple of them) must be one: a numpy array or a Python
    number has the right values and breaks every caller that differentiates or stays on the device."""
    ret = _return_annotation(name)
    if ret == "Tensor":
        wrong = None if isinstance(out, torch.Tensor) else _describe_result(out)
    elif ret and (m := re.fullmatch(r"tuple\[(Tensor(?:, Tensor)*)\]", ret)):
        n = m.group(1).count("Tensor")
        ok = isinstance(out, (tuple, list)) and len(out) == n and all(isinstance(v, torch.Tensor) for v in out)
        wrong = None if ok else _describe_result(out)
    else:
        return
    if wrong:
        fail(_clause_tag(), f"{name} returned {wrong}", f"{ret}, the contract's return type",
             f"The contract: {name} {contract_return(name)}")


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def _result_tensors(out: Any):
    """(where, tensor) for every tensor a result (or the arguments) holds, a network's parameters and buffers
    included."""
    for where, v in named_leaves(out):
        if isinstance(v, torch.nn.Module):
            yield from ((f"{where}.{n}", t) for n, t in [*v.named_parameters(), *v.named_buffers()])
        elif isinstance(v, torch.Tensor):
            yield where, v


def _check_result_device(name: str, args: tuple, kwargs: dict, out: Any) -> None:
    """A result stays on the device of its inputs: one that comes back on the host passes every value test, and
    breaks the caller's next operation on the GPU ("Expected all tensors to be on the same device") or costs a
    host sync per call. Checked when the inputs were on the audited device and it is not the CPU."""
    dev = torch.device(state.session_device())
    if dev.type == "cpu" or not any(_same_device(t.device, dev) for _, t in _result_tensors((args, kwargs))):
        return
    off = [(w, t.device) for w, t in _result_tensors(out) if not _same_device(t.device, dev)]
    if off:
        where, got = off[0]
        fail(_clause_tag(), f"result{where or ''} on {got}", f"on {dev}, the device of its inputs",
             f"{name} moved {len(off)} result tensor(s) off the device; the caller's next operation on {dev} "
             "would raise or wait for a copy")


def _check_outputs(name: str, out: Any) -> None:
    """An op with a documented result dict (``contract.outputs``) must return every required key: a missing
    one fails the clause that fixes it, naming the key, instead of a KeyError deep in a test."""
    documented = contract.outputs(name)
    missing = [k for k, o in documented.items() if o.required and not (isinstance(out, dict) and k in out)]
    if missing:
        fail(_clause_tag(), sorted(out) if isinstance(out, dict) else type(out).__name__,
             f"a dict with the keys {list(contract.required_outputs(name))}",
             f"{name} returned no " + ", ".join(f"{k!r} ({documented[k].clause})" for k in missing)
             + f": the contract's OUTPUTS[{name.split('.', 1)[1]!r}] requires it")


def _pinned_clash(name: str, kwargs: dict) -> str | None:
    """Why a call cannot be made to a library that hard-codes some of ``name``'s hyper-parameters (``pinned``):
    it passes another value. A keyword the call leaves out gets the library's value, as every user's call does:
    a test whose oracle depends on a keyword passes it."""
    for key, value in pinned(name).items():
        if key in kwargs and not same_value(kwargs[key], value):
            return (f"{key}={kwargs[key]!r}, but the library hard-codes {key}={value!r} "
                    "(impl.capabilities['pinned'])")
    return None


def _updated_in_place(name: str) -> set[str]:
    return set(contract.updated_in_place(name))


def _cast_floats(x: Any, src: torch.dtype, dst: torch.dtype) -> Any:
    """``x`` with every ``src`` tensor (and module) as ``dst``; containers walked, modules copied."""
    def leaf(v):
        if isinstance(v, torch.Tensor):
            return v.detach().to(dst).requires_grad_(v.requires_grad) if v.dtype == src else v
        return copy.deepcopy(v).to(dst) if isinstance(v, torch.nn.Module) else v
    return map_leaves(leaf, x)


def _float_leaves(x: Any) -> list[np.ndarray]:
    return [_to_numpy(v).astype(np.float64).ravel() for _, v in named_leaves(host(x))
            if isinstance(v, torch.Tensor) and v.is_floating_point()]


def _describe_result(x: Any, depth: int = 0) -> str:
    """What an operation returned, in words: type, and for tensors shape, dtype, device and gradient."""
    if isinstance(x, torch.Tensor):
        grad = ", requires_grad" if x.requires_grad else ", no gradient"
        return f"a {str(x.dtype).replace('torch.', '')} tensor of shape {tuple(x.shape)} on {x.device.type}{grad}"
    if depth < 1 and isinstance(x, dict):
        return "a dict {" + ", ".join(f"{k!r}: {_describe_result(v, depth + 1)}" for k, v in list(x.items())[:6]) + "}"
    if depth < 1 and isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of {len(x)} (" + ", ".join(_describe_result(v, depth + 1) for v in x[:6]) + ")"
    if isinstance(x, np.ndarray):
        return f"a numpy {x.dtype} array of shape {x.shape}"
    return f"a {type(x).__name__}"


def contract_return(name: str) -> str | None:
    """The contract's return annotation and the first line of its documentation for ``family.op``."""
    member = _contract_member(name)
    if member is None:
        return None
    flat = " ".join((inspect.getdoc(member) or "").split())
    m = re.search(r"[.;](\s|$)", flat)  # the first sentence, however the docstring wraps it
    doc = flat[:m.start()] if m else flat
    return f"returns {_return_annotation(name)}" + (f": {doc}" if doc else "")


def suite_side_error(exc: BaseException) -> str | None:
    """When a test raised outside the implementation (the suite could not check a result: a wrong type,
    a result with no gradient, another device), a message that names the result and the contract, instead
    of a traceback of the suite's comparison code that reads as the user's bug. None if no call was made."""
    last = state._STATE.get("last_result")
    if not last or not state._STATE["calls"] or last[0] != state._STATE["calls"][-1][0]:
        return None
    name, what = last
    hint = ""
    text = str(exc)
    if "does not require grad" in text or "does not have a grad_fn" in text:
        hint = " It carries no gradient: the loss was detached or computed under no_grad, and the clause differentiates it."
    elif "meta" in text or "device" in text.lower():
        hint = " It is not on the device its inputs were on."
    contract_text = contract_return(name)
    return (f"{name} returned {what}; the suite could not check it ({type(exc).__name__}: {text.splitlines()[0] if text else ''})."
            + hint + (f" The contract: {name} {contract_text}." if contract_text else "")
            + f" [{_clause_tag()}: {describe_call(state._STATE['calls'][-1])}]")


def evidence_in_train_dtype() -> dict | None:
    """The failing test's last call made again in the dtype the implementation trains in (capability
    ``train_dtype``), when the test ran it in float64: what the library's users actually get. A float64
    residue may be nothing in float32, or a float64 near-miss may be a large error there.

    Returns ``{"dtype", "float64", "train", "max_difference", "severity"}`` or None (nothing to redo)."""
    td = capability("train_dtype", None)
    if not td or not state._STATE["calls"] or state._STATE.get("last_fn") is None:
        return None
    dst = getattr(torch, str(td).replace("torch.", ""))
    name, args, kwargs = state._STATE["calls"][-1]
    if dst == torch.float64 or not any(isinstance(v, torch.Tensor) and v.dtype == torch.float64
                                       for _, v in named_leaves([args, kwargs])):
        return None
    fn = state._STATE["last_fn"]
    try:
        wide = fn(*_to_device(copy.deepcopy(args)), **_to_device(copy.deepcopy(kwargs)))
        narrow = fn(*_to_device(_cast_floats(args, torch.float64, dst)),
                    **_to_device(_cast_floats(kwargs, torch.float64, dst)))
    except Exception as e:  # noqa: BLE001 - the evidence is a courtesy: its failure must not change the verdict
        return {"dtype": str(dst).replace("torch.", ""), "error": f"{type(e).__name__}: {e}"[:300]}
    w, n = _float_leaves(wide), _float_leaves(narrow)
    if not w or len(w) != len(n) or any(a.shape != b.shape for a, b in zip(w, n)):
        return None
    w, n = np.concatenate(w), np.concatenate(n)
    fin = np.isfinite(w) & np.isfinite(n)
    diff = float(np.max(np.abs(w[fin] - n[fin]), initial=0.0))
    # against the float64 result: agreeing to 1e-3 of the scale is that dtype's rounding, the float64 finding
    # stands as it was (None); more is a defect far larger in the dtype the library trains in
    severity = _severity_of(n, w, diff, residue=1e-3)
    severity = None if severity == "minor" else severity
    return {"dtype": str(dst).replace("torch.", ""), "float64": _fmt(host(wide)), "train": _fmt(host(narrow)),
            "max_difference": diff, "severity": severity}


class FamilyProxy:
    """Attribute access returns a recording wrapper around the implementation's operation."""

    def __init__(self, family: str, namespace: Any | None):
        self._family = family
        self._ns = namespace

    def has(self, op: str) -> bool:
        return self._ns is not None and callable(getattr(self._ns, op, None))

    def raw(self, op: str) -> Callable:
        """The operation, recorded but with its exceptions unwrapped: for tests that expect it to raise."""
        return self._wrapped(op, wrap_errors=False)

    def _require(self, op: str) -> None:
        if self._ns is None:
            pytest.skip(f"{NOT_APPLICABLE} the implementation has no {self._family} family")
        if not callable(getattr(self._ns, op, None)):
            pytest.skip(f"{NOT_APPLICABLE} {self._family}.{op} is not provided")

    def __getattr__(self, op: str) -> Callable:
        if op.startswith("_") or op not in contract.op_names(self._family):
            raise AttributeError(f"{op!r} is not an operation of the {self._family} contract")
        return self._wrapped(op, wrap_errors=True)

    def _wrapped(self, op: str, *, wrap_errors: bool) -> Callable:
        self._require(op)
        fn, name = getattr(self._ns, op), f"{self._family}.{op}"

        def call(*args, **kwargs):
            return call_op(fn, name, args, kwargs, wrap_errors=wrap_errors)

        call.__name__ = op
        return call
