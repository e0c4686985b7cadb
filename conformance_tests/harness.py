"""What every test module uses: the operation proxy, the call recorder, and the assertion helpers.

A test never calls an implementation directly: it goes through :class:`FamilyProxy` (the ``sac``,
``ppo``, ... fixtures), which

* turns a missing operation into *not applicable* (a skip the report counts apart),
* wraps an exception raised by the implementation in :class:`ImplementationError`, so the report
  can say ``error`` rather than ``fail``,
* hands the operation copies of its tensor arguments and fails the test if the operation changed
  one in place (the caller's tensors stay intact, so the oracle and the repro see the original values),
* enforces the test's time budget inside the call (a hung operation marks the test *timeout*),
* records every call, so a failure message can name it and carry a runnable repro snippet.

Assertion helpers word their failures as ``got X, but should be Y [CLAUSE: call]``.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import math
import os
import re
import signal
import threading
import time
from typing import Any, Callable, Iterable

import numpy as np
import pytest
import torch
from rlconform.spec import default_spec, same_value

from conformance_tests import contract, simdevice
from conformance_tests.errors import NotApplicable
from conformance_tests.oracles import huber

NOT_APPLICABLE = "not applicable:"

# The session's state: the implementation string printed in repros, the device, and the current
# test's calls, clauses and deadline.
_STATE: dict[str, Any] = {"impl": "reference_impl:make", "device": "cpu", "calls": [], "clauses": (),
                          "deadline": None, "timed_out": None, "first_failure": None, "not_applicable": 0,
                          "severity": None, "last_result": None, "capabilities": {},
                          "deviations": {}}


# operation (the implementation's callable) -> the message of the time-out it hit in this process: a hung
# operation is not called again, so an op that hangs under every test costs one test's budget, not one
# per test that calls it
_HUNG: dict[tuple[int, int], tuple[Callable, str]] = {}  # keyed by _op_key; the value keeps the op alive


def _op_key(fn: Callable) -> tuple[int, int]:
    """The same key for every bound-method object of one method of one object (any callable, hashable or not)."""
    return id(getattr(fn, "__func__", fn)), id(getattr(fn, "__self__", None))


class ImplementationError(Exception):
    """The implementation raised where the test expected a result."""


class InputMutated(AssertionError):
    """The implementation changed one of its input tensors in place."""


class OpTimeout(BaseException):
    """The test's time budget ran out inside the implementation.

    A BaseException, so that Hypothesis neither retries nor shrinks the hung call: the test ends at once.
    """


# ``rlconform audit`` names a file here: the call about to be made is written to it (one short line,
# replaced at each call), so if the implementation kills the process (a segfault, os._exit) the audit
# can still say which call did it. One os.pwrite per call; nothing when the variable is unset.
_CALL_LOG: dict[str, Any] = {"fd": None, "path": None}


def _note_call_outside(name: str, args: tuple, kwargs: dict) -> None:
    path = os.environ.get("RLCONFORM_CALL_LOG")
    if not path:
        return
    if _CALL_LOG["path"] != path:
        _CALL_LOG.update(fd=os.open(path, os.O_WRONLY | os.O_CREAT, 0o644), path=path)
    data = describe_call((name, args, kwargs)).encode("utf-8", "replace")[:4000]
    os.ftruncate(_CALL_LOG["fd"], 0)
    os.pwrite(_CALL_LOG["fd"], data, 0)


def reset_calls() -> None:
    _STATE["calls"] = []


def begin_test(*, clauses: Iterable[str] = (), timeout: float | None = None) -> None:
    """Start a test: no recorded calls, its clauses (named in failures), and its time budget."""
    _STATE.update(calls=[], clauses=tuple(clauses), timed_out=None, first_failure=None, not_applicable=0,
                  deviations={}, severity=None, last_result=None,
                  deadline=time.monotonic() + timeout if timeout else None)


# Severity (rlconform.spec.SEVERITIES): critical when training breaks (NaN/inf where the answer is finite,
# or the implementation raised), major for a wrong result or decision, minor for a numerical residue within
# RESIDUE of the answer's scale that a tight tolerance still rejects.
RESIDUE = 1e-6


def _note_failure(kind: str, message: str, severity: str | None = None) -> None:
    """Remember the test's first failure: if the time budget then runs out while Hypothesis shrinks it,
    the verdict is that failure (unshrunk), not a timeout. The severity is the latest failure's: after
    shrinking, Hypothesis replays the minimal example last, and that is the one the report shows."""
    if _STATE["first_failure"] is None:
        _STATE["first_failure"] = (kind, message)
    _STATE["severity"] = severity or ("critical" if kind == "error" else "major")


def failure_severity() -> str | None:
    """The severity of the current test's reported failure (None when nothing failed)."""
    return _STATE["severity"]


