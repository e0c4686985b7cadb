"""Pre-flight: can the implementation be run at all? Checked once, before any test.

Import the module, find and call the factory, check every provided operation's signature against
the contract Protocols, and check that the device exists. Each failure is one message (the
factory's own exception with its traceback, once), never hundreds of identical test errors.
``rlconform audit`` exits 3 on a failed pre-flight; ``pytest --impl`` stops with one usage error (exit 4).
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable

from rlconform.spec import default_spec

from conformance_tests import contract

DEFAULT_IMPL = "reference_impl:make"
ENV_VAR = "RLCONFORM_IMPL"


def resolve_impl_string(value: str | None) -> str:
    return value or os.environ.get(ENV_VAR) or DEFAULT_IMPL


class PreflightError(Exception):
    """The implementation cannot be run; the message says why and what to do."""


@dataclasses.dataclass
class Preflight:
    impl_string: str
    impl: Any
    name: str | None
    version: str | None
    commit: str | None
    ops: dict[str, list[str]]  # family -> contract operations provided

    def info(self) -> dict[str, Any]:
        """What the report says of the implementation: name, version, commit, and the outputs whose gradients
        come from the library's own optimiser step (``steps_itself``)."""
        steps = (getattr(self.impl, "capabilities", None) or {}).get("steps_itself") or {}
        return {"impl_name": self.name, "impl_version": self.version, "impl_commit": self.commit,
                **({"impl_steps_itself": {op: list(keys) for op, keys in steps.items()}} if steps else {})}


def _import(mod_name: str, value: str):
    try:
        return importlib.import_module(mod_name)
    except KeyboardInterrupt:
        raise
    except ModuleNotFoundError as e:
        if e.name and (mod_name == e.name or mod_name.startswith(e.name + ".")):
            raise PreflightError(f"--impl {value!r}: no module named {e.name!r} (is the package installed in this "
                                 f"environment, or its directory on PYTHONPATH?)") from None
        raise PreflightError(f"--impl {value!r}: importing {mod_name!r} failed:\n{_tb(e)}") from None
    except BaseException as e:  # noqa: BLE001 - the user's module code raised while importing; a sys.exit() there
        # too, which would otherwise end the audit with the module's exit code (0: a pass) and no report
        raise PreflightError(f"--impl {value!r}: importing {mod_name!r} raised {_what(e)}:\n{_tb(e)}") from None


def _what(e: BaseException) -> str:
    if isinstance(e, SystemExit):  # never the verdict: the suite's process must go on to report
        return f"SystemExit({e.code!r}) (sys.exit() in the implementation's code; it must raise, never exit)"
    return type(e).__name__


def read_attr(obj: Any, name: str, value: str, where: str = "impl", default: Any = None) -> Any:
    """``getattr(obj, name, default)``, where a property or ``__getattr__`` that raises is the implementation's
    error, named with the attribute, never an internal error of the suite."""
    try:
        return getattr(obj, name, default)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - the implementation's own code ran
        raise PreflightError(f"--impl {value!r}: reading {where}.{name} raised {_what(e)}:\n{_tb(e)}") from None


def _tb(e: BaseException) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__, limit=-8)).rstrip()


_MISSING = object()


def build(value: str | None) -> Any:
    """Import ``module:factory`` and call the factory, explaining every way that can go wrong."""
    value = resolve_impl_string(value)
    mod_name, sep, attr = value.partition(":")
    if not sep or not mod_name or not attr:
        raise PreflightError(f"--impl expects 'module:factory', got {value!r}")
    factory = _import(mod_name, value)
    where = mod_name
    for part in attr.split("."):
        factory = read_attr(factory, part, value, where=where, default=_MISSING)
        where = f"{where}.{part}"
        if factory is _MISSING:
            raise PreflightError(f"--impl {value!r}: module {mod_name!r} has no attribute {attr!r}")
    if not callable(factory):
        raise PreflightError(f"--impl {value!r}: {attr!r} is a {type(factory).__name__}, not a callable factory")
    try:
        impl = factory()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - shown once, with its traceback; a sys.exit() too (see _import)
        raise PreflightError(f"--impl {value!r}: the factory raised {_what(e)}:\n{_tb(e)}") from None
    if not any(read_attr(impl, fam, value) is not None for fam in contract.FAMILIES):
        raise PreflightError(f"--impl {value!r}: the factory returned a {type(impl).__name__} with none of the "
                             f"family attributes {', '.join(contract.FAMILIES)}")
    return impl


