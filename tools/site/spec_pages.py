"""The specification pages, generated from ``spec/*.yaml``: one page per family (every clause anchored by its
id), the index, errata, defaults, gates, conventions and source-documents pages."""
from __future__ import annotations

import html
import json
from typing import Any

from rlconform.spec import exact_reason

from tools.site.documents import (
    DOCUMENTS_FILE,
    DOCUMENTS_PAGE,
    cite,
    doc_anchor,
    doc_name,
    load_documents,
    section_order,
)
from tools.site.figures import Figure
from tools.site.introspect import resolve_dotted, signature, summary
from tools.site.markup import cell, clause_link, docstring_markdown, fmt_value, indent, linkify, plain, rel, text

CONVENTIONS_PAGE = "spec/conventions.md"


def tests_by_clause(marks: dict[str, tuple[str, ...]]) -> dict[str, dict[str, int]]:
    """clause id -> {test function nodeid (parameters folded): number of collected cases}."""
    out: dict[str, dict[str, int]] = {}
    for nodeid, clauses in marks.items():
        func = nodeid.split("[", 1)[0]
        for c in clauses:
            d = out.setdefault(c, {})
            d[func] = d.get(func, 0) + 1
    return out


def _tolerance_line(tol) -> str:
    if tol.exact:
        return f"`{tol.name}`: {text(tol.description)}"
    per = "; ".join(f"{d} rtol {v['rtol']:g}, atol {v['atol']:g}" for d, v in tol.per_dtype.items())
    return f"`{tol.name}`: {text(tol.description)} ({per})"


def _source_line(c, page: str) -> str:
    return cite(c.source, page)


def _reference_lines(c) -> list[str]:
    out = []
    for dotted in c.implemented_by:
        fn = resolve_dotted(dotted)
        if fn is None:
            out.append(f"`{dotted}` (not importable at build time)")
            continue
        doc = summary(getattr(fn, "__doc__", ""))
        out.append(f"`{dotted}`: `{signature(fn)}`" + (f"<br>{docstring_markdown(doc, emphasis=True)}" if doc else ""))
    return out


def clause_block(spec, fspec, c, tests: dict[str, int], page: str) -> str:
    """One clause: anchored heading, statement, display formula, then its facts."""
    dep = " (deprecated)" if c.deprecated else ""
    lines = [f"### {c.id}: {text(plain(c.title))}{dep} {{ #{c.id} }}", "",
             f"**{c.level}**{'' if c.level == 'MUST' else ' (fails the audit when present and wrong)' if c.binding else ' (a recommendation)'}"
             f" · {c.kind} · tolerance `{c.tolerance.name}`", "", text(c.statement), ""]
    if c.formula:
        lines += ["$$", c.formula.strip(), "$$", ""]
    facts = [f"- **Source:** {_source_line(c, page)}", f"- **Tolerance:** {_tolerance_line(c.tolerance)}"]
    if exact_reason(c):
        facts.append(f"- **Why exact on every device:** {text(exact_reason(c))}")
    if c.normative:
        facts.append(f"- **Normative part:** {linkify(text(c.normative), spec, page)}")
    if c.conventions:
        facts.append("- **Conventions:** " + ", ".join(
            f"[{cv}]({rel(page, CONVENTIONS_PAGE)}#{cv})" for cv in c.conventions))
    if c.value:
        facts.append("- **Default:** " + ", ".join(f"`{k}` = `{fmt_value(v)}`" for k, v in c.value.items()))
    if c.gate:
        g = c.gate
        facts.append(f"- **Gate:** `{g['metric']}` {html.escape(str(g['op']))} `{fmt_value(g['threshold'])}`"
                     f" (aggregate `{g.get('aggregate', 'last')}`)")
    refs = _reference_lines(c)
    if refs:
        facts.append("- **Reference implementation:** " + ("<br>".join(refs)))
    n = sum(tests.values())
    facts.append(f"- **Tests:** {n} collected case(s) in {len(tests)} test function(s)" if tests
                 else "- **Tests:** none collected")
    lines += facts + [""]
    if tests:
        body = "\n".join(f"- `{f}`" + (f" ×{k}" if k > 1 else "") for f, k in sorted(tests.items()))
        lines += [f'??? note "Tests checking {c.id}"', "", indent(body), ""]
    if c.errata:
        lines += ['!!! warning "Errata"', "", indent(linkify(text(c.errata), spec, page)), ""]
    if c.notes:
        lines += ['!!! note "Notes"', "", indent(linkify(text(c.notes), spec, page)), ""]
    return "\n".join(lines)