def _severity_of(got: np.ndarray, expected: np.ndarray, err: float, residue: float = RESIDUE) -> str:
    """critical (non-finite where ``expected`` is finite), minor (``err`` within ``residue`` of the scale of
    ``expected``, at least 1) or major."""
    if (~np.isfinite(got) & np.isfinite(expected)).any():
        return "critical"
    scale = float(np.max(np.abs(expected[np.isfinite(expected)]), initial=0.0))
    return "minor" if math.isfinite(err) and err <= residue * max(scale, 1.0) else "major"


def first_failure() -> tuple[str, str] | None:
    """("fail" | "error", message) of the current test's first failure, or None."""
    return _STATE["first_failure"]


def not_applicable_calls() -> int:
    """How many calls of the current test the implementation declared not applicable."""
    return _STATE["not_applicable"]


def set_capabilities(capabilities: dict | None) -> None:
    _STATE["capabilities"] = dict(capabilities or {})


def declared_capabilities() -> dict:
    """A copy of everything the implementation declares (to restore after a meta-test changes it)."""
    return dict(_STATE["capabilities"])


def capability(name: str, default: Any = None) -> Any:
    """What the implementation declares about itself (``impl.capabilities``), e.g. ``errors_name_clauses``."""
    return _STATE["capabilities"].get(name, default)


# ----------------------------------------------------------------------------- declared capabilities
# What an implementation may declare in ``impl.capabilities`` besides ``errors_name_clauses`` (documented
# in conformance_tests/contract/__init__.py); the defaults are what the reference does. Undeclared
# ``dtypes`` means every dtype the suite tests (the reference's), so the reference keeps its half tests.
DTYPES = ("float16", "bfloat16", "float32", "float64")
CAPABILITY_DEFAULTS = {"masks": True, "dtypes": list(DTYPES), "differentiable": True,
                       "terminated_truncated": False, "train_dtype": None}


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


def declares(name: str) -> bool:
    """Whether the implementation declares convention ``name`` at all (even at the seed's value)."""
    return name in (capability("conventions") or {})


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
    seed = conv.seed_for((clause,) if clause else _STATE["clauses"])
    declared = capability("conventions") or {}
    if name not in declared:
        return seed
    value = declared[name]
    if not conv.allows(value):
        raise ImplementationError(f"impl.capabilities['conventions'][{name!r}] = {value!r} is not an allowed value "
                                  f"(spec/conventions.yaml: {conv.allowed})")
    if record and not same_value(value, seed):
        _STATE["deviations"][name] = {"convention": name, "declared": value, "seed": seed,
                                      "consequence": conv.consequence(value)}
    return value


def deviations() -> list[dict]:
    """The deviations the current test's oracle followed (see :func:`convention`), by convention id."""
    return [dict(d) for _, d in sorted(_STATE["deviations"].items())]


def end_test() -> None:
    _STATE.update(deadline=None, timed_out=None)


def session_impl() -> str:
    return _STATE["impl"]


def session_device() -> str:
    """The torch device the session's tensors live on (``cuda:0`` for ``--device sim``)."""
    dev = _STATE["device"]
    return str(simdevice.DEVICE) if dev == simdevice.NAME else dev


def simulated() -> bool:
    """Whether the session runs on the simulated device (``--device sim``)."""
    return _STATE["device"] == simdevice.NAME


# ----------------------------------------------------------------------------- the audited device
# Every input is built on the audited device through these helpers, and every result comes back through
# :func:`host`: a test never makes a generator, a network or an optimiser of its own on the CPU, and never
# calls ``.numpy()``, ``.item()`` or ``.tolist()`` on a result (``--device sim`` refuses each).
def generator(seed: int) -> torch.Generator:
    """A generator on the audited device, seeded with ``seed`` (streams differ between devices)."""
    if simulated():
        return simdevice.generator(seed)
    return torch.Generator(device=session_device()).manual_seed(seed)


def on_device(x: Any) -> Any:
    """``x`` on the audited device: a module (moved in place and returned, so build its optimiser after),
    a tensor, or a list/tuple/dict of them (autograd still reaches host leaves)."""
    dev = session_device()
    if isinstance(x, torch.nn.Module):
        return x.to(dev)
    if isinstance(x, torch.Tensor):
        return x if x.device == torch.device(dev) else x.to(dev)
    if isinstance(x, (list, tuple)):
        return type(x)(on_device(v) for v in x)
    if isinstance(x, dict):
        return {k: on_device(v) for k, v in x.items()}
    return x


def device_leaf(t: torch.Tensor) -> torch.Tensor:
    """A leaf copy of ``t`` on the audited device that requires grad (a temperature, a parameter-like input)."""
    return on_device(t.detach()).detach().requires_grad_(True)


def map_leaves(fn: Callable[[Any], Any], x: Any) -> Any:
    """``x`` with ``fn`` applied to every leaf of its nested lists, tuples and dicts (the containers rebuilt):
    the one walker behind the harness's copies, moves and casts (:func:`named_leaves` reads leaves)."""
    if isinstance(x, (list, tuple)):
        return type(x)(map_leaves(fn, v) for v in x)
    if isinstance(x, dict):
        return {k: map_leaves(fn, v) for k, v in x.items()}
    return fn(x)