def _params(sig: inspect.Signature) -> tuple[list[str], list[str], list[str], list[str]]:
    """(positional names, required positional, keyword-only names, required keyword-only)."""
    pos = [p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    kw = [p for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY]
    return ([p.name for p in pos], [p.name for p in pos if p.default is p.empty],
            [p.name for p in kw], [p.name for p in kw if p.default is p.empty])


def signature_problem(family: str, op: str, fn: Any) -> str | None:
    """Why ``fn`` cannot be called the way the suite calls ``family.op``, or None."""
    if not callable(fn):
        return f"{family}.{op} is a {type(fn).__name__}, not a function"
    try:
        got = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # a builtin without a signature: nothing to check before calling it
    want = inspect.signature(getattr(contract.protocol(family), op))
    pos, pos_req, kw, kw_req = _params(want)
    pos, pos_req = pos[1:], pos_req[1:]  # drop the Protocol's self
    calls = (([object()] * len(pos), dict.fromkeys(kw, object())),  # every argument the contract names
             ([object()] * len(pos_req), dict.fromkeys(kw_req, object())))  # only its required ones
    for args, kwargs in calls:
        try:
            got.bind(*args, **kwargs)
        except TypeError as e:
            shown = ", ".join(pos + (["*"] if kw else []) + kw)
            return (f"{family}.{op}{got} cannot be called as the contract calls it, {op}({shown}): {e} "
                    f"(the contract: {_where(getattr(contract.protocol(family), op))})")
    return None


def _where(fn: Any) -> str:
    """``path:line`` of a contract operation's definition, for a message that points at it."""
    try:
        return f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):  # no source shipped: the module is still named
        return f"{fn.__module__}.{fn.__qualname__}"


def check_signatures(impl: Any, families: Iterable[str], value: str = "") -> dict[str, list[str]]:
    """family -> provided contract ops; PreflightError listing every op whose signature does not fit."""
    provided, problems = {}, []
    for fam in families:
        ns = read_attr(impl, fam, value)
        if ns is None:
            continue
        ops = {op: fn for op in contract.op_names(fam) if (fn := read_attr(ns, op, value, f"impl.{fam}")) is not None}
        provided[fam] = list(ops)
        problems += [p for op, fn in ops.items() if (p := signature_problem(fam, op, fn))]
    if problems:
        raise PreflightError("operations whose signature does not fit the contract:\n  " + "\n  ".join(problems))
    return provided


def check_device(device: str) -> None:
    # torch only when a device is checked: `rlconform --help` and the plugin's registration never pay for it
    import torch

    from conformance_tests import simdevice

    if device == simdevice.NAME:  # a CUDA device simulated on the CPU: always there
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise PreflightError(f"--device {device!r} is not a torch device: {e}") from None
    if dev.type == "cpu":
        return
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise PreflightError(f"--device {device}: this torch ({torch.__version__}) sees no CUDA device; "
                                 "run with --device cpu or on a machine with a GPU")
        if dev.index is not None and dev.index >= n:
            raise PreflightError(f"--device {device}: only {n} CUDA device(s) visible")
        return
    try:
        torch.empty(1, device=dev)
    except Exception as e:  # noqa: BLE001
        raise PreflightError(f"--device {device}: tensors cannot be created there ({type(e).__name__}: {e})") from None