def family_page(spec, family: str, tests: dict[str, dict[str, int]], figures: list[Figure]) -> str:
    f = spec.families[family]
    page = f"spec/{family}.md"
    doc = f.document
    n_must = sum(c.level == "MUST" for c in f.clauses)
    n_err = sum(bool(c.errata) for c in f.clauses)
    out = [f"# {family}: {text(f.name)}", "",
           "!!! info \"Generated page\"", "",
           indent(f"Generated from `spec/{family}.yaml` at build time; edit the YAML, not this page."), "",
           f"- **Document:** [{text(doc_name(doc['seed']))}: {text(plain(doc['title']))}]"
           f"({rel(page, DOCUMENTS_PAGE)}#{doc_anchor(doc['seed'])})",
           f"- **Version:** {text(doc['version'])}" + (f" ({text(doc['date'])})" if doc.get("date") else "")]
    for r in f.related:
        out.append(f"- **Related:** [{text(doc_name(r.get('seed', '')))}]({rel(page, DOCUMENTS_PAGE)}"
                   f"#{doc_anchor(r.get('seed', ''))}) {text(plain(r.get('title', '')))}: {text(r.get('role', ''))}")
    n_binding_should = sum(c.level != "MUST" and c.binding for c in f.clauses)
    out += [f"- **Clauses:** {len(f.clauses)} ({n_must} MUST, {len(f.clauses) - n_must} SHOULD), "
            f"{n_err} with errata; contract: [{family} operations](../contract/{family}.md)",
            f"- **Levels:** MUST: an implementation must provide the behaviour. SHOULD: it may leave the behaviour "
            f"out (its tests are then not applicable), but a SHOULD formula, rule or gate metric it provides must "
            f"be right: "
            f"{n_binding_should} of the SHOULD clauses here fail the audit when present and wrong; the SHOULD "
            f"defaults and input checks are recommendations, listed but not failing.", ""]
    if f.checklist:
        out += ["## Grey-release checklist", ""]
        for item in f.checklist:
            out.append(f"- {text(plain(item.title))}: " + ", ".join(clause_link(spec, c, page) for c in item.clauses))
        out.append("")
    index = ["| clause | level | kind | title |", "|---|---|---|---|"]
    index += [f"| [{c.id}](#{c.id}) | {c.level} | {c.kind} | {cell(c.title)} |" for c in f.clauses]
    out += [f'??? abstract "Clause index ({len(f.clauses)} clauses)"', "", indent("\n".join(index)), ""]
    # Clauses grouped by the document section they come from, in the document's own section order.
    groups: dict[tuple[str, str], list] = {}
    for c in f.clauses:
        groups.setdefault((c.source["seed"], c.source["section"]), []).append(c)
    for (seed, section), clauses in sorted(groups.items(), key=lambda kv: (kv[0][0] != doc["seed"], kv[0][0],
                                                                        section_order(*kv[0]))):
        other = "" if seed == doc["seed"] else f" ({text(doc_name(seed))})"
        out += [f"## § {text(plain(section))}{other}", "", f"Source: {cite({'seed': seed, 'section': section}, page)}", ""]
        for c in clauses:
            out += [clause_block(spec, f, c, tests.get(c.id, {}), page), ""]
    figs = [fg for fg in figures if fg.family == family]
    if figs:
        out += ["## Figures", ""]
        for fg in figs:
            out += fg.markdown(page) + [""]
    return "\n".join(out)