def host(x: Any) -> Any:
    """A result on the host: every tensor detached and on the CPU (lists, tuples, dicts walked), for numpy,
    ``float`` or a message. The only way the suite reads a device result."""
    return map_leaves(lambda v: v.detach().cpu() if isinstance(v, torch.Tensor) else v, x)


def to_numpy(x: Any) -> np.ndarray:
    """A result (or a plain value) as a numpy array on the host; half precision widened to float32."""
    return _to_numpy(x)


def recorded_calls() -> list[tuple[str, tuple, dict]]:
    return list(_STATE["calls"])


def configure(impl: str, device: str) -> tuple[str, str]:
    """Set the session's implementation string and device; returns the previous pair (nested sessions)."""
    prev = (_STATE["impl"], _STATE["device"])
    _STATE["impl"] = impl
    _STATE["device"] = device
    return prev


# ----------------------------------------------------------------------------- repro snippets
_EVAL_NS = {"torch": torch, "np": np}
_PICKLE_LIMIT = 2_000_000  # bytes: a repro carries small test networks, never a real model


def _evaluates(text: str) -> bool:
    try:
        eval(compile(text, "<repro>", "eval"), dict(_EVAL_NS))  # noqa: S307 - our own repr, checked once
        return True
    except Exception:  # noqa: BLE001 - any failure means the repr is not Python that rebuilds the value
        return False


def _pickled(x: Any) -> str:
    """``_load('<base64>')``: the object as torch.save wrote it (modules, optimisers, anything whose repr is
    not Python). Its class must be importable where the repro runs, as the suite's test networks are."""
    import base64
    import io

    buf = io.BytesIO()
    try:
        torch.save(x, buf)
    except Exception as e:  # noqa: BLE001 - unpicklable: say so in the repro rather than write broken code
        return f"_unavailable({f'{type(x).__name__} could not be serialised ({type(e).__name__})'!r})"
    if buf.tell() > _PICKLE_LIMIT:
        return f"_unavailable({f'{type(x).__name__} is {buf.tell() // 1000} kB serialised'!r})"
    return f"_load({base64.b64encode(buf.getvalue()).decode()!r})"


def _literal(x: Any) -> str:
    """Python source that rebuilds ``x`` in a repro: tensors as ``torch.tensor(...)`` (walked into lists,
    tuples and dicts), dtypes and devices by name, generators with their state, the rest by ``repr`` when
    that evaluates and else from its serialised bytes."""
    if isinstance(x, torch.Tensor):
        rg = ", requires_grad=True" if x.requires_grad and x.is_leaf else ""
        body = re.sub(r"\b(nan|inf)\b", r"float('\1')", repr(x.detach().cpu().tolist()))
        return f"torch.tensor({body}, dtype={x.dtype}{rg})"
    if isinstance(x, np.ndarray):
        return f"np.array({x.tolist()!r}, dtype=np.{x.dtype})"
    if isinstance(x, float) and not math.isfinite(x):
        return f"float({str(x)!r})"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in x.items()) + "}"
    if isinstance(x, list):
        return "[" + ", ".join(_literal(v) for v in x) + "]"
    if isinstance(x, tuple) and type(x) is tuple:
        return "(" + "".join(f"{_literal(v)}, " for v in x) + ")"
    if isinstance(x, torch.device):
        return f"torch.device({str(x)!r})"
    if isinstance(x, torch.Generator):
        return f"_generator({x.device.type!r}, {x.get_state().tolist()!r})"
    if x is None or isinstance(x, (bool, int, float, str, torch.dtype)):
        return repr(x)
    text = repr(x)
    return text if _evaluates(text) else _pickled(x)


_REPRO_HELPERS = {
    "_load(": ("import base64, io\n"
               "def _load(b):  # an argument serialised with torch.save (a network, an optimiser, ...)\n"
               "    return torch.load(io.BytesIO(base64.b64decode(b)), weights_only=False)"),
    "_unavailable(": ("def _unavailable(why):  # an argument the report could not carry\n"
                      "    raise SystemExit(f'this repro needs an argument the report could not carry: {why}; "
                      "build it as your test does')"),
    "_generator(": ("def _generator(device, state):  # a torch.Generator in the state the call got\n"
                    "    g = torch.Generator(device=device)\n"
                    "    g.set_state(torch.tensor(state, dtype=torch.uint8))\n"
                    "    return g"),
}


