"""Abstract action fingerprints and contextual anchors (seed 004 §3.1, §5.2.1).

A fingerprint keeps what an action *does* and drops what only this episode's layout knows
(instance numbers, screen coordinates, element ids), so STDB statistics are shared across seeds.
Fingerprinters are pluggable: each domain registers a callable under a name.
"""
from __future__ import annotations

import re
from typing import Mapping, Protocol
from urllib.parse import urlsplit

START = "<START>"


class Fingerprinter(Protocol):
    def __call__(self, raw_action: str, *, labels: Mapping[str, str] | None = None) -> str:
        """Raw action text -> ``VERB(arg, ...)``."""


FINGERPRINTERS: dict[str, Fingerprinter] = {}


def register_fingerprinter(domain: str, fn: Fingerprinter) -> Fingerprinter:
    """Add (or replace) the fingerprinter of ``domain``; returns ``fn`` so it can decorate."""
    FINGERPRINTERS[domain] = fn
    return fn


def _fmt(verb: str, args) -> str:
    return f"{verb}({', '.join(args)})"


# ALFWorld verbs; "go to" is two words. Prepositions and instance numbers are noise.
_ALF_VERBS = {"go": "GOTO", "put": "PUT", "take": "TAKE", "open": "OPEN", "close": "CLOSE",
              "toggle": "TOGGLE", "heat": "HEAT", "cool": "COOL", "clean": "CLEAN", "slice": "SLICE",
              "use": "USE", "examine": "EXAMINE", "look": "LOOK", "inventory": "INVENTORY"}
_ALF_NOISE = {"to", "in", "on", "in/on", "from", "with", "a", "the"}


def alfworld_fingerprint(raw_action: str, *, labels: Mapping[str, str] | None = None) -> str:
    """``put apple 1 in fridge 2`` -> ``PUT(apple, fridge)``. Implements: CCAPO-FP-1."""
    words = raw_action.strip().lower().split()
    if not words or words[0] not in _ALF_VERBS:
        raise ValueError(f"[CCAPO-INPUT-4] not an ALFWorld command: {raw_action!r}")
    args = [w for w in words[1:] if w not in _ALF_NOISE and not w.isdigit()]
    return _fmt(_ALF_VERBS[words[0]], args)


_GUI_CALL = re.compile(r"^\s*(\w+)\s*\((.*)\)\s*$", re.S)
_GUI_KW = re.compile(r"(\w+)\s*=\s*(\"[^\"]*\"|'[^']*'|[^,]+)")
_GUI_VERBS = {"tap": "CLICK", "click": "CLICK", "long_press": "LONG_PRESS", "type": "TYPE", "input": "TYPE",
              "swipe": "SCROLL", "scroll": "SCROLL", "back": "BACK", "home": "HOME", "enter": "ENTER"}
_GUI_TARGETED = {"CLICK", "LONG_PRESS", "TYPE"}


def _unquote(value: str) -> str:
    """A keyword's value without the one pair of quotes around it; quotes inside are the value's own."""
    v = value.strip()
    return v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'" else v


def gui_fingerprint(raw_action: str, *, labels: Mapping[str, str] | None = None) -> str:
    """``tap(x=500, y=800, id="btn_x9z")`` with labels {"btn_x9z": "Submit"} -> ``CLICK(Submit)``.

    Coordinates and typed text are dropped; the element id is replaced by its label, so the same
    button gets one node whatever its id in this build. Implements: CCAPO-FP-2.
    """
    m = _GUI_CALL.match(raw_action)
    if not m or m.group(1).lower() not in _GUI_VERBS:
        raise ValueError(f"[CCAPO-INPUT-4] not a GUI action call: {raw_action!r}")
    verb = _GUI_VERBS[m.group(1).lower()]
    kw = {k: _unquote(v) for k, v in _GUI_KW.findall(m.group(2))}
    if verb in _GUI_TARGETED:
        eid = kw.get("id")
        if eid is None or labels is None or eid not in labels:
            raise ValueError(f"[CCAPO-INPUT-4] element id {eid!r} of {raw_action!r} has no label")
        return _fmt(verb, [labels[eid]])
    if verb == "SCROLL" and "direction" in kw:
        return _fmt(verb, [kw["direction"].lower()])
    return _fmt(verb, [])