def spec_index_page(spec) -> str:
    out = ["# Specification", "",
           "Each family's clauses are data in `spec/<family>.yaml`; these pages are generated from them at "
           "build time. A clause's id is its anchor, so `spec/sac.md#SAC-TEMP-1` is a stable link.", "",
           "| family | document | version | clauses | MUST | errata | defaults | gates |",
           "|---|---|---|---|---|---|---|---|"]
    for fam, f in spec.families.items():
        cs = f.clauses
        out.append(f"| [{fam}]({fam}.md) | {cell(f.document['title'])} | {cell(f.version)} | {len(cs)} | "
                   f"{sum(c.level == 'MUST' for c in cs)} | {sum(bool(c.errata) for c in cs)} | "
                   f"{sum(c.kind == 'default' for c in cs)} | {sum(c.kind == 'gate' for c in cs)} |")
    out += ["", "Also: [errata](errata.md) (every place a source contradicts itself, and the reading taken), "
            "[defaults](defaults.md), [go-live gates and SLOs](gates.md).", "",
            "## Tolerance classes", "", "| class | description | per dtype (rtol, atol) |", "|---|---|---|"]
    for t in spec.tolerances.values():
        per = "; ".join(f"{d}: {v['rtol']:g}, {v['atol']:g}" for d, v in t.per_dtype.items()) or "bitwise"
        out.append(f"| `{t.name}` | {cell(t.description)} | {per} |")
    return "\n".join(out) + "\n"


def documents_page(spec) -> str:
    """Every source document: title, version, date, role, and its headings in order with what cites them."""
    page = DOCUMENTS_PAGE
    cited: dict[tuple[str, str], list[str]] = {}
    for c in spec.clauses.values():
        cited.setdefault((c.source["seed"], c.source["section"]), []).append(clause_link(spec, c.id, page))
    for cv in getattr(spec, "conventions", {}).values():
        for src in cv.source:
            cited.setdefault((src["seed"], src["section"]), []).append(
                f"[convention `{cv.id}`]({rel(page, CONVENTIONS_PAGE)}#{cv.id})")
    out = ["# Source documents", "",
           "The documents the specification is written from. Every citation on this site (a clause's "
           "*Source*, an errata note, a convention) links to a section below; the sections are listed in "
           "each document's own order, with the clauses that cite them. The documents are in Chinese; "
           "the clauses restate them in English.", ""]
    docs = load_documents()
    if not docs:
        return "\n".join(out + [f"`docs/{DOCUMENTS_FILE}` is missing, so no document can be listed.", ""])
    out += ["| document | version | date | role |", "|---|---|---|---|"]
    for seed, d in docs.items():
        out.append(f"| [{cell(d['short'])}](#{doc_anchor(seed)}) | {cell(d.get('version', '–'))} | "
                   f"{cell(d.get('date') or 'undated')} | {cell(d['role'])} |")
    out.append("")
    for seed, d in docs.items():
        fam = d.get("family")
        role = d["role"] + (f", superseded by [{text(doc_name(d['superseded_by']))}](#{doc_anchor(d['superseded_by'])})"
                            if d.get("superseded_by") else "")
        title = plain(d["title"])
        head = title if title.startswith(d["short"]) else f"{d['short']}: {title}"
        out += [f"## {text(head)} {{ #{doc_anchor(seed)} }}", "",
                f"- **Version:** {text(d.get('version', '–'))}; **date:** {text(d.get('date') or 'undated')}"
                + (f"; **author:** {text(d['author'])}" if d.get("author") else ""),
                f"- **Role:** {role}. {text(d.get('note', ''))}",
                (f"- **Family:** [{fam}]({fam}.md)" if fam in spec.families else "- **Family:** none"),
                f"- **File in the spec's `source:` fields:** `{seed}`", "",
                "| section (in the document's order) | cited by |", "|---|---|"]
        for i, sec in enumerate(d["sections"]):
            refs = ", ".join(cited.get((seed, sec), [])) or "–"
            out.append(f'| <span id="{doc_anchor(seed)}-s{i}"></span>{cell(plain(sec))} | {refs} |')
        out.append("")
    return "\n".join(out)


def _json(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)


