"""The expectations file: clauses a team declares as known failures.

Accepted forms (anything else is rejected with file:line: field):

* a list of ``{clause, reason, link?}``;
* ``{expected_failures: [...]}`` holding that list;
* a mapping ``{CLAUSE-ID: reason}`` or ``{CLAUSE-ID: {reason, link?}}``.

Every clause id must exist in the spec, and a clause may be declared once.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rlconform.spec.yamlfile import YamlFileError, load_yaml, validate, where

_ID = r"^[A-Z]+(-[A-Z0-9]+)+-[0-9]+$"
_ENTRY = {
    "type": "object",
    "required": ["clause", "reason"],
    "additionalProperties": False,
    "properties": {
        "clause": {"type": "string", "pattern": _ID},
        "reason": {"type": "string", "minLength": 1},
        "link": {"type": "string"},
    },
}
_REASON = {
    "oneOf": [
        {"type": "string", "minLength": 1},
        {"type": "object", "required": ["reason"], "additionalProperties": False,
         "properties": {"reason": {"type": "string", "minLength": 1}, "link": {"type": "string"}}},
    ]
}
SCHEMA = {
    "oneOf": [
        {"type": "array", "items": _ENTRY},
        {"type": "object", "required": ["expected_failures"], "additionalProperties": False,
         "properties": {"expected_failures": {"type": "array", "items": _ENTRY}}},
        {"type": "object", "minProperties": 1, "propertyNames": {"pattern": _ID},
         "not": {"required": ["expected_failures"]}, "additionalProperties": _REASON},
    ]
}


def _entries(data: Any) -> list[tuple[tuple, dict]]:
    """(path, {clause, reason, link}) for each declared clause, whatever the accepted form."""
    if isinstance(data, list):
        return [((i,), e) for i, e in enumerate(data)]
    if "expected_failures" in data:
        return [(("expected_failures", i), e) for i, e in enumerate(data["expected_failures"])]
    return [((cid,), {"clause": cid, **({"reason": v} if isinstance(v, str) else v)}) for cid, v in data.items()]


def _validate_shape(data: Any, path: Path, lines) -> None:
    """The form first (so a list entry is checked as a list entry), then the schema as a whole."""
    if isinstance(data, list):
        validate(data, {"type": "array", "items": _ENTRY}, path, lines)
    elif isinstance(data, dict) and "expected_failures" in data:
        validate(data, SCHEMA["oneOf"][1], path, lines)
    elif isinstance(data, dict):
        validate(data, SCHEMA["oneOf"][2], path, lines)
    else:
        validate(data, SCHEMA, path, lines)


def load_expectations(path: str | Path | None, known_clauses=None) -> dict[str, dict]:
    """clause id -> {clause, reason, link}; :class:`YamlFileError` (file:line: field) on any problem."""
    if not path:
        return {}
    path = Path(path)
    data, lines = load_yaml(path)
    if data is None:
        raise YamlFileError(f"{path}: the file is empty; declare at least one expected failure or drop the option")
    _validate_shape(data, path, lines)
    out: dict[str, dict] = {}
    for p, entry in _entries(data):
        cid = entry["clause"]
        at = p if isinstance(data, dict) and "expected_failures" not in data else p + ("clause",)
        if known_clauses is not None and cid not in known_clauses:
            near = sorted(c for c in known_clauses if c.split("-")[0] == cid.split("-")[0])[:5]
            hint = f" (known ids look like {', '.join(near)})" if near else ""
            raise YamlFileError(f"{where(path, lines, at)}: clause: unknown clause id {cid!r}{hint}")
        if cid in out:
            raise YamlFileError(f"{where(path, lines, at)}: clause: {cid} is declared twice")
        out[cid] = {"clause": cid, "reason": entry["reason"], "link": entry.get("link")}
    return out
