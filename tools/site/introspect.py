"""The reference functions a clause names (``implemented_by``) and the contract's operations: imported by
dotted path, their signatures written as in the source, their docstrings' summaries."""
from __future__ import annotations

import importlib
import inspect
import re
from typing import Any, Callable


def resolve_dotted(path: str) -> Any | None:
    """Import ``a.b.c.func`` (longest importable module prefix, then attributes); None if absent."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for a in parts[i:]:
                obj = getattr(obj, a)
            return obj
        except AttributeError:
            return None
    return None


def signature(fn: Callable, name: str | None = None) -> str:
    """``name(a: T, *, k: T = v) -> R`` with annotations as written in the source (no ``self``)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return f"{name or fn.__name__}(...)"
    params = []
    star_done = False
    for p in sig.parameters.values():
        if p.name == "self":
            continue
        if p.kind is p.KEYWORD_ONLY and not star_done:
            params.append("*")
            star_done = True
        if p.kind is p.VAR_POSITIONAL:
            star_done = True
        s = ("*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else "") + p.name
        if p.annotation is not p.empty:
            s += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            s += f" = {p.default!r}" if p.annotation is not p.empty else f"={p.default!r}"
        params.append(s)
    ret = f" -> {_annotation(sig.return_annotation)}" if sig.return_annotation is not sig.empty else ""
    return f"{name or fn.__name__}({', '.join(params)}){ret}"


def _annotation(a: Any) -> str:
    if isinstance(a, str):
        return a
    return getattr(a, "__name__", None) or str(a).replace("typing.", "")


def summary(doc: str | None) -> str:
    """A docstring's first paragraph, whitespace folded: its summary, whole where it wraps over several lines
    (a sentence or a ``:math:`` role cut at a line end would show half of itself)."""
    return " ".join(re.split(r"\n\s*\n", inspect.cleandoc(doc or "").strip(), maxsplit=1)[0].split())
