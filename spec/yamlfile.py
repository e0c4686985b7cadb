"""User-facing YAML files read with line numbers and checked against a JSON Schema.

Every error names the file, the line and the field (``spec/sac.yaml:120: clauses[4].level: 'MAY' is
not one of ['MUST', 'SHOULD']``): a malformed file must never surface as a traceback or, worse, be
half-read and silently ignored.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import jsonschema
import yaml


class YamlFileError(ValueError):
    """A user file is unreadable, not YAML, or breaks its schema; the message says file:line: field."""


Lines = Mapping[tuple, int]


class _LineLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """A safe loader that remembers the line of every mapping value and sequence item (libyaml's parser
    where PyYAML has it: every audit child reads the whole spec, 4x faster than the pure-Python one)."""


def _construct_with_lines(loader: _LineLoader, node: yaml.Node, path: tuple) -> Any:
    loader.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        out = {}
        for knode, vnode in node.value:
            key = loader.construct_object(knode, deep=True)
            try:
                hash(key)
            except TypeError:
                raise YamlFileError(f"{loader.name}:{knode.start_mark.line + 1}: a mapping key must be a scalar") from None
            if key in out:
                raise YamlFileError(f"{loader.name}:{knode.start_mark.line + 1}: {field_name(path + (key,))}: "
                                    "duplicate key (YAML would silently keep only the last one)")
            out[key] = _construct_with_lines(loader, vnode, path + (key,))
            loader.lines[path + (key,)] = knode.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct_with_lines(loader, v, path + (i,)) for i, v in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def load_yaml(path: str | Path) -> tuple[Any, dict[tuple, int]]:
    """(data, lines): the parsed file and the 1-based line of each value, keyed by its path of keys/indices."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise YamlFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise YamlFileError(f"{path}: cannot read ({e})") from None
    loader = _LineLoader(text)
    loader.name = str(path)
    loader.lines = {}
    try:
        node = loader.get_single_node()
        data = None if node is None else _construct_with_lines(loader, node, ())
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise YamlFileError(f"{path}{line}: not valid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise YamlFileError(f"{path}: not valid YAML: {e}") from None
    finally:
        loader.dispose()
    return data, loader.lines


def field_name(path: tuple) -> str:
    """``('clauses', 4, 'level')`` -> ``clauses[4].level``."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def line_of(lines: Lines, path: tuple) -> int | None:
    """The line of ``path``, or of its nearest recorded ancestor."""
    path = tuple(path)
    while path not in lines and path:
        path = path[:-1]
    return lines.get(path)


def where(file: str | Path, lines: Lines, path: tuple) -> str:
    line = line_of(lines, path)
    return f"{file}:{line}" if line else str(file)


def validate(data: Any, schema: Mapping[str, Any], file: str | Path, lines: Lines) -> None:
    """Raise :class:`YamlFileError` for the first (most specific) schema violation, naming file:line: field."""
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: (-len(e.absolute_path), str(e.absolute_path)))
    if not errors:
        return
    err = jsonschema.exceptions.best_match(errors)
    path = tuple(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        if extra:
            path = path + (extra[0],)
            raise YamlFileError(f"{where(file, lines, path)}: {field_name(path)}: unknown field")
    if err.validator == "required":
        missing = next((r for r in err.validator_value if r not in (err.instance or {})), "?")
        raise YamlFileError(f"{where(file, lines, path)}: {field_name(path + (missing,))}: required field is missing")
    raise YamlFileError(f"{where(file, lines, path)}: {field_name(path)}: {err.message}")