def describe_call(call: tuple[str, tuple, dict]) -> str:
    """A short human form: ``sac.top_p_select(<2x5 float64>, p=0.9)``."""
    name, args, kwargs = call

    def short(v):
        if isinstance(v, torch.Tensor):
            if v.numel() <= 6:
                return repr(v.detach().cpu().tolist())
            return f"<{'x'.join(map(str, v.shape))} {str(v.dtype).replace('torch.', '')}>"
        r = repr(v)
        return r if len(r) <= 40 else r[:37] + "..."

    parts = [short(a) for a in args] + [f"{k}={short(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _snapshot_leaf(x: Any) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    c = x.detach().clone()
    return c.requires_grad_() if x.requires_grad and x.is_leaf and c.is_floating_point() else c


def _snapshot(x: Any) -> Any:
    """A detached copy of every tensor in ``x`` (lists, tuples and dicts walked), for repros and checks."""
    return map_leaves(_snapshot_leaf, x)


def _hand(x: Any) -> Any:
    """What the operation receives: a copy of each tensor that stays connected to autograd.

    Parameters are state the operation may legitimately update (their ``.grad``), so they pass as
    they are; their values are still checked against the snapshot afterwards.
    """
    return map_leaves(lambda v: v.clone() if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter)
                      else v, x)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.device.type == "meta":
        return True  # a meta tensor has no values to compare
    a = a.detach().to(b.device)
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


def _arg_names(fn: Callable, args: tuple, kwargs: dict) -> list[str]:
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs)
        return list(bound.arguments)[: len(args)] + list(kwargs)
    except (TypeError, ValueError):
        return [f"argument #{i + 1}" for i in range(len(args))] + list(kwargs)


def _clause_tag() -> str:
    return ", ".join(_STATE["clauses"]) or "contract"


def _run_within_deadline(fn: Callable, name: str, args: tuple, kwargs: dict) -> Any:
    """Call ``fn``; past the test's deadline raise :class:`OpTimeout` (SIGALRM, main thread only)."""
    if _STATE["timed_out"]:
        raise OpTimeout(_STATE["timed_out"])
    if (hung := _HUNG.get(_op_key(fn))) is not None:
        _STATE["timed_out"] = (f"{name} is not called again: it did not return within an earlier test's time "
                               f"budget ({hung[1]}) [{_clause_tag()}: {name}]")
        raise OpTimeout(_STATE["timed_out"])
    deadline = _STATE["deadline"]
    if deadline is None or threading.current_thread() is not threading.main_thread():
        with simdevice.implementation_call():
            return fn(*args, **kwargs)
    remaining = deadline - time.monotonic()
    msg = f"{name} did not return within the test's time budget [{_clause_tag()}: {name}]"

    if _STATE["first_failure"]:
        msg = (f"{_STATE['first_failure'][1]}\n(the test's time budget ran out while Hypothesis was shrinking this "
               "failure: the example is the first one found, not the smallest)")

    def expire(signum, frame):
        _STATE["timed_out"] = msg
        if not _STATE["first_failure"]:  # a real hang, not a shrink that ran long
            _HUNG.setdefault(_op_key(fn), (fn, msg))
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

    _STATE["not_applicable"] += 1
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
    snap_args, snap_kwargs = _snapshot(args), _snapshot(kwargs)
    _STATE["calls"].append((name, snap_args, snap_kwargs))
    _STATE["last_fn"] = fn
    _note_call_outside(name, snap_args, snap_kwargs)
    names = _contract_arg_names(name, fn, args, kwargs)
    state = _updated_in_place(name)
    handed = [v if n in state else _hand(_to_device(v)) for n, v in zip(names, [*args, *kwargs.values()])]
    handed_args, handed_kwargs = tuple(handed[:len(args)]), dict(zip(kwargs, handed[len(args):]))
    before = {n: _fingerprint(v) for n, v in zip(names, handed) if n not in state}
    try:
        out = _run_within_deadline(fn, name, handed_args, handed_kwargs)
        _STATE["last_result"] = (name, _describe_result(out))
    except NotApplicable as e:
        _declared_not_applicable(name, e)
    except Exception as e:  # noqa: BLE001 - any exception from the implementation is an error
        if not wrap_errors:
            raise
        err = f"{describe_call((name, args, kwargs))} raised {type(e).__name__}: {e}"
        _note_failure("error", err)
        raise ImplementationError(err) from e
    for arg_name, h in zip(names, handed):
        where = arg_name in before and _changed(_fingerprint(h), before[arg_name], arg_name)
        if where:
            what = (f"left a gradient in {where!r} (it called backward)" if ".grad'" in where
                    else f"modified its input {where!r} in place")
            msg = (f"{name} {what}; an operation must leave its arguments unchanged: it computes, the caller "
                   f"steps [{_clause_tag()}: {describe_call((name, args, kwargs))}]")
            _note_failure("fail", msg)
            raise InputMutated(msg)
    return out


def _updated_in_place(name: str) -> set[str]:
    return set(contract.updated_in_place(name))


_UNCOMPARABLE = object()


