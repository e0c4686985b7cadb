"""Repro snippets: recorded calls as Python that replays them against the implementation under test.
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterable

import numpy as np
import torch

from conformance_tests.harness import state

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
        r = " ".join(repr(v).split())  # one line: an optimiser's repr spans several, and a report keeps one
        return r if len(r) <= 40 else r[:37] + "..."

    parts = [short(a) for a in args] + [f"{k}={short(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def repro_snippet(calls: Iterable[tuple[str, tuple, dict]] | None = None, limit: int = 3) -> str:
    """Python that replays the last ``limit`` recorded calls against the implementation under test."""
    recorded = calls is None
    calls = list(calls if calls is not None else state._STATE["calls"])
    # the call that wrote into its argument: the repro holds that argument in a variable and prints it after
    mutated = state._STATE.get("mutated") if recorded else None
    first = max(len(calls) - limit, 0)
    if not calls:
        return ""
    body = []
    for index, (name, args, kwargs) in enumerate(calls[first:], start=first):
        fam, _, op = name.partition(".")
        argv = [_literal(a) for a in args] + [f"{k}={_literal(v)}" for k, v in kwargs.items()]
        if mutated and mutated[0] == index:
            _, position, arg_name = mutated
            literal = argv[position].split("=", 1)[1] if position >= len(args) else argv[position]
            argv[position] = f"{argv[position].split('=', 1)[0]}=arg" if position >= len(args) else "arg"
            body += [f"arg = {literal}  # {arg_name}", f"print(impl.{fam}.{op}({', '.join(argv)}))",
                     f"print('{arg_name} after the call (it must be unchanged):', arg)"]
            continue
        body.append(f"print(impl.{fam}.{op}({', '.join(argv)}))")
    lines = ["import torch", "import numpy as np", "from conformance_tests.impl import load_impl",
             *(helper for key, helper in _REPRO_HELPERS.items() if any(key in b for b in body)),
             f"impl = load_impl({state._STATE['impl']!r})", *body]
    return "\n".join(lines)
