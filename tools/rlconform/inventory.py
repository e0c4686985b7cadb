"""The seed inventory: every formula, default, rule, gate and checklist item of the source documents,
each mapped to the clauses that check it or excluded with a reason (``spec/inventory/<family>.yaml``).

:func:`check_inventory` lists every problem (schema, duplicate id, an item with neither clauses nor
an exclusion, an unknown clause id) instead of stopping at the first, so ``rlconform spec coverage``
can print them all.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

import yaml

from rlconform.spec import FAMILIES, SEEDS, Spec, spec_dir

KINDS = ("formula", "default", "rule", "gate", "checklist")
FIELDS = {"id", "seed", "section", "kind", "summary", "clauses", "excluded", "note"}


@dataclasses.dataclass(frozen=True)
class Item:
    id: str
    family: str
    seed: str
    section: str
    kind: str
    summary: str
    clauses: tuple[str, ...] = ()
    excluded: str | None = None
    note: str | None = None
    path: str = ""


def inventory_dir(directory: str | Path | None = None) -> Path:
    return Path(directory) if directory is not None else spec_dir() / "inventory"


def _problems_of(raw: Any, where: str) -> list[str]:
    """Schema problems of one raw item (an empty list when it is well formed)."""
    if not isinstance(raw, Mapping):
        return [f"{where}: expected a mapping"]
    out = []
    unknown = set(raw) - FIELDS
    if unknown:
        out.append(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    for key in ("id", "seed", "section", "kind", "summary"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            out.append(f"{where}: '{key}' must be a non-empty string")
    if raw.get("seed") not in SEEDS:
        out.append(f"{where}: seed {raw.get('seed')!r} is not one of the five documents")
    if raw.get("kind") not in KINDS:
        out.append(f"{where}: kind must be one of {KINDS}, got {raw.get('kind')!r}")
    has_clauses, has_excl = bool(raw.get("clauses")), bool(str(raw.get("excluded") or "").strip())
    if has_clauses and has_excl:
        out.append(f"{where}: give either clauses or excluded, not both")
    if "clauses" in raw and (not isinstance(raw["clauses"], list) or not all(isinstance(c, str) for c in raw["clauses"])):
        out.append(f"{where}: 'clauses' must be a list of clause ids")
    return out


def load_inventory(directory: str | Path | None = None) -> tuple[dict[str, list[Item]], list[str]]:
    """family -> items, and the schema problems found while reading (file and item named in each)."""
    d = inventory_dir(directory)
    items: dict[str, list[Item]] = {}
    problems: list[str] = []
    for fam in FAMILIES:
        path = d / f"{fam}.yaml"
        if not path.exists():
            problems.append(f"{path.name}: missing inventory file for family {fam}")
            continue
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if raw.get("family") != fam:
            problems.append(f"{path.name}: 'family' must be {fam!r}")
        fam_items = []
        for i, r in enumerate(raw.get("items") or []):
            where = f"inventory/{path.name}: item #{i + 1} ({r.get('id', '?') if isinstance(r, Mapping) else '?'})"
            bad = _problems_of(r, where)
            problems += bad
            if isinstance(r, Mapping) and not any("must be a non-empty string" in b and "'id'" in b for b in bad):
                fam_items.append(Item(id=str(r["id"]), family=fam, seed=str(r.get("seed")), section=str(r.get("section")),
                                      kind=str(r.get("kind")), summary=str(r.get("summary")),
                                      clauses=tuple(r.get("clauses") or ()), excluded=r.get("excluded") or None,
                                      note=r.get("note"), path=f"spec/inventory/{path.name}"))
        items[fam] = fam_items
    seen: dict[str, str] = {}
    for it in (i for fam in items.values() for i in fam):
        if it.id in seen:
            problems.append(f"{it.path}: duplicate item id {it.id} (also in {seen[it.id]})")
        seen[it.id] = it.path
    return items, problems


def check_inventory(spec: Spec, directory: str | Path | None = None) -> dict:
    """Items, schema problems, items with neither clauses nor an exclusion, and unknown clause ids
    (clause id -> the items naming it)."""
    items, problems = load_inventory(directory)
    unmapped = [it for fam in items.values() for it in fam if not it.clauses and not it.excluded]
    unknown: dict[str, list[str]] = {}
    for it in (i for fam in items.values() for i in fam):
        for c in it.clauses:
            if c not in spec.clauses:
                unknown.setdefault(c, []).append(f"{it.path}::{it.id}")
    return {"items": items, "problems": problems, "unmapped": unmapped, "unknown": unknown}


def clauses_without_items(spec: Spec, items: Mapping[str, list[Item]]) -> list[str]:
    """Clause ids no inventory item names (informational: a clause may rest on a section as a whole)."""
    named = {c for fam in items.values() for it in fam for c in it.clauses}
    return [c for c in spec.clauses if c not in named]