def _fingerprint(x: Any) -> Any:
    """A copy of what ``x`` holds, for comparing before and after a call: tensors (values), containers
    (walked, plain values copied), modules (each parameter's value and gradient, each buffer), optimisers
    (their state and hyper-parameters)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, torch.nn.Module):
        return {**{f"{k}": _fingerprint(v) for k, v in x.named_buffers()},
                **{k: _fingerprint(p) for k, p in x.named_parameters()},
                **{f"{k}.grad": None if p.grad is None else _fingerprint(p.grad) for k, p in x.named_parameters()}}
    if isinstance(x, torch.optim.Optimizer):
        return {"state": [_fingerprint(dict(x.state.get(p, {}))) for g in x.param_groups for p in g["params"]],
                "param_groups": [_fingerprint({k: v for k, v in g.items() if k != "params"}) for g in x.param_groups]}
    if isinstance(x, dict):
        return {k: _fingerprint(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_fingerprint(v) for v in x) if type(x) in (list, tuple) else [_fingerprint(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str, bytes)):
        return x
    try:
        return copy.deepcopy(x)
    except Exception:  # noqa: BLE001 - an object that cannot be copied (a connection) is not compared
        return _UNCOMPARABLE


def _changed(now: Any, was: Any, path: str) -> str | None:
    """The first place where ``now`` differs from ``was`` (``batch['obs']``, ``critic['q1.weight.grad']``)."""
    if was is _UNCOMPARABLE or now is _UNCOMPARABLE:
        return None
    if isinstance(was, torch.Tensor) or isinstance(now, torch.Tensor):
        same = isinstance(was, torch.Tensor) and isinstance(now, torch.Tensor) and _same(now, was)
        return None if same else path
    if isinstance(was, dict) and isinstance(now, dict):
        if set(was) != set(now):
            return f"{path} (keys)"
        return next((m for k in was if (m := _changed(now[k], was[k], f"{path}[{k!r}]"))), None)
    if isinstance(was, (list, tuple)) and isinstance(now, (list, tuple)):
        if len(was) != len(now):
            return f"{path} (length)"
        return next((m for i, (n, w) in enumerate(zip(now, was)) if (m := _changed(n, w, f"{path}[{i}]"))), None)
    try:
        return None if bool(now == was) or (now != now and was != was) else path  # NaN equals NaN here
    except Exception:  # noqa: BLE001 - values without an equality (arrays of another kind) are not compared
        return None


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
    return f"a {type(x).__name__}"


def contract_return(name: str) -> str | None:
    """The contract's return annotation and the first line of its documentation for ``family.op``."""
    fam, _, op = name.partition(".")
    try:
        member = getattr(contract.protocol(fam), op)
    except (AttributeError, ModuleNotFoundError):
        return None
    ret = inspect.signature(member).return_annotation
    flat = " ".join((inspect.getdoc(member) or "").split())
    m = re.search(r"[.;](\s|$)", flat)  # the first sentence, however the docstring wraps it
    doc = flat[:m.start()] if m else flat
    ret = ret if isinstance(ret, str) else getattr(ret, "__name__", str(ret))
    return f"returns {ret}" + (f": {doc}" if doc else "")


def suite_side_error(exc: BaseException) -> str | None:
    """When a test raised outside the implementation (the suite could not check a result: a wrong type,
    a result with no gradient, another device), a message that names the result and the contract, instead
    of a traceback of the suite's comparison code that reads as the user's bug. None if no call was made."""
    last = _STATE.get("last_result")
    if not last or not _STATE["calls"] or last[0] != _STATE["calls"][-1][0]:
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
            + f" [{_clause_tag()}: {describe_call(_STATE['calls'][-1])}]")


def evidence_in_train_dtype() -> dict | None:
    """The failing test's last call made again in the dtype the implementation trains in (capability
    ``train_dtype``), when the test ran it in float64: what the library's users actually get. A float64
    residue may be nothing in float32, or a float64 near-miss may be a large error there.

    Returns ``{"dtype", "float64", "train", "max_difference", "severity"}`` or None (nothing to redo)."""
    td = capability("train_dtype", None)
    if not td or not _STATE["calls"] or _STATE.get("last_fn") is None:
        return None
    dst = getattr(torch, str(td).replace("torch.", ""))
    name, args, kwargs = _STATE["calls"][-1]
    if dst == torch.float64 or not any(isinstance(v, torch.Tensor) and v.dtype == torch.float64
                                       for _, v in named_leaves([args, kwargs])):
        return None
    fn = _STATE["last_fn"]
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


def repro_snippet(calls: Iterable[tuple[str, tuple, dict]] | None = None, limit: int = 3) -> str:
    """Python that replays the last ``limit`` recorded calls against the implementation under test."""
    calls = list(calls if calls is not None else _STATE["calls"])[-limit:]
    if not calls:
        return ""
    body = []
    for name, args, kwargs in calls:
        fam, _, op = name.partition(".")
        argv = [_literal(a) for a in args] + [f"{k}={_literal(v)}" for k, v in kwargs.items()]
        body.append(f"print(impl.{fam}.{op}({', '.join(argv)}))")
    lines = ["import torch", "import numpy as np", "from conformance_tests.impl import load_impl",
             *(helper for key, helper in _REPRO_HELPERS.items() if any(key in b for b in body)),
             f"impl = load_impl({_STATE['impl']!r})", *body]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the proxy
