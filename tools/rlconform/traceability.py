"""The traceability page: every seed item of ``spec/inventory/`` with the clauses that check it (as
links to their anchors) or the reason it is excluded, per family and per source section.

:func:`traceability_page` returns the Markdown of ``spec/traceability.md``; the site's
``generated_pages`` publishes it. Gate items also say whether any reference code logs the gate's
metric, so a gate nothing produces is visible.
"""
from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

from rlconform.inventory import Item, clauses_without_items, load_inventory
from rlconform.spec import Spec, default_spec

PAGE = "spec/traceability.md"


def _cell(s: str) -> str:
    return " ".join(str(s).split()).replace("|", "\\|")


def _link(spec: Spec, cid: str) -> str:
    """Link from spec/traceability.md to the clause anchor on its family page (same folder)."""
    return f"[{cid}]({spec.clauses[cid].family}.md#{cid})" if cid in spec.clauses else f"`{cid}` (unknown)"


@functools.lru_cache(maxsize=1)
def _producer_sources() -> str:
    """The code that produces gate metrics: the reference's trainers (read as files, without importing torch)
    and the go-live runs that pool them (rlconform.golive)."""
    root = Path(importlib.util.find_spec("reference_impl").origin).parent
    files = [*sorted(root.rglob("*.py")), Path(importlib.util.find_spec("rlconform.golive").origin)]
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


def gate_producers(spec: Spec) -> dict[str, bool]:
    """Gate clause id -> whether the code that produces gate metrics (:func:`_producer_sources`) mentions its
    metric as a quoted name or a keyword argument (a logged figure); False marks a gate nothing produces."""
    src = _producer_sources()
    out = {}
    for c in spec.clauses.values():
        if c.kind == "gate":
            m = re.escape(c.gate["metric"])
            out[c.id] = bool(re.search(rf"""["']{m}["']|\b{m}=""", src))
    return out


def _mapping(spec: Spec, it: Item, produced: dict[str, bool]) -> str:
    if it.excluded:
        return f"excluded: {_cell(it.excluded)}"
    links = ", ".join(_link(spec, c) for c in it.clauses)
    unproduced = [c for c in it.clauses if produced.get(c) is False]
    if unproduced:
        links += " (no bundled code logs the metric of " + ", ".join(unproduced) + "; the figure is user-supplied)"
    return links


def _section_key(section: str) -> tuple:
    """Document order: '5.2 ...' after '5. ...' and before '10. ...'; lettered appendices and unnumbered last."""
    m = re.match(r"\s*(\d+(?:\.\d+)*)", section)
    return (0, tuple(int(x) for x in m.group(1).split("."))) if m else (1, (section,))


def family_section(spec: Spec, family: str, items: list[Item], produced: dict[str, bool]) -> list[str]:
    fs = spec.families.get(family)
    title = fs.document["title"] if fs else family
    n_ex = sum(1 for it in items if it.excluded)
    out = [f"## {family}", "", f"{len(items)} items of *{_cell(title)}*: {len(items) - n_ex} mapped to clauses, "
           f"{n_ex} excluded with a reason.", ""]
    by_section: dict[tuple[str, str], list[Item]] = {}
    for it in items:
        by_section.setdefault((it.seed, it.section), []).append(it)
    for (seed, section), group in sorted(by_section.items(), key=lambda kv: (kv[0][0], _section_key(kv[0][1]))):
        out += [f"### {_cell(section)}", "", f"Source: `{seed}`", "",
                "| item | kind | seed item (our words) | clauses or exclusion |", "|---|---|---|---|"]
        for it in group:
            summary = _cell(it.summary) + (f" — *{_cell(it.note)}*" if it.note else "")
            out.append(f"| `{it.id}` | {it.kind} | {summary} | {_mapping(spec, it, produced)} |")
        out.append("")
    return out


def traceability_page(spec: Spec | None = None, directory=None) -> str:
    """Markdown of the traceability page (seed item -> clause links)."""
    spec = spec or default_spec()
    items, problems = load_inventory(directory)
    produced = gate_producers(spec)
    total = sum(len(v) for v in items.values())
    out = ["# Traceability: seed items to clauses", "",
           "Every formula, default, rule, gate and checklist item of the source documents, in our own "
           "words, with the clauses that check it or the reason it is left out. Generated from "
           "`spec/inventory/*.yaml`; `rlconform spec coverage` fails on an item with neither, or one "
           "naming an unknown clause.", "",
           f"{total} items in {len(items)} families.", ""]
    if problems:
        out += ["!!! warning \"Inventory problems\"", ""] + [f"    - {_cell(p)}" for p in problems] + [""]
    for fam, fam_items in items.items():
        out += family_section(spec, fam, fam_items, produced)
    spare = clauses_without_items(spec, items)
    if spare:
        out += ["## Clauses no item names", "",
                "These clauses rest on a section as a whole (bad-input rules, stability rules) rather than "
                "on one listed item: " + ", ".join(_link(spec, c) for c in spare) + ".", ""]
    return "\n".join(out)