def git_commit(obj: Any, *, ignore: Callable[[str], bool] | None = None) -> str | None:
    """The git commit (``+dirty`` when the tree has changes) of the checkout holding ``obj``'s module.
    ``ignore(path)`` names changed paths (relative to the repository root) that do not make it dirty:
    a project's own generated outputs, which the run that stamps them may itself be rewriting."""
    where = checkout_dir(obj)
    if where is None:
        return None
    try:
        head = subprocess.run(["git", "-C", where, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        changed = modified_paths(where)
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = [p for p in changed if not (ignore and ignore(p))]
    return head.stdout.strip() + ("+dirty" if dirty else "")


def checkout_dir(obj: Any) -> str | None:
    mod = sys.modules.get(getattr(obj, "__module__", "") or "") if not inspect.ismodule(obj) else obj
    path = getattr(mod, "__file__", None)
    return str(Path(path).resolve().parent) if path else None


def modified_paths(where: str) -> list[str]:
    """Tracked paths with uncommitted changes in the checkout holding ``where``, relative to its root."""
    out = subprocess.run(["git", "-C", where, "status", "--porcelain", "--untracked-files=no"],
                         capture_output=True, text=True, timeout=10).stdout
    return [ln[3:].split(" -> ")[-1].strip('"') for ln in out.splitlines() if len(ln) > 3]


# What an implementation may declare (conformance_tests/contract/__init__.py documents each).
CAPABILITIES = ("errors_name_clauses", "masks", "dtypes", "differentiable", "terminated_truncated", "conventions",
                "train_dtype", "pinned", "steps_itself", "conventions_by_clause")
CAPABILITY_DTYPES = ("float16", "bfloat16", "float32", "float64")


def check_capabilities(caps: Any, value: str) -> None:
    """A misspelt capability or convention would be ignored and the suite would test something the
    implementation never claimed: every declared name and value must be known."""
    if caps is None:
        return
    if not isinstance(caps, dict):
        raise PreflightError(f"--impl {value!r}: impl.capabilities must be a dict, got {type(caps).__name__}")
    unknown = sorted(set(caps) - set(CAPABILITIES))
    if unknown:
        raise PreflightError(f"--impl {value!r}: unknown capability {unknown} (known: {', '.join(CAPABILITIES)})")
    bad = sorted(set(caps.get("dtypes") or ()) - set(CAPABILITY_DTYPES))
    if bad or ("dtypes" in caps and not caps["dtypes"]):
        raise PreflightError(f"--impl {value!r}: capabilities['dtypes'] must name some of "
                             f"{', '.join(CAPABILITY_DTYPES)}, got {caps['dtypes']!r}")
    for cap in ("masks", "terminated_truncated", "errors_name_clauses"):  # a string "no" would read as True
        if cap in caps and not isinstance(caps[cap], bool):
            raise PreflightError(f"--impl {value!r}: capabilities[{cap!r}] must be True or False, got {caps[cap]!r}")
    check_differentiable(caps.get("differentiable", True), value)
    td = caps.get("train_dtype")
    if td is not None and td not in CAPABILITY_DTYPES:
        raise PreflightError(f"--impl {value!r}: capabilities['train_dtype'] must be one of "
                             f"{', '.join(CAPABILITY_DTYPES)}, got {td!r}")
    spec = default_spec()
    for name, declared in (caps.get("conventions") or {}).items():
        if name not in spec.conventions:
            raise PreflightError(f"--impl {value!r}: unknown convention {name!r} in capabilities['conventions'] "
                                 f"(spec/conventions.yaml has {', '.join(sorted(spec.conventions))})")
        if not spec.convention(name).allows(declared):
            raise PreflightError(f"--impl {value!r}: capabilities['conventions'][{name!r}] = {declared!r} is not an "
                                 f"allowed value ({spec.convention(name).allowed})")
    for cid, entry in (caps.get("conventions_by_clause") or {}).items():
        if cid not in spec.clauses:
            raise PreflightError(f"--impl {value!r}: capabilities['conventions_by_clause'] names {cid!r}, not a clause")
        for name, declared in (entry or {}).items():
            conv = spec.conventions.get(name)
            if conv is None or cid not in conv.clauses:
                raise PreflightError(f"--impl {value!r}: capabilities['conventions_by_clause'][{cid!r}] names "
                                     f"{name!r}, which is not a convention of {cid}")
            if not conv.allows(declared):
                raise PreflightError(f"--impl {value!r}: capabilities['conventions_by_clause'][{cid!r}][{name!r}] = "
                                     f"{declared!r} is not an allowed value ({conv.allowed})")
    check_per_op(caps, value)


def check_differentiable(decl: Any, value: str) -> None:
    """True, False, or a list of the ops ("family.op") whose outputs carry a gradient: a misspelt op would
    silently be declared without one, and its gradient checks would not run."""
    if isinstance(decl, bool):
        return
    if isinstance(decl, (str, bytes)) or not isinstance(decl, (list, tuple, set, frozenset)):
        raise PreflightError(f"--impl {value!r}: capabilities['differentiable'] must be True, False or a list of "
                             f"ops (\"family.op\", e.g. \"ppo.value_loss\"), got {decl!r}")
    known = [f"{fam}.{op}" for fam in contract.FAMILIES for op in contract.op_names(fam)]
    for op in decl:
        if op not in known:
            near = difflib.get_close_matches(str(op), known, n=1)
            raise PreflightError(f"--impl {value!r}: capabilities['differentiable'] names {op!r}, not a contract op "
                                 "(\"family.op\", e.g. \"ppo.value_loss\")"
                                 + (f"; did you mean {near[0]!r}?" if near else ""))


def check_per_op(caps: dict, value: str) -> None:
    """``pinned`` maps a contract op to keyword hyper-parameters it takes; ``steps_itself`` maps one to output
    keys. A misspelt op or keyword would silently pin nothing."""
    for cap in ("pinned", "steps_itself"):
        decl = caps.get(cap) or {}
        if not isinstance(decl, dict):
            raise PreflightError(f"--impl {value!r}: capabilities[{cap!r}] must be a dict by op, got {decl!r}")
        for op, entry in decl.items():
            family, _, name = str(op).partition(".")
            if family not in contract.FAMILIES or name not in contract.op_names(family):
                raise PreflightError(f"--impl {value!r}: capabilities[{cap!r}] names {op!r}, not a contract op "
                                     "(\"family.op\", e.g. \"sac.losses\")")
            if cap == "steps_itself":
                if isinstance(entry, str) or not all(isinstance(k, str) for k in entry):
                    raise PreflightError(f"--impl {value!r}: capabilities['steps_itself'][{op!r}] must list "
                                         f"output keys, got {entry!r}")
                continue
            params = inspect.signature(getattr(contract.protocol(family), name)).parameters
            keywords = [p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY]
            unknown = sorted(set(entry) - set(keywords)) if isinstance(entry, dict) else entry
            if unknown:
                raise PreflightError(f"--impl {value!r}: capabilities['pinned'][{op!r}] must map keyword "
                                     f"hyper-parameters of {op} ({', '.join(keywords)}) to values; "
                                     f"unknown: {unknown!r}")


def run(value: str | None, *, device: str = "cpu", families: Iterable[str] | None = None) -> Preflight:
    """Every pre-flight check; :class:`PreflightError` on the first that fails."""
    value = resolve_impl_string(value)
    impl = build(value)
    fams = list(families) if families else list(contract.FAMILIES)
    if not any(read_attr(impl, f, value) is not None for f in fams):
        raise PreflightError(f"--impl {value!r} provides none of the audited families ({', '.join(fams)})")
    ops = check_signatures(impl, fams, value)
    check_capabilities(read_attr(impl, "capabilities", value), value)
    check_device(device)
    factory_module = sys.modules.get(value.partition(":")[0])
    return Preflight(value, impl, read_attr(impl, "name", value), _str(read_attr(impl, "version", value)),
                     git_commit(factory_module), ops)


def _str(v: Any) -> str | None:
    return None if v is None else str(v)