def _to_device(x: Any) -> Any:
    """Tensor arguments on the session's --device (autograd still reaches the CPU leaves). Modules are the
    test's to build on the device (:func:`on_device`): moving them here would hide a network built on the host."""
    if _STATE["device"] == "cpu":
        return x
    return map_leaves(lambda v: v if isinstance(v, torch.nn.Module) else on_device(v), x)


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


# ----------------------------------------------------------------------------- tolerances
def tolerance(clause: str, dtype: torch.dtype | str = torch.float64, *, approx: str | None = None) -> tuple[float, float]:
    """The clause's (rtol, atol) for ``dtype``; ``approx`` names a class of spec/tolerances.yaml
    instead, for differential checks whose oracle is itself approximate (finite differences)."""
    name = str(dtype).replace("torch.", "")
    spec = default_spec()
    tol = spec.tolerances[approx] if approx else spec.clause(clause).tolerance
    return tol.for_dtype(name)


def slack(clause: str, value: Any, dtype: torch.dtype | str | None = None) -> np.ndarray:
    """How far a result may sit beyond a bound ``value`` by rounding alone: the clause's atol + rtol·|value|
    for ``dtype`` (default: the inputs of the test's last call), so a one-sided bound is held to the same
    tolerance as the values it bounds, never to a margin finer than the dtype can represent."""
    rtol, atol = tolerance(clause, dtype if dtype is not None else _default_dtype(value))
    return atol + rtol * np.abs(_to_numpy(value).astype(np.float64))


def _last_call_text() -> str:
    calls = _STATE["calls"]
    return describe_call(calls[-1]) if calls else "no call"


def plain(x: Any) -> Any:
    """numpy scalars/arrays and tensors as plain Python values (no ``np.float64(...)`` in messages)."""
    if isinstance(x, (np.generic, np.ndarray)):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return type(x)(plain(v) for v in x)
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x


_NP_SCALAR = re.compile(r"\bnp\.(?:float|int|uint|bool_?|complex)\d*\(([^()]*)\)")
_NP_ARRAY = re.compile(r"\barray\((\[[^()]*?\])(?:,\s*dtype=[\w.]+)?\)")


def plain_text(text: str) -> str:
    """Failure text with numpy reprs turned into plain literals: ``np.float64(0.5)`` -> ``0.5``,
    ``array([-0.])`` -> ``[-0.]``."""
    return _NP_ARRAY.sub(r"\1", _NP_SCALAR.sub(r"\1", text))


def _fmt(x: Any) -> str:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.numel() > 12:
            return f"tensor(shape={tuple(x.shape)}, first={x.flatten()[:6].tolist()})"
        return repr(x.tolist())
    return repr(plain(x))


def fail(clause: str, got: Any, expected: Any, detail: str = "", *, severity: str | None = None) -> None:
    msg = f"got {_fmt(got)}, but should be {_fmt(expected)} [{clause}: {_last_call_text()}]"
    if detail:
        msg += f"\n  {detail}"
    if severity is None:
        try:  # numbers against numbers: NaN/inf where the answer is finite is critical, a residue minor
            g, e = _to_numpy(got).astype(np.float64), _to_numpy(expected).astype(np.float64)
            if g.shape == e.shape and g.size:
                fin = np.isfinite(g) & np.isfinite(e)
                severity = _severity_of(g, e, float(np.max(np.abs(g[fin] - e[fin]), initial=0.0)) if fin.all()
                                        else float("nan"))
        except Exception:  # noqa: BLE001 - got/expected are not numeric arrays: leave the default
            pass
    _note_failure("fail", msg, severity)
    pytest.fail(msg, pytrace=False)


# ----------------------------------------------------------------------------- assertions
def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype in (torch.bfloat16, torch.float16):
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def _dtype_of(x: Any) -> torch.dtype | None:
    """The floating dtype a value carries (tensors, numpy arrays), None for Python numbers and lists."""
    if isinstance(x, torch.Tensor):
        return x.dtype if x.is_floating_point() else None
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32}.get(x.dtype, torch.float64)
    return None


def named_leaves(x: Any, where: str = "") -> Iterable[tuple[str, Any]]:
    """(path, leaf) for every leaf of nested lists, tuples and dicts, paths written as Python indexes
    (``where[0]['key']``)."""
    if isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from named_leaves(v, f"{where}[{i}]")
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from named_leaves(v, f"{where}[{k!r}]")
    else:
        yield where, x


def _leaves(x: Any) -> Iterable[Any]:
    return (leaf for _, leaf in named_leaves(x))


def input_dtype(*inputs: Any) -> torch.dtype:
    """The working dtype of an operation's inputs: the widest floating dtype among them (lists and
    dicts walked; float64 when none is floating). Tolerances follow this, never the result, so a
    result silently computed in a narrower dtype is held to the tolerance of the dtype it was given."""
    order = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    found = [d for d in (_dtype_of(x) for x in _leaves(inputs)) if d is not None]
    return max(found, key=order.index) if found else torch.float64