register_fingerprinter("alfworld", alfworld_fingerprint)
register_fingerprinter("gui", gui_fingerprint)


def fingerprint(raw_action: str, *, domain: str, labels: Mapping[str, str] | None = None) -> str:
    """Dispatch to the registered fingerprinter of ``domain``. Implements: CCAPO-FP-1, CCAPO-FP-2, CCAPO-FP-3."""
    if domain not in FINGERPRINTERS:
        raise ValueError(f"[CCAPO-INPUT-4] no fingerprinter registered for domain {domain!r}")
    return FINGERPRINTERS[domain](raw_action, labels=labels)


def abstract_location(raw_location: str, *, domain: str) -> str:
    """Abstract_Loc(s): room (alfworld), activity (android), host + path (web). Implements: CCAPO-ANCHOR-1."""
    if domain == "web":
        u = urlsplit(raw_location if "//" in raw_location else "//" + raw_location)
        return (u.hostname or "") + (u.path.rstrip("/") or "/")
    if domain in ("alfworld", "android"):
        return raw_location.strip()
    raise ValueError(f"[CCAPO-INPUT-4] no location abstraction for domain {domain!r}")


def anchor(location: str, prev_fingerprint: str | None) -> tuple[str, str]:
    r""":math:`S_{anchor} = (\mathrm{Abstract\_Loc}(s_t), \mathrm{Fingerprint}(a_{t-1}))`, START at t = 0.
    Implements: CCAPO-ANCHOR-1."""
    return (location, START if prev_fingerprint is None else prev_fingerprint)


# TextWorld (and so ALFWorld's engine): the verbs of the game grammar. Objects keep their full name
# ("yellow bell pepper", "loaf of bread"), which is what TextWorld calls the object's type; the
# prepositions that join an object to its container, support or tool separate the arguments.
_TW_VERBS = {"go": "GO", "take": "TAKE", "drop": "DROP", "put": "PUT", "insert": "INSERT", "open": "OPEN",
             "close": "CLOSE", "lock": "LOCK", "unlock": "UNLOCK", "eat": "EAT", "drink": "DRINK",
             "cook": "COOK", "slice": "SLICE", "dice": "DICE", "chop": "CHOP", "prepare": "PREPARE",
             "examine": "EXAMINE", "look": "LOOK", "inventory": "INVENTORY"}
_TW_SEPARATORS = {"from", "on", "into", "in", "with"}
_TW_NOISE = {"a", "an", "the"}


def textworld_fingerprint(raw_action: str, *, labels: Mapping[str, str] | None = None) -> str:
    """``take yellow bell pepper from counter`` -> ``TAKE(yellow bell pepper, counter)``.

    Lower-cased; articles and instance numbers dropped. Implements: CCAPO-FP-1, CCAPO-FP-3
    """
    words = raw_action.strip().lower().split()
    if not words or words[0] not in _TW_VERBS:
        raise ValueError(f"[CCAPO-INPUT-4] not a TextWorld command: {raw_action!r}")
    args: list[list[str]] = [[]]
    for w in words[1:]:
        if w in _TW_SEPARATORS:
            args.append([])
        elif w not in _TW_NOISE and not w.isdigit():
            args[-1].append(w)
    if any(not a for a in args[1:]):
        raise ValueError(f"[CCAPO-INPUT-4] a preposition without an object in {raw_action!r}")
    return _fmt(_TW_VERBS[words[0]], [" ".join(a) for a in args if a])


register_fingerprinter("textworld", textworld_fingerprint)