def conventions_page(spec) -> str:
    """spec/conventions.yaml: each convention, the seed's value, what may be declared, and the consequences."""
    page = CONVENTIONS_PAGE
    convs = getattr(spec, "conventions", {}) or {}
    out = ["# Conventions", "",
           "A convention is a choice the source documents make where other choices are also sound. An "
           "implementation declares its own in `capabilities[\"conventions\"][id]`; the tests then compute their "
           "oracle under the declared value and keep checking the normative part, which no declaration relaxes. "
           "A declared value other than the seed's is reported as a *deviation* with the consequence below, "
           "never as a failure; an undeclared departure fails. Generated from `spec/conventions.yaml`.", ""]
    if not convs:
        return "\n".join(out + ["No conventions are defined in this build.", ""])
    out += ["| convention | seed value | clauses |", "|---|---|---|"]
    for cv in convs.values():
        out.append(f"| [{cell(plain(cv.title))}](#{cv.id}) | `{_json(cv.seed)}` | "
                   + ", ".join(clause_link(spec, c, page) for c in cv.clauses) + " |")
    out.append("")
    for cv in convs.values():
        out += [f"## {text(plain(cv.title))} {{ #{cv.id} }}", "",
                f"- **Id:** `{cv.id}`; **seed value:** `{_json(cv.seed)}`"
                + "".join(f"; `{_json(v)}` for {clause_link(spec, c, page)}" for c, v in cv.seed_by_clause.items()),
                f"- **May be declared:** `{_json(cv.allowed)}`",
                "- **Clauses:** " + ", ".join(clause_link(spec, c, page) for c in cv.clauses),
                "- **Sources:** " + "; ".join(cite(src, page) for src in cv.source),
                f"- **Always checked (normative):** {linkify(text(cv.normative), spec, page)}", "",
                "| declared value | consequence |", "|---|---|"]
        for alt in cv.alternatives:
            when = alt.get("when")
            out.append(f"| {'any other value' if when == '*' else f'`{_json(when)}`'} | "
                       f"{linkify(cell(alt.get('consequence', '')), spec, page)} |")
        out.append("")
    return "\n".join(out)


def errata_page(spec) -> str:
    page = "spec/errata.md"
    out = ["# Errata", "",
           "Every clause whose sources contradict each other or are ambiguous carries an errata note: "
           "what the sources say, the reading the clause takes, and why. Generated from the `errata` "
           "fields of `spec/*.yaml`. Each source links to its document and section on the "
           "[Documents](documents.md) page.", ""]
    for fam, f in spec.families.items():
        rows = [c for c in f.clauses if c.errata]
        if not rows:
            continue
        out += [f"## {fam} ({text(f.version)})", "", "| clause | source | what the sources say, and the reading taken |",
                "|---|---|---|"]
        for c in rows:
            out.append(f"| {clause_link(spec, c.id, page)}<br>{cell(plain(c.title))} | "
                       f"{cite(c.source, page).replace('|', '&#124;')} | {linkify(cell(c.errata), spec, page)} |")
        out.append("")
    return "\n".join(out)


def _per_family_tables(spec, kind: str, header: str, rows_of) -> list[str]:
    """One section per family with clauses of ``kind``: a table with ``header`` and the rows ``rows_of(c)``."""
    out = []
    for fam, f in spec.families.items():
        clauses = [c for c in f.clauses if c.kind == kind]
        if clauses:
            cols = header.count("|") - 1
            out += [f"## {fam}", "", header, "|" + "---|" * cols, *(r for c in clauses for r in rows_of(c)), ""]
    return out


def defaults_page(spec) -> str:
    page = "spec/defaults.md"
    out = ["# Defaults", "",
           "Default hyper-parameters are clauses of kind `default`; each maps keys of the family's "
           "`defaults()` operation to values, and `test_defaults.py` checks an implementation's "
           "`defaults()` against them.", ""]
    out += _per_family_tables(spec, "default", "| clause | key | value | level | title |", lambda c: [
        f"| {clause_link(spec, c.id, page)} | `{k}` | `{fmt_value(v)}` | {c.level} | {cell(c.title)} |"
        for k, v in (c.value or {}).items()])
    return "\n".join(out)


def gates_page(spec) -> str:
    page = "spec/gates.md"
    out = ["# Go-live gates and SLOs", "",
           "Gate clauses are thresholds on the metrics a trainer writes to `metrics.jsonl` (one JSON object "
           "per update). `rlconform gate RUN/metrics.jsonl` aggregates each metric as the clause says and "
           "compares it with the threshold; any failing gate fails the command; with `--strict` a gate whose metric is missing fails it too.", ""]
    out += _per_family_tables(
        spec, "gate", "| clause | metric | condition | aggregate | level | statement |", lambda c: [
            f"| {clause_link(spec, c.id, page)} | `{c.gate['metric']}` | {html.escape(str(c.gate['op']))} "
            f"`{fmt_value(c.gate['threshold'])}` | `{c.gate.get('aggregate', 'last')}` | {c.level} | {cell(c.statement)} |"])
    return "\n".join(out)