def _default_dtype(expected: Any) -> torch.dtype:
    """The inputs' dtype of the test's last recorded call; the expected value's dtype without one."""
    calls = _STATE["calls"]
    if calls:
        _, args, kwargs = calls[-1]
        return input_dtype(args, kwargs)
    return input_dtype(expected)


def assert_close(got: Any, expected: Any, clause: str, *, dtype: Any = None, what: str = "",
                 approx: str | None = None) -> None:
    """``got`` equals ``expected`` within the clause's tolerance for ``dtype``.

    ``dtype`` is the dtype of the inputs the operation was given; when omitted it is the widest
    floating dtype among the inputs of the test's last recorded call (the expected value's dtype
    when no call was recorded), never ``got``'s: a float32 result for float64 inputs is held to the
    float64 tolerance. ``approx="gradient"`` when ``expected``
    comes from finite differences.
    """
    if dtype is None:
        dtype = _default_dtype(expected)
    rtol, atol = tolerance(clause, dtype, approx=approx)
    g, e = _to_numpy(got), _to_numpy(expected)
    if g.shape != e.shape and not (g.size == 1 and e.size == 1):
        fail(clause, f"shape {g.shape}", f"shape {e.shape}", what)
    g = g.reshape(e.shape) if g.size == e.size else g
    if not np.all(np.isfinite(g) == np.isfinite(e)):
        fail(clause, got, expected, f"{what} non-finite values differ".strip(),
             severity="critical" if (~np.isfinite(g) & np.isfinite(e)).any() else "major")
    fin = np.isfinite(e)
    ok = np.allclose(g[fin].astype(np.float64), e[fin].astype(np.float64), rtol=rtol, atol=atol) if fin.any() else True
    if not ok or not np.array_equal(g[~fin], e[~fin]):
        err = np.max(np.abs(g[fin].astype(np.float64) - e[fin].astype(np.float64))) if fin.any() else float("nan")
        fail(clause, got, expected, f"{what} max abs error {err:.3g} > atol {atol:g} + rtol {rtol:g}·|expected|".strip(),
             severity=_severity_of(g.astype(np.float64), e.astype(np.float64), float(err)))


def assert_dtype(got: Any, dtype: torch.dtype, clause: str, what: str = "") -> None:
    """``got`` (a tensor, or a dict/list/tuple of them: every floating one) is of ``dtype``."""
    if isinstance(got, dict):
        for k, v in got.items():
            assert_dtype(v, dtype, clause, f"{what}[{k!r}]")
        return
    if isinstance(got, (list, tuple)):
        for i, v in enumerate(got):
            assert_dtype(v, dtype, clause, f"{what}[{i}]")
        return
    if isinstance(got, torch.Tensor) and got.is_floating_point() and got.dtype != dtype:
        fail(clause, f"a {str(got.dtype).replace('torch.', '')} result",
             f"{str(dtype).replace('torch.', '')}, the dtype of the inputs", what)


def assert_low_precision(got: Any, exact: Any, clause: str, dtype: torch.dtype, what: str = "") -> None:
    """A low-precision result against the float64 answer for the *same rounded inputs*, within the
    clause's tolerance for ``dtype``: finiteness alone would pass a constant or zeroed output."""
    assert_that(torch.isfinite(got.float()) if isinstance(got, torch.Tensor) else math.isfinite(float(got)),
                clause, got, f"finite {what} in {dtype}".strip())
    assert_close(got, exact, clause, dtype=dtype, what=what)


def assert_no_grad(clause: str, what: str, *leaves: torch.Tensor) -> None:
    """Each leaf (created with ``requires_grad=True`` by the test) got no gradient: ``.grad`` is None
    or all zero after the backward pass of a loss that must treat it as a constant."""
    for i, t in enumerate(leaves):
        if t.grad is not None and bool((t.grad != 0).any()):
            name = what if len(leaves) == 1 else f"{what} #{i + 1}"
            fail(clause, t.grad, f"no gradient into {name} (a constant of the loss)")


def grad_of(loss: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    """∂loss/∂leaf without touching ``.grad`` (the graph is kept); zeros when the loss does not reach it."""
    (g,) = torch.autograd.grad(loss, [leaf], retain_graph=True, allow_unused=True)
    return torch.zeros_like(leaf) if g is None else g


def assert_no_grad_into(loss: torch.Tensor, clause: str, **leaves: torch.Tensor) -> None:
    """The loss sends no gradient into any of the named leaves (networks or inputs it must hold constant)."""
    for name, leaf in leaves.items():
        g = grad_of(loss, leaf)
        assert_that(bool((g == 0).all()), clause, g, f"no gradient into {name}")


def grad_leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Fresh ``requires_grad=True`` leaf copies of floating tensors (others are returned unchanged)."""
    return [t.detach().clone().requires_grad_(True) if t.is_floating_point() else t for t in tensors]


def assert_equal(got: Any, expected: Any, clause: str, what: str = "") -> None:
    """Exact equality (tensors compared elementwise and by shape)."""
    g, e = _to_numpy(got), _to_numpy(expected)
    if g.shape != e.shape or not np.array_equal(g, e):
        fail(clause, got, expected, what)


def assert_that(condition: Any, clause: str, got: Any, should: str) -> None:
    """A property check: ``should`` says in words what ``got`` should have been."""
    if isinstance(condition, torch.Tensor):
        condition = bool(condition.all())
    if not condition:
        fail(clause, got, should)


def assert_rejects(clause: str, fn: Callable, *args, **kwargs) -> Exception:
    """Bad input: the operation must raise, never return silent garbage. An implementation that
    declares ``errors_name_clauses`` (the reference does) must also name ``clause`` in the message;
    a third-party library passes on any exception that rejects the input."""
    try:
        result = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        raised = e
    else:
        fail(clause, result, "an error (bad input must not pass silently)")
    if capability("errors_name_clauses", False) and clause not in str(raised):
        fail(clause, f"{type(raised).__name__}({str(raised)[:120]!r})", f"an error whose message names {clause}")
    return raised


@contextlib.contextmanager
def no_grad_leak(*tensors: torch.Tensor):
    """Fail if any of ``tensors`` receives a gradient inside the block (detached inputs)."""
    yield
    for t in tensors:
        if t.grad is not None and bool((t.grad != 0).any()):
            raise AssertionError("gradient leaked into a tensor that must be detached")


def finite_difference(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, h: float = 1e-6) -> torch.Tensor:
    """Central finite-difference gradient of the scalar ``fn`` at float64 ``x`` (an independent oracle)."""
    x = x.detach().to(torch.float64)
    grad = torch.zeros_like(x)
    flat = grad.view(-1)
    for i in range(x.numel()):
        e = torch.zeros_like(x).view(-1)
        e[i] = h
        e = e.view_as(x)
        flat[i] = (float(fn(x + e)) - float(fn(x - e))) / (2 * h)
    return grad


# ----------------------------------------------------------------------------- oracles under a convention
# numpy forms of the conventional quantities (spec/conventions.yaml), shared by every test that reads the
# convention: the test passes the value :func:`convention` gave it, so the oracle follows the declaration.
def np_standardise(a: np.ndarray, std_conv: dict, eps: float | None = None, axis: int = -1) -> np.ndarray:
    """(a - mean) / (std + eps), or / max(std, eps) with eps_mode "clamp"; ddof and the default eps from
    the advantage_std convention. Shift-invariant and exactly 0 for a constant group."""
    eps = std_conv["eps"] if eps is None else eps
    centred = a - a.mean(axis=axis, keepdims=True)
    sd = a.std(axis=axis, ddof=std_conv["ddof"], keepdims=True) if a.shape[axis] > std_conv["ddof"] else 0.0 * centred
    den = np.maximum(sd, eps) if std_conv["eps_mode"] == "clamp" else sd + eps
    return np.divide(centred, den, out=np.zeros_like(centred), where=den > 0)


def np_approx_kl(old: np.ndarray, new: np.ndarray, estimator: str) -> float:
    """approx_kl under the approx_kl convention: k1 = mean(old - new), k3 = mean((r - 1) - log r)."""
    lr = new - old
    return float(np.mean(-lr) if estimator == "k1" else np.mean(np.expm1(lr) - lr))


def np_clip_fraction(r: np.ndarray, clip_eps: float, convention_value: str, adv: np.ndarray | None = None) -> float:
    """The share of clipped samples under the clip_fraction convention (active_clips needs the advantages)."""
    if convention_value == "ratio_outside":
        return float(np.mean(np.abs(r - 1.0) > clip_eps))
    return float(np.mean(((r > 1 + clip_eps) & (adv > 0)) | ((r < 1 - clip_eps) & (adv < 0))))


def np_critic_penalty(err: np.ndarray, delta: float, huber_conv: str) -> np.ndarray:
    """One critic's per-sample penalty under the huber_delta convention: Huber(err, delta) ("any"; δ = 1
    when "fixed_1", the caller passes it) or the plain squared error err² ("mse", no ½)."""
    return err**2 if huber_conv == "mse" else huber(err, delta)


def critic_delta(drawn: float) -> float:
    """The Huber δ a test may pass: the drawn one when any δ is supported, else 1 (fixed_1; ignored by mse)."""
    return drawn if convention("huber_delta") == "any" else 1.0


def log_ratio_clamp(drawn: float | None = None) -> float:
    """The log-ratio clamp a test passes and its oracle applies: the drawn one (or the seed's 20) when the
    implementation declares none, else its declared clamp (inf for "none"), which it uses whatever is passed."""
    if not declares("log_ratio_clamp"):
        return float(convention("log_ratio_clamp")) if drawn is None else drawn
    value = convention("log_ratio_clamp")
    return math.inf if value == "none" else float(value)
