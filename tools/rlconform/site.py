"""The documentation site, generated from the spec at build time.

This module is both the MkDocs hook named in ``mkdocs.yml`` (``on_config`` fills the navigation,
``on_files`` adds the generated pages, figures and the MathJax library, ``on_page_markdown`` fills
the markers in hand-written pages) and a small CLI::

    python -m rlconform.site build [--site-dir DIR] [--report report.json] [--serve]

Generated pages: ``spec/<family>.md`` (every clause, anchored by its id), ``spec/errata.md``,
``spec/defaults.md``, ``spec/gates.md``, ``contract/<family>.md`` (the Protocols), ``figures.md``,
``conformance/reference.md`` (an audit of the bundled reference) and ``audits/<name>/index.md`` for
each third-party audit under ``docs/audits/``. Nothing generated is committed: the spec is written once.

Environment: ``RLCONFORM_AUDIT_REPORT`` names a report.json to render instead of running the suite
(``skip`` leaves the reference audit out); ``RLCONFORM_MATHJAX_DIR`` names a MathJax 3 ``es5``
directory to use instead of the one shipped by the ``django-static-mathjax`` package.
"""
from __future__ import annotations

import argparse
import dataclasses
import html
import importlib
import importlib.util
import inspect
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from conformance_tests import contract
from rlconform.audit import clause_report, render_checklist, run_suite
from rlconform.cli import build_parser
from rlconform.coverage import collect_tests
from rlconform.provenance import render_markdown, stamp
from rlconform.spec import exact_reason, load_spec
from rlconform.traceability import traceability_page

REPO = Path(__file__).resolve().parents[2]
AUDIT_ENV = "RLCONFORM_AUDIT_REPORT"
MATHJAX_ENV = "RLCONFORM_MATHJAX_DIR"
# What the site needs from MathJax 3's es5 build: the combined TeX->CommonHTML component, the TeX
# extensions it autoloads, its fonts, and the menu/a11y components it loads lazily.
MATHJAX_PARTS = ("tex-chtml.js", "input/tex/extensions", "output/chtml/fonts/woff-v2", "ui", "a11y")
_CLAUSE_RE = re.compile(r"(?<![A-Za-z0-9-])((?:SAC|PPO|ISR|CCAPO)(?:-[A-Z0-9]+)+-\d+)(?![A-Za-z0-9-])")


# ------------------------------------------------------------------------------------------ text
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def _outside_code(s: str, fn: Callable[[str], str]) -> str:
    """Apply ``fn`` to the parts of ``s`` that are not `code spans` (those Markdown escapes itself)."""
    out, pos = [], 0
    for m in _CODE_SPAN.finditer(s):
        out += [fn(s[pos:m.start()]), m.group(0)]
        pos = m.end()
    return "".join(out + [fn(s[pos:])])


def text(s: Any, *, emphasis: bool = False) -> str:
    """Prose as Markdown: whitespace folded, HTML escaped (and ``*`` unless ``emphasis``), `code` kept."""
    s = " ".join(str(s).split())
    def esc(t: str) -> str:
        t = html.escape(t, quote=False).replace("[", r"\[").replace("]", r"\]")  # "[B] (x)" is no link
        return t if emphasis else t.replace("*", r"\*")

    return _outside_code(s, esc)


def cell(s: Any, **kw) -> str:
    """Like :func:`text`, safe inside a table cell."""
    return _outside_code(text(s, **kw), lambda t: t.replace("|", "&#124;"))


def rel(from_page: str, to_page: str) -> str:
    """Relative link from one docs-relative page path to another (MkDocs resolves .md links)."""
    return os.path.relpath(to_page, os.path.dirname(from_page) or ".").replace(os.sep, "/")


def clause_link(spec, cid: str, from_page: str) -> str:
    if cid not in spec.clauses:
        return f"`{cid}`"
    return f"[{cid}]({rel(from_page, f'spec/{spec.clauses[cid].family}.md')}#{cid})"


def linkify(markdown: str, spec, from_page: str) -> str:
    """Turn every known clause id in ``markdown`` (outside code spans) into a link to its anchor."""
    def link(m: re.Match) -> str:
        return clause_link(spec, m.group(1), from_page) if m.group(1) in spec.clauses else m.group(0)

    return _outside_code(markdown, lambda t: _CLAUSE_RE.sub(link, t))


def linkify_document(markdown: str, spec, from_page: str) -> str:
    """:func:`linkify` for a whole Markdown document: fenced code blocks are left alone."""
    parts = re.split(r"(^(?:```|~~~).*?^(?:```|~~~)[^\n]*$)", markdown, flags=re.M | re.S)
    return "".join(p if i % 2 else linkify(p, spec, from_page) for i, p in enumerate(parts))


def fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt_value(x) for x in v) + "]"
    return str(v)


def indent(block: str, n: int = 4) -> str:
    pad = " " * n
    return "\n".join(pad + ln if ln.strip() else "" for ln in block.splitlines())


# ------------------------------------------------------------------------------- plain text
# TeX control words a reader can read as one character (headings, TOC entries and search previews
# are plain text: MathJax typesets only page bodies).
_TEX_WORDS = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "varepsilon": "ε", "zeta": "ζ",
    "eta": "η", "theta": "θ", "kappa": "κ", "lambda": "λ", "mu": "μ", "nu": "ν", "xi": "ξ", "pi": "π",
    "rho": "ρ", "sigma": "σ", "tau": "τ", "phi": "φ", "varphi": "φ", "chi": "χ", "psi": "ψ", "omega": "ω",
    "Gamma": "Γ", "Delta": "Δ", "Theta": "Θ", "Lambda": "Λ", "Pi": "Π", "Sigma": "Σ", "Phi": "Φ", "Psi": "Ψ",
    "Omega": "Ω", "nabla": "∇", "partial": "∂", "sum": "Σ", "prod": "∏", "infty": "∞", "cdot": "·",
    "times": "×", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠", "approx": "≈",
    "to": "→", "rightarrow": "→", "leftarrow": "←", "Rightarrow": "⇒", "mapsto": "↦", "in": "∈",
    "notin": "∉", "subseteq": "⊆", "cup": "∪", "cap": "∩", "sim": "~", "mid": "|", "pm": "±", "ll": "≪",
    "gg": "≫", "sqrt": "√", "propto": "∝", "equiv": "≡", "ldots": "…", "cdots": "⋯", "dots": "…",
    "lbrace": "{", "rbrace": "}", "{": "{", "}": "}", "%": "%", "_": "_", "&": "&", "|": "‖",
}
_TEX_SPACE = {",", ";", ":", "!", " ", "quad", "qquad"}
_TEX_DROP = {"left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "displaystyle",
             "limits", "nolimits"}
_TEX_ARG = re.compile(r"\\(?:text|mathrm|operatorname|mathcal|mathbf|mathbb|mathit|boldsymbol|bm|mathsf|"
                      r"hat|bar|tilde|overline|widehat|vec)\s*\{([^{}]*)\}")
_TEX_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")


def tex_to_text(tex: str) -> str:
    """A TeX formula as readable Unicode text (``\\frac{a}{b}`` → ``(a)/(b)``, ``\\alpha`` → ``α``)."""
    s = tex
    for _ in range(4):  # nested \frac and \mathrm{..} unwrap from the inside out
        s = _TEX_ARG.sub(r"\1", s)
        s = _TEX_FRAC.sub(lambda m: f"({m.group(1)})/({m.group(2)})", s)

    def word(m: re.Match) -> str:
        w = m.group(1)
        if w in _TEX_SPACE:
            return " "
        if w in _TEX_DROP:
            return ""
        if w in ("log", "exp", "min", "max", "sin", "cos", "tanh", "sech", "arg", "clamp", "sg", "lim"):
            return w + " "
        return _TEX_WORDS.get(w, w)

    s = re.sub(r"\\([A-Za-z]+|.)", word, s)
    s = re.sub(r"([_^])\{([^{}]*)\}", r"\1\2", s)
    s = s.replace("{", "").replace("}", "").replace("~", " ")
    return " ".join(s.split())


_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)


def plain(s: Any) -> str:
    """Markdown/TeX source as plain text: math written out, emphasis markers and HTML tags dropped."""
    s = re.sub(r"</?[A-Za-z][^>]*>", "", str(s))
    s = _MATH_SPAN.sub(lambda m: tex_to_text(next(g for g in m.groups() if g is not None)), s)
    s = re.sub(r"(\*\*|__)(.+?)\1", r"\2", s).replace("**", "")
    return " ".join(s.split())


# ------------------------------------------------------------------------------ source documents
DOCUMENTS_PAGE = "spec/documents.md"
DOCUMENTS_FILE = "assets/documents.yaml"  # under docs/: title, version, date, role, headings in order


def load_documents(docs_dir: Path | None = None) -> dict[str, dict]:
    """seed file name -> its entry in ``docs/assets/documents.yaml`` (empty when the file is absent)."""
    import yaml

    path = Path(docs_dir or REPO / "docs") / DOCUMENTS_FILE
    key = str(path)
    if key not in _DOC_CACHE:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}
        _DOC_CACHE[key] = {d["seed"]: d for d in (raw or {}).get("documents", [])}
    return _DOC_CACHE[key]


_DOC_CACHE: dict[str, dict] = {}


def doc_anchor(seed: str, section: str | None = None) -> str:
    """``doc-004`` for a document, ``doc-004-s7`` for its 8th heading (the headings' order is the file's)."""
    base = f"doc-{seed[:3]}"
    doc = load_documents().get(seed)
    if section is None or doc is None or section not in doc["sections"]:
        return base
    return f"{base}-s{doc['sections'].index(section)}"


def doc_name(seed: str) -> str:
    doc = load_documents().get(seed)
    return doc["short"] if doc else seed


def cite(src: Mapping[str, str], from_page: str) -> str:
    """A source as a link to its section on the Documents page: ``[CCAPO v4.1 § 7.2 …](…#doc-004-s21)``."""
    section = plain(src.get("section", ""))
    label = f"{doc_name(src['seed'])}" + (f" § {section}" if section else "")
    if src["seed"] not in load_documents():
        return f"`{src['seed']}`" + (f" § {text(section)}" if section else "")
    return f"[{text(label)}]({rel(from_page, DOCUMENTS_PAGE)}#{doc_anchor(src['seed'], src.get('section'))})"


def section_order(seed: str, section: str) -> tuple:
    """Sort key putting a document's sections in the document's own order (unknown ones last)."""
    doc = load_documents().get(seed)
    if doc and section in doc["sections"]:
        return (0, doc["sections"].index(section), "")
    return (1, 0, section)


# -------------------------------------------------------------------------- reference functions
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


def first_line(doc: str | None) -> str:
    for ln in inspect.cleandoc(doc or "").splitlines():
        if ln.strip():
            return ln.strip()
    return ""


# ------------------------------------------------------------------------------- spec pages
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
        doc = first_line(getattr(fn, "__doc__", ""))
        if re.search(r"\\[a-zA-Z]+", doc) and "`" not in doc:  # a LaTeX formula: show it verbatim
            doc_md = f"`{doc}`"
        else:
            doc_md = text(doc)
        out.append(f"`{dotted}`: `{signature(fn)}`" + (f"<br>{doc_md}" if doc else ""))
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


def family_page(spec, family: str, tests: dict[str, dict[str, int]], figures: list["Figure"]) -> str:
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
            f"out (its tests are then not applicable), but a SHOULD formula or rule it provides must be right: "
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


CONVENTIONS_PAGE = "spec/conventions.md"


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


def defaults_page(spec) -> str:
    page = "spec/defaults.md"
    out = ["# Defaults", "",
           "Default hyper-parameters are clauses of kind `default`; each maps keys of the family's "
           "`defaults()` operation to values, and `test_defaults.py` checks an implementation's "
           "`defaults()` against them.", ""]
    for fam, f in spec.families.items():
        rows = [c for c in f.clauses if c.kind == "default"]
        if not rows:
            continue
        out += [f"## {fam}", "", "| clause | key | value | level | title |", "|---|---|---|---|---|"]
        for c in rows:
            for k, v in (c.value or {}).items():
                out.append(f"| {clause_link(spec, c.id, page)} | `{k}` | `{fmt_value(v)}` | {c.level} | {cell(c.title)} |")
        out.append("")
    return "\n".join(out)


def gates_page(spec) -> str:
    page = "spec/gates.md"
    out = ["# Go-live gates and SLOs", "",
           "Gate clauses are thresholds on the metrics a trainer writes to `metrics.jsonl` (one JSON object "
           "per update). `rlconform gate RUN/metrics.jsonl` aggregates each metric as the clause says and "
           "compares it with the threshold; any failing gate fails the command; with `--strict` a gate whose metric is missing fails it too.", ""]
    for fam, f in spec.families.items():
        rows = [c for c in f.clauses if c.kind == "gate"]
        if not rows:
            continue
        out += [f"## {fam}", "", "| clause | metric | condition | aggregate | level | statement |",
                "|---|---|---|---|---|---|"]
        for c in rows:
            g = c.gate
            out.append(f"| {clause_link(spec, c.id, page)} | `{g['metric']}` | {html.escape(str(g['op']))} "
                       f"`{fmt_value(g['threshold'])}` | `{g.get('aggregate', 'last')}` | {c.level} | {cell(c.statement)} |")
        out.append("")
    return "\n".join(out)


# ------------------------------------------------------------------------------ contract pages
def contract_families() -> list[str]:
    return [f for f in contract.FAMILIES if contract.available(f)]


def contract_page(family: str) -> str:
    proto = contract.protocol(family)
    mod = sys.modules[proto.__module__]
    out = [f"# {family} contract", "",
           f"The operations an implementation's `impl.{family}` namespace may provide, rendered from "
           f"`{proto.__module__}.{proto.__name__}`. Each is a plain function (no `self`); an operation you "
           "leave out makes its clauses *not applicable*, never failed.", ""]
    if mod.__doc__:
        out += [_doc_block(mod.__doc__), ""]
    names = contract.op_names(family)
    out += ["| operation | summary |", "|---|---|"]
    out += [f"| [`{n}`](#{n}) | {_summary(getattr(proto, n).__doc__)} |" for n in names]
    out.append("")
    for n in names:
        fn = getattr(proto, n)
        out += [f"## `{n}` {{ #{n} }}", "", "```python", f"def {signature(fn, n)}", "```", "",
                _doc_block(fn.__doc__ or ""), ""]
    return "\n".join(out)


def _doc_block(doc: str) -> str:
    """A docstring as Markdown paragraphs (``code`` becomes `code`; *emphasis* is kept)."""
    out = []
    for p in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
        lines = [ln for ln in p.splitlines() if ln.strip()]
        if not lines:
            continue
        if all(ln[:1].isspace() for ln in lines):  # an indented (reST literal) block
            out.append("```python\n" + textwrap.dedent(p.strip("\n")) + "\n```")
        else:
            out.append(text(re.sub(r"::$", ":", p.rstrip()).replace("``", "`"), emphasis=True))
    return "\n\n".join(out)


def _summary(doc: str | None, limit: int = 150) -> str:
    """The docstring's first paragraph, cut at a word boundary."""
    para = " ".join(re.split(r"\n\s*\n", inspect.cleandoc(doc or ""))[0].split()).replace("``", "`")
    if len(para) > limit:
        para = para[:limit].rsplit(" ", 1)[0] + " …"
        if para.count("`") % 2:
            para = para.replace(" …", "` …")
    return cell(para, emphasis=True)


# ------------------------------------------------------------------------------------ figures
@dataclasses.dataclass
class Figure:
    name: str
    family: str
    title: str
    caption: str
    png: bytes | None = None
    note: str = ""

    @property
    def path(self) -> str:
        return f"figures/{self.name}.png"

    def markdown(self, from_page: str) -> list[str]:
        if self.png is None:
            return [f"**{self.title}**: not drawn ({text(self.note)})."]
        # the caption keeps its \\( \\) spans for MathJax; `{: .caption }` styles the paragraph
        return [f"![{self.title}]({rel(from_page, self.path)})", "", f"{self.caption}", "{: .caption }"]


def _ref(family: str, *names: str):
    """Reference operations of a family, or None when the family (or one op) is not there yet."""
    if importlib.util.find_spec(f"reference_impl.{family}") is None:
        return None
    mod = importlib.import_module(f"reference_impl.{family}")
    ops = [getattr(mod, n, None) for n in names]
    return None if any(o is None for o in ops) else ops


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight", metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def figure_sac_top_p(plt, torch) -> bytes | None:
    ops = _ref("sac", "masked_softmax", "top_p_select")
    if ops is None:
        return None
    masked_softmax, top_p_select = ops
    p = 0.9
    logits = torch.tensor([[2.2, -0.4, 1.1, 3.0, 0.3, -1.2, 1.6, 0.8, 2.6, -0.2, 0.5, 1.9]], dtype=torch.float64)
    legal = torch.tensor([[True, True, False, True, True, True, True, False, False, True, True, True]])
    probs = masked_softmax(logits, legal)[0]
    sel = top_p_select(probs[None], legal, p=p)[0]
    order = sorted(range(len(probs)), key=lambda i: (not bool(legal[0, i]), -float(probs[i])))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
    colors = ["#3949ab" if sel[i] else ("#9fa8da" if legal[0, i] else "#bdbdbd") for i in order]
    ax.bar(range(len(order)), [float(probs[i]) for i in order], color=colors)
    ax.set_xticks(range(len(order)), [f"a{i}" for i in order], fontsize=8)
    ax.set_ylabel("π(a|o) (probability)")
    ax.set_xlabel("action, most probable legal first")
    ax.set_title("masked softmax: Top-p set (dark), legal (light), illegal (grey, ε)")
    legal_sorted = [i for i in order if legal[0, i]]
    cum = torch.cumsum(torch.stack([probs[i] for i in legal_sorted]), 0)
    ax2.step(range(1, len(cum) + 1), cum.numpy(), where="mid", color="#3949ab", label="cumulative legal mass")
    ax2.axhline(p, color="#e53935", ls="--", label=f"p = {p}")
    ax2.axvline(int(sel.sum()), color="#757575", ls=":", label=f"|P| = {int(sel.sum())}")
    ax2.set_xlabel("legal actions, most probable first")
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("cumulative probability")
    ax2.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    ax2.set_title("Top-p coverage")
    return _png(fig)


def figure_isr_weights(plt, torch) -> bytes | None:
    ops = _ref("isreshape", "reshape_weight", "sapo_weight")
    if ops is None:
        return None
    reshape_weight, sapo_weight = ops
    r = torch.linspace(0.01, 4.0, 400, dtype=torch.float64)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
    for g in (0.0, 0.25, 0.5, 0.75, 1.0):
        axes[0].plot(r, reshape_weight(r, g, tau=1.0), label=f"γ = {g:g}")
    axes[0].set_title("w_γ(r), τ = 1")
    for tau in (0.5, 1.0, 2.0, 4.0):
        axes[1].plot(r, reshape_weight(r, 0.75, tau=tau), label=f"τ = {tau:g}")
    axes[1].set_title("w_γ(r), γ = 0.75")
    axes[2].plot(r, sapo_weight(r, tau=1.0), label="SAPO r·sech²(τ(r−1)/2), τ = 1", color="#3949ab")
    ppo = ppo_clip_weight(torch, r)
    if ppo is not None:
        axes[2].plot(r, ppo[0], label="PPO-clip, A > 0 (ε = 0.2)", color="#e53935", ls="--")
        axes[2].plot(r, ppo[1], label="PPO-clip, A < 0 (ε = 0.2)", color="#fb8c00", ls=":")
    axes[2].set_title("reference points")
    for ax in axes:
        ax.set_xlabel("importance ratio r = π/μ")
        ax.axvline(1.0, color="#bdbdbd", lw=0.8)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    axes[0].set_ylabel("gradient weight w (per unit advantage)")
    return _png(fig)


def ppo_clip_weight(torch, r):
    """PPO-clip's effective weight: −∂loss/∂log π divided by A (per sample), by autograd on the
    reference ``ppo.clipped_policy_loss``; None when the ppo family is not there."""
    ops = _ref("ppo", "clipped_policy_loss")
    if ops is None:
        return None
    (loss_fn,) = ops
    out = []
    for sign in (1.0, -1.0):
        logp = torch.log(r).clone().requires_grad_(True)
        adv = torch.full_like(r, sign)
        loss = loss_fn(torch.exp(logp), adv, clip_eps=0.2)
        (g,) = torch.autograd.grad(loss.sum() * len(r) if loss.dim() == 0 else loss.sum(), logp)
        out.append((-g / adv).detach())
    return out


def figure_isr_f(plt, torch) -> bytes | None:
    ops = _ref("isreshape", "reshape_f")
    if ops is None:
        return None
    (reshape_f,) = ops
    r = torch.linspace(0.05, 4.0, 400, dtype=torch.float64)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for g in (0.0, 0.25, 0.5, 0.75, 1.0):
        axes[0].plot(r, reshape_f(r, g, tau=1.0), label=f"γ = {g:g}")
    axes[0].set_title("f_γ(r), τ = 1")
    for tau in (0.5, 1.0, 2.0, 4.0):
        axes[1].plot(r, reshape_f(r, 1.0, tau=tau), label=f"τ = {tau:g}")
    axes[1].set_title("f_1(r) = (2/τ)·tanh(τ(r−1)/2)")
    for ax in axes:
        ax.set_xlabel("importance ratio r = π/μ")
        ax.set_ylabel("objective f(r)")
        ax.axhline(0, color="#bdbdbd", lw=0.8)
        ax.axvline(1.0, color="#bdbdbd", lw=0.8)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return _png(fig)


def figure_ccapo_q(plt, torch) -> bytes | None:
    ops = _ref("ccapo", "importance", "criticality", "distance_decay", "q_stdb")
    if ops is None:
        return None
    importance, criticality, distance_decay, q_stdb = ops
    g_succ, g_total = 500.0, 1000.0  # a global success rate of 0.5

    def q(n_succ, n_total, d_goal):
        return q_stdb(importance(n_succ, n_total), criticality(n_succ, n_total, g_succ, g_total),
                      distance_decay(d_goal), lam=1.0)

    n_max = 40
    T, S = torch.meshgrid(torch.arange(1, n_max + 1, dtype=torch.float64),
                          torch.arange(0, n_max + 1, dtype=torch.float64), indexing="xy")
    grid = q(torch.minimum(S, T), T, torch.zeros_like(S))
    grid = torch.where(S <= T, grid, torch.full_like(grid, float("nan")))  # only N_succ <= N_total exists
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    im = ax.imshow(grid.numpy(), origin="lower", aspect="auto", cmap="viridis", vmin=0, vmax=1,
                   extent=(0.5, n_max + 0.5, -0.5, n_max + 0.5))
    fig.colorbar(im, ax=ax, label=r"$Q_{\mathrm{STDB}}(E)$ (score in [0, 1])")
    ax.set_xlabel(r"$N_{\mathrm{total}}(E)$ (visits of the edge)")
    ax.set_ylabel(r"$N_{\mathrm{succ}}(E)$ (visits in successful episodes)")
    ax.set_title(r"$Q_{\mathrm{STDB}}$ over an edge's counts ($d_{\mathrm{goal}} = 0$)")
    n = torch.arange(1, n_max + 1, dtype=torch.float64)
    for share, ls in ((1.0, "-"), (0.5, "--"), (0.0, ":")):
        for d, color in ((0.0, "#3949ab"), (4.0, "#e53935")):
            ax2.plot(n, q(n * share, n, torch.full_like(n, d)), ls=ls, color=color,
                     label=f"N_succ/N_total = {share:g}, d_goal = {d:g}")
    ax2.set_xlabel(r"$N_{\mathrm{total}}(E)$ (visits of the edge)")
    ax2.set_ylabel(r"$Q_{\mathrm{STDB}}(E)$")
    ax2.set_ylim(0, 1)
    ax2.set_title("global success rate 0.5, λ = 1, α = 1")
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return _png(fig)


FIGURES: tuple[tuple[str, str, str, str, Callable], ...] = (
    ("sac-top-p", "sac", "Masked softmax and Top-p coverage",
     r"A 12-action row with three illegal actions: the policy after shifting, filling and \(\varepsilon\)-clipping, "
     r"and the smallest legal set whose mass reaches \(p = 0.9\) (reference `masked_softmax` and `top_p_select`).",
     figure_sac_top_p),
    ("isreshape-w", "isreshape", "IS-Reshape gradient weight w_γ(r)",
     r"\(w_\gamma(r) = (1-\gamma) + \gamma\, r\, \mathrm{sech}^2(\tau(r-1)/2)\) for several \(\gamma\) and "
     r"\(\tau\), beside SAPO's weight and PPO-clip's effective weight (which drops to zero outside the trust region "
     r"on the side the advantage pushes).",
     figure_isr_weights),
    ("isreshape-f", "isreshape", "IS-Reshape objective f_γ(r)",
     r"The closed form \(f_\gamma(r) = (1-\gamma)\log r + \gamma\,\tfrac{2}{\tau}\tanh(\tau(r-1)/2)\), whose "
     r"\(r\,f_\gamma'(r)\) is \(w_\gamma(r)\).", figure_isr_f),
    ("ccapo-q-stdb", "ccapo", "CCAPO edge score Q_STDB",
     r"\(Q_{\mathrm{STDB}} = \sigma(\log(I\,(1+\lambda C)\,D))\) over an edge's success and visit counts, "
     r"with the Bayesian-smoothed \(I(E)\).",
     figure_ccapo_q),
)


def make_figures() -> list[Figure]:
    """Draw every figure whose reference functions exist; the others carry a note saying why not."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    plt.rcParams.update({"font.size": 9, "svg.hashsalt": "rlconform"})
    out = []
    for name, fam, title, caption, draw in FIGURES:
        try:
            png = draw(plt, torch)
        except Exception as e:  # a reference function changed under the figure: say which one
            raise RuntimeError(f"figure {name!r} ({fam}) failed: {type(e).__name__}: {e}") from e
        note = "" if png is not None else f"the reference `{fam}` functions it plots are not available in this build"
        out.append(Figure(name, fam, title, caption, png, note))
    return out


def figures_page(figures: list[Figure]) -> str:
    out = ["# Figures", "", "Drawn at build time with matplotlib by calling the reference implementation's own "
           "functions, so a figure always shows what the code computes.", ""]
    for fg in figures:
        out += [f"## {fg.title}", ""] + fg.markdown("figures.md") + [""]
    return "\n".join(out)


# -------------------------------------------------------------------------------- audit pages
_AUDIT_CACHE: dict[str, Any] = {}


def reference_report() -> tuple[dict | None, str]:
    """The reference audit: the report named by $RLCONFORM_AUDIT_REPORT, else a fresh in-process run."""
    src = os.environ.get(AUDIT_ENV, "")
    if src.lower() == "skip":
        return None, f"the reference audit was not run for this build (${AUDIT_ENV}=skip)"
    if src:
        return json.loads(Path(src).read_text(encoding="utf-8")), f"rendered from `{Path(src).name}`"
    if "report" not in _AUDIT_CACHE:
        _AUDIT_CACHE["report"] = clause_report(run_suite())
    return _AUDIT_CACHE["report"], "run at build time (`run_suite()`, profile `ci`)"


def checklist_markdown(report: dict, spec, page: str) -> str:
    """render_checklist's Markdown, one heading level down, clause ids linked to their anchors."""
    md = render_checklist(report, spec)
    md = re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", md, flags=re.M)
    md = md.split("\n", 1)[1] if md.startswith("## rlconform audit") else md
    return linkify(md, spec, page)


def reference_audit_page(spec) -> str:
    page = "conformance/reference.md"
    report, how = reference_report()
    out = ["# Reference implementation", "", reference_stamp(report), "",
           "The bundled torch reference (`reference_impl:make`) audited by the suite, clause by clause. "
           f"This report was {how}. Reproduce it with `rlconform audit --out audit/`.", ""]
    if report is None:
        return "\n".join(out)
    return "\n".join(out) + "\n" + checklist_markdown(report, spec, page)


def reference_stamp(report: dict | None) -> str:
    """Provenance of the reference page: this build's commit and versions, and when the audit finished."""
    info = (report or {}).get("run_info", {})
    facts = stamp("python -m rlconform.site build" + (f" --report {Path(os.environ[AUDIT_ENV]).name}"
                                                      if os.environ.get(AUDIT_ENV, "skip") != "skip" else ""),
                  packages=("mkdocs", "mkdocs-material"))
    md = render_markdown(facts)
    if info:
        md += (f"\n    Audit: `{info.get('implementation', '?')}`, rlconform commit "
               f"`{info.get('rlconform_commit') or 'unknown'}`, finished {info.get('finished', '?')}.\n")
    return md


def third_party_audits(docs_dir: Path) -> list[Path]:
    root = docs_dir / "audits"
    # An audit is a folder with its report, checklist or README; folders starting with "_" hold working
    # notes (e.g. _research) and audits/findings holds the matrix's finding pages, neither is an audit.
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")
                  and p.name != Path(FINDINGS_DIR).name
                  and any((p / f).is_file() for f in ("report.json", "checklist.md", "README.md")))


def third_party_audit_page(spec, adir: Path) -> str:
    page = f"audits/{adir.name}/index.md"
    readme, checklist, rj = adir / "README.md", adir / "checklist.md", adir / "report.json"
    out = []
    if readme.exists():
        out += [linkify_document(readme.read_text(encoding="utf-8").strip(), spec, page), ""]
    else:
        out += [f"# Audit: {adir.name}", ""]
    rendered = None
    if rj.exists():
        report = json.loads(rj.read_text(encoding="utf-8"))
        try:
            rendered = checklist_markdown(report, audited_spec(spec, report), page)
        except KeyError as e:  # a report written by an older rlconform: show the checklist written with it
            if not checklist.exists():
                raise
            out += ['!!! warning "Older report format"', "",
                    indent(f"`report.json` lacks the field `{e.args[0]}` this rlconform's renderer expects; the "
                           "checklist below is the one written with the report. Re-run the audit command above "
                           "to refresh both."), ""]
    if rendered is not None:
        out += ["## Checklist", "", "Rendered from [report.json](report.json).", "", rendered]
    elif checklist.exists():
        out += ["## Checklist", "", linkify_document(checklist.read_text(encoding="utf-8"), spec, page)]
    return "\n".join(out) + "\n"


def audited_spec(spec, report: dict):
    """The spec cut to the families the report says were audited (its header then names only those)."""
    fams = report.get("run_info", {}).get("families") or []
    if not fams or set(fams) >= set(spec.families) or not dataclasses.is_dataclass(spec):
        return spec
    return dataclasses.replace(spec, families={f: v for f, v in spec.families.items() if f in fams})


def conformance_index(audits: list[Path]) -> str:
    out = ["# Conformance", "", "Audits run with `rlconform audit`: the clause-by-clause verdict and the "
           "grey-release checklist.", "", "- [Reference implementation](reference.md)"]
    out += [f"- [{a.name}](../audits/{a.name}/index.md)" for a in audits]
    return "\n".join(out) + "\n"


def results_pages(docs_dir: Path) -> list[str]:
    root = docs_dir / "results"
    # a family's results, and those of its trainers on real environments (results/isreshape/lm/...)
    pages = [*root.glob("*/results.md"), *root.glob("*/*/results.md")] if root.is_dir() else []
    return sorted(str(p.relative_to(docs_dir)).replace(os.sep, "/") for p in pages)


# -------------------------------------------------------------------------------- generated markers
def families_table(spec) -> str:
    rows = ["| family | document | version | clauses |", "|---|---|---|---|"]
    for fam, f in spec.families.items():
        rows.append(f"| [{fam}](spec/{fam}.md) | {cell(f.document['title'])} | {cell(f.version)} | {len(f.clauses)} |")
    return "\n".join(rows)


def cli_help() -> str:
    """`rlconform --help` and every subcommand's help, as written by argparse."""
    parser = build_parser()
    blocks = []

    def walk(p: argparse.ArgumentParser) -> None:
        p.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=96)
        blocks.append((p.prog, p.format_help()))
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in dict.fromkeys(action.choices.values()):
                    walk(sub)

    walk(parser)
    return "\n".join(f"### `{prog}`\n\n```text\n{help_.rstrip()}\n```\n" for prog, help_ in blocks)


MARKERS: dict[str, Callable[[Any], str]] = {
    "<!-- rlconform:families -->": families_table,
    "<!-- rlconform:cli-help -->": lambda spec: cli_help(),
    "<!-- rlconform:site-map -->": lambda spec: site_map(spec),
}


# ------------------------------------------------------------------------------------- MathJax
def mathjax_dir() -> Path:
    """MathJax 3's es5 directory: $RLCONFORM_MATHJAX_DIR, else the django-static-mathjax package's copy."""
    env = os.environ.get(MATHJAX_ENV)
    candidates = [Path(env)] if env else []
    spec = importlib.util.find_spec("mathjax")
    if spec and spec.origin:
        candidates.append(Path(spec.origin).parent / "static" / "mathjax" / "es5")
    for c in candidates:
        if (c / "tex-chtml.js").is_file():
            return c
    raise RuntimeError(
        "MathJax 3 not found: `pip install django-static-mathjax` (it ships MathJax's es5 build; "
        f"it is in rlconform's `docs` extra), or point ${MATHJAX_ENV} at an es5 directory "
        "(e.g. from `npm pack mathjax@3`).")


def mathjax_files(root: Path) -> Iterable[tuple[str, Path]]:
    for part in MATHJAX_PARTS:
        p = root / part
        paths = [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file())
        for q in paths:
            yield "assets/mathjax/" + str(q.relative_to(root)).replace(os.sep, "/"), q


# ------------------------------------------------------------------------------------ CJK font
# The seeds' titles and headings are Chinese; a reader's machine may have no CJK font, so the site ships
# one: a subset of Noto Sans CJK SC (Debian's fonts-noto-cjk) holding exactly the characters the built
# pages use, made after the build with fontTools (woff2 when brotli is installed, else woff).
CJK_FONT_ENV = "RLCONFORM_CJK_FONT"
CJK_FONT_FILES = ("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
                  "/usr/share/fonts/opentype/noto/NotoSansCJK-Medium.ttc")
CJK_FACE = "Noto Sans CJK SC"
CJK_FAMILY = "rlconform CJK"
CJK_DIR = "assets/fonts"
# Han, kana, CJK punctuation and full-width forms: the font is used for these code points only, so Latin
# text keeps the theme's fonts.
CJK_SPANS = ((0x2E80, 0x2FDF), (0x3000, 0x30FF), (0x3100, 0x312F), (0x31C0, 0x31FF), (0x3200, 0x33FF),
             (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0xFE30, 0xFE4F), (0xFF00, 0xFFEF))


def is_cjk(ch: str) -> bool:
    o = ord(ch)
    return any(lo <= o <= hi for lo, hi in CJK_SPANS)


def cjk_font_format() -> str:
    return "woff2" if importlib.util.find_spec("brotli") or importlib.util.find_spec("brotlicffi") else "woff"


def cjk_font_file() -> str:
    return f"{CJK_DIR}/rlconform-cjk.{cjk_font_format()}"


def cjk_css() -> str:
    fmt = cjk_font_format()
    ranges = ", ".join(f"U+{lo:04X}-{hi:04X}" for lo, hi in CJK_SPANS)
    return (f"/* Generated by tools/rlconform/site.py: a subset of {CJK_FACE} with the site's characters. */\n"
            f"@font-face {{\n  font-family: \"{CJK_FAMILY}\";\n"
            f"  src: url(\"rlconform-cjk.{fmt}\") format(\"{fmt}\");\n"
            f"  unicode-range: {ranges};\n  font-display: swap;\n}}\n"
            f":root {{ --md-text-font: \"{CJK_FAMILY}\"; --md-code-font: \"{CJK_FAMILY}\"; }}\n")


def cjk_source() -> tuple[Path, int]:
    """The font file and collection index of the face to subset: $RLCONFORM_CJK_FONT or Debian's Noto."""
    from fontTools.ttLib import TTCollection

    env = os.environ.get(CJK_FONT_ENV)
    for cand in ([env] if env else []) + list(CJK_FONT_FILES):
        path = Path(cand)
        if not path.is_file():
            continue
        if path.suffix.lower() not in (".ttc", ".otc"):
            return path, -1
        names = [f["name"].getDebugName(1) for f in TTCollection(str(path), lazy=True).fonts]
        return path, names.index(CJK_FACE) if CJK_FACE in names else 0
    raise RuntimeError(
        "no CJK font to subset for the site: apt-get install fonts-noto-cjk (Noto Sans CJK), or point "
        f"${CJK_FONT_ENV} at an OpenType/TrueType font with Chinese glyphs")


def site_characters(site_dir: Path) -> set[str]:
    """Every CJK character in the built pages and the search index."""
    chars: set[str] = set()
    for path in [*site_dir.rglob("*.html"), site_dir / "search" / "search_index.json"]:
        if path.is_file():
            chars.update(ch for ch in set(path.read_text(encoding="utf-8", errors="ignore")) if is_cjk(ch))
    return chars


def write_cjk_font(site_dir: Path) -> tuple[Path, int]:
    """Subset the CJK face to the site's characters into site_dir/assets/fonts; (path, glyph count)."""
    from fontTools import subset
    from fontTools.ttLib import TTFont

    src, index = cjk_source()
    chars = site_characters(site_dir)
    font = TTFont(str(src), fontNumber=index) if index >= 0 else TTFont(str(src))
    opts = subset.Options()
    opts.flavor = cjk_font_format()
    opts.hinting = False  # hints matter little at screen sizes and double the file
    opts.desubroutinize = True
    opts.layout_features = ["vert", "vrt2", "locl", "kern", "palt"]
    sub = subset.Subsetter(opts)
    sub.populate(unicodes=sorted(ord(c) for c in chars) or [0x3000])
    sub.subset(font)
    out = site_dir / cjk_font_file()
    out.parent.mkdir(parents=True, exist_ok=True)
    font.flavor = opts.flavor
    font.save(str(out))
    return out, len(chars)


# ------------------------------------------------------------------------------------ search
def clean_search_index(site_dir: Path) -> int:
    """Search previews as plain text: TeX written out in Unicode; returns the number of entries changed."""
    path = site_dir / "search" / "search_index.json"
    if not path.is_file():
        return 0
    index = json.loads(path.read_text(encoding="utf-8"))
    changed = 0
    for entry in index.get("docs", []):
        for key in ("title", "text"):
            old = entry.get(key, "")
            new = _MATH_SPAN.sub(lambda m: tex_to_text(next(g for g in m.groups() if g is not None)), old)
            if new != old:
                entry[key] = new
                changed += 1
    path.write_text(json.dumps(index, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    return changed


# ----------------------------------------------------------------------------------- the hooks
def _nav_sections(docs_dir: Path) -> dict[str, list]:
    spec = load_spec()
    audits = third_party_audits(docs_dir)
    spec_nav = [{"Overview": "spec/index.md"}] + [{f: f"spec/{f}.md"} for f in spec.families] + [
        {"Errata": "spec/errata.md"}, {"Defaults": "spec/defaults.md"}, {"Gates and SLOs": "spec/gates.md"},
        {"Conventions": CONVENTIONS_PAGE}, {"Source documents": DOCUMENTS_PAGE}, {"Traceability": "spec/traceability.md"}]
    conf_nav = [{"Overview": "conformance/index.md"}, {"Reference implementation": "conformance/reference.md"}]
    # Bare paths: MkDocs titles these pages with their own first heading.
    conf_nav += [f"audits/{a.name}/index.md" for a in audits]
    if (docs_dir / MATRIX_PAGE).is_file():
        conf_nav.insert(1, {"Audit matrix": MATRIX_PAGE})
    results_nav = results_pages(docs_dir)
    return {
        "Specification": spec_nav,
        "Contract": [{f: f"contract/{f}.md"} for f in contract_families()],
        "Conformance": conf_nav,
        "Results": results_nav,
        "Performance": section_pages(docs_dir, "performance"),
        "Mutation testing": section_pages(docs_dir, "mutation"),
    }


MATRIX_PAGE = "audits/matrix.md"
FINDINGS_DIR = "audits/findings"


def section_pages(docs_dir: Path, folder: str) -> list[str]:
    """The Markdown pages others generate under docs/<folder>/ (index first); empty when it is absent."""
    root = docs_dir / folder
    pages = sorted(p for p in root.rglob("*.md") if not p.name.startswith("_")) if root.is_dir() else []
    pages.sort(key=lambda p: (p.name != "index.md", str(p)))
    return [str(p.relative_to(docs_dir)).replace(os.sep, "/") for p in pages]


def page_title(path: Path) -> str:
    """A Markdown page's first level-1 heading, as plain text (its file name when it has none)."""
    if path.is_file():
        m = re.search(r"^# (.+)$", path.read_text(encoding="utf-8"), flags=re.M)
        if m:
            return plain(re.sub(r"\s*\{[^}]*\}\s*$", "", m.group(1)))
    return path.stem


def site_map(spec) -> str:
    """The home page's list of every page the build generates or collects, each linked (only those present)."""
    docs_dir = Path(_STATE.get("docs_dir") or REPO / "docs")
    spec_links = [("Overview", "spec/index.md")] + [(f"{f}: {plain(spec.families[f].name)}", f"spec/{f}.md")
                                                    for f in spec.families]
    spec_links += [("Errata", "spec/errata.md"), ("Defaults", "spec/defaults.md"), ("Gates and SLOs", "spec/gates.md"),
                   ("Conventions", CONVENTIONS_PAGE), ("Source documents", DOCUMENTS_PAGE),
                   ("Traceability: seed items to clauses", "spec/traceability.md")]
    groups = [("Specification", spec_links),
              ("Contract", [(f"{f} operations", f"contract/{f}.md") for f in contract_families()]),
              ("Figures", [("Figures drawn from the reference", "figures.md")])]
    conf = [("Overview", "conformance/index.md"), ("Reference implementation", "conformance/reference.md")]
    if (docs_dir / MATRIX_PAGE).is_file():
        conf.append(("Audit matrix", MATRIX_PAGE))
    conf += [(f"Audit: {a.name}", f"audits/{a.name}/index.md") for a in third_party_audits(docs_dir)]
    findings = sorted((docs_dir / FINDINGS_DIR).glob("*.md")) if (docs_dir / FINDINGS_DIR).is_dir() else []
    conf += [(f"Finding: {page_title(f)}", f"{FINDINGS_DIR}/{f.name}") for f in findings]
    groups.append(("Conformance", conf))
    for title, folder in (("Performance", "performance"), ("Mutation testing", "mutation")):
        groups.append((title, [(page_title(docs_dir / p), p) for p in section_pages(docs_dir, folder)]))
    groups.append(("Results", [(page_title(docs_dir / p), p) for p in results_pages(docs_dir)]))
    guide = sorted((docs_dir / "guide").glob("*.md")) if (docs_dir / "guide").is_dir() else []
    groups.append(("Guides", [(page_title(g), f"guide/{g.name}") for g in guide]))
    known = _STATE.get("uris")  # the pages MkDocs collected: a file written since then is not linked
    out = []
    for title, links in groups:
        links = [(t, u) for t, u in links if known is None or u in known]
        if links:
            out += [f"- **{title}:** " + " · ".join(f"[{text(t)}]({u})" for t, u in links)]
    return "\n".join(out)


_STATE: dict[str, Any] = {}


# Guide pages that exist only once their feature has landed.
GUIDE_EXTRA = (("STDB on PostgreSQL", "stdb-postgresql.md"), ("Scaling out", "scaling-out.md"),
               ("Contributing: the layers", "contributing.md"))


def on_config(config, **kwargs):
    """Fill the nav sections left empty in mkdocs.yml from what exists at build time."""
    docs_dir = Path(config["docs_dir"])
    _STATE["docs_dir"] = str(docs_dir)
    cjk_source()  # fail before the build, not after it, when no CJK font can be subset
    sections = _nav_sections(docs_dir)
    nav = []
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and len(entry) == 1:
            (title, value), = entry.items()
            if title in sections and not value:
                if sections[title]:
                    nav.append({title: sections[title]})
                continue
            if title == "Guide":
                extra = [{t: f"guide/{f}"} for t, f in GUIDE_EXTRA if (docs_dir / "guide" / f).exists()]
                entry = {title: list(value) + extra}
        nav.append(entry)
    config["nav"] = nav
    return config


def generated_pages(docs_dir: Path) -> tuple[dict[str, str | bytes], list[str]]:
    """Every generated file (docs-relative path -> content) and the source pages they replace."""
    spec = load_spec()
    marks = collect_tests()[0]
    tests = tests_by_clause(marks)
    figures = make_figures()
    pages: dict[str, str | bytes] = {
        "spec/index.md": spec_index_page(spec),
        "spec/errata.md": errata_page(spec),
        "spec/defaults.md": defaults_page(spec),
        "spec/gates.md": gates_page(spec),
        "spec/traceability.md": traceability_page(spec),
        DOCUMENTS_PAGE: documents_page(spec),
        CONVENTIONS_PAGE: conventions_page(spec),
        "figures.md": figures_page(figures),
        "conformance/reference.md": reference_audit_page(spec),
    }
    for fam in spec.families:
        pages[f"spec/{fam}.md"] = family_page(spec, fam, tests, figures)
    for fam in contract_families():
        pages[f"contract/{fam}.md"] = contract_page(fam)
    for fg in figures:
        if fg.png is not None:
            pages[fg.path] = fg.png
    audits = third_party_audits(docs_dir)
    replaced = []
    for a in audits:
        pages[f"audits/{a.name}/index.md"] = third_party_audit_page(spec, a)
        replaced.append(f"audits/{a.name}/README.md")
    pages["conformance/index.md"] = conformance_index(audits)
    return pages, replaced


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    docs_dir = Path(config["docs_dir"])
    pages, replaced = generated_pages(docs_dir)
    for uri in replaced:
        f = files.get_file_from_path(uri)
        if f is not None:
            files.remove(f)
    for uri, content in pages.items():
        old = files.get_file_from_path(uri)
        if old is not None:  # a committed copy of a generated page would be written twice: ours wins
            files.remove(old)
        files.append(File.generated(config, uri, content=content))
    for uri, path in mathjax_files(mathjax_dir()):
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    files.append(File.generated(config, f"{CJK_DIR}/cjk.css", content=cjk_css()))
    _STATE["uris"] = {f.src_uri for f in files}
    return files


def on_post_build(config, **kwargs):
    """After every page is written: the search previews made plain, then the CJK font subset to them."""
    site_dir = Path(config["site_dir"])
    clean_search_index(site_dir)
    write_cjk_font(site_dir)


_SEED_FILE = re.compile(r"`?\b(\d{3}_[0-9a-f]{16}\.txt)\b`?")


def _plain_fragment(t: str) -> str:
    t = _MATH_SPAN.sub(lambda m: tex_to_text(next(g for g in m.groups() if g is not None)), t)
    return re.sub(r"(\*\*|__)(.+?)\1", r"\2", t)


def plain_headings(markdown: str) -> str:
    """Headings (and so the TOC) as plain text on every page: math written out, no emphasis markers."""
    parts = re.split(r"(^(?:```|~~~).*?^(?:```|~~~)[^\n]*$)", markdown, flags=re.M | re.S)

    def fix(block: str) -> str:
        return re.sub(r"^(#{1,6}[ \t]+)(.+)$", lambda m: m.group(1) + _outside_code(m.group(2), _plain_fragment),
                      block, flags=re.M)

    return "".join(p if i % 2 else fix(p) for i, p in enumerate(parts))


def link_seed_files(markdown: str, from_page: str) -> str:
    """Any seed file name (``004_7fb0ad4f8a70eeae.txt``) outside code becomes its document's name, linked."""
    def sub(m: re.Match) -> str:
        seed = m.group(1)
        if seed not in load_documents():
            return m.group(0)
        return f"[{text(doc_name(seed))}]({rel(from_page, DOCUMENTS_PAGE)}#{doc_anchor(seed)})"

    parts = re.split(r"(^(?:```|~~~).*?^(?:```|~~~)[^\n]*$)", markdown, flags=re.M | re.S)
    return "".join(p if i % 2 else _SEED_FILE.sub(sub, p) for i, p in enumerate(parts))


# ---------------------------------------------------------------------------------- provenance
STAMP_FILE = "provenance.json"  # rlconform.provenance.stamp(), written beside a generated page
STAMPED_DIRS = ("results/", "audits/", "performance/", "mutation/")
# The command that regenerates a page whose directory holds no stamp yet (the page then says so).
REGENERATE = {
    "results/ppo/": "python tools/ppo_learning_curves.py --seeds 0,1,2",
    "results/isreshape/lm": "rlconform study isreshape-lm --out DIR --publish docs/results/isreshape/lm... (see the page)",
    "results/isreshape/": "python docs/results/isreshape/plot_curves.py --train --seeds 0,1,2",
    "results/ccapo/textworld/": "python -m reference_impl.ccapo.textworld.plot RUNS --out docs/results/ccapo/textworld",
    "results/ccapo/": "python docs/results/ccapo/plot_curves.py --train --seeds 0,1,2",
    "results/sac/": "python docs/results/sac/build.py SUITE CEILING.jsonl REEVAL.jsonl SUPERVISED.jsonl EXTRA "
                    "(see the page)",
}
MAX_DATA_LINKS = 12


def stamped_page(src_uri: str) -> bool:
    return src_uri.startswith(STAMPED_DIRS) and src_uri.endswith(".md") and "/_" not in "/" + src_uri


def data_files(docs_dir: Path, src_uri: str) -> list[str]:
    """Raw data beside a page (JSONL, JSON reports, CSV), as links relative to the page's source."""
    here = (docs_dir / src_uri).parent
    found = sorted(p for ext in ("jsonl", "csv") for p in here.rglob(f"*.{ext}"))
    found += [p for p in (here / "report.json", here / "matrix.json") if p.is_file()]
    return [str(p.relative_to(here)).replace(os.sep, "/") for p in found]


def provenance_markdown(docs_dir: Path, src_uri: str, markdown: str) -> str | None:
    """The provenance admonition for a stamped page (None when the page already carries one)."""
    if 'info "Provenance"' in markdown:
        return None
    here = (docs_dir / src_uri).parent
    files = data_files(docs_dir, src_uri)
    shown = files[:MAX_DATA_LINKS]
    stamp_path = here / STAMP_FILE
    if stamp_path.is_file():
        facts = json.loads(stamp_path.read_text(encoding="utf-8"))
        md = render_markdown(facts, data_files=shown)
        if facts.get("regenerate"):  # the command that re-runs the experiments, not only the plotting
            md += f"\n    Regenerate from scratch: `{facts['regenerate']}`\n"
        if len(files) > len(shown):
            md += f"    (and {len(files) - len(shown)} more data files in this directory)\n"
        return md
    cmd = next((c for d, c in REGENERATE.items() if src_uri.startswith(d)), None)
    lines = ['!!! warning "Provenance"',
             f"    No `{STAMP_FILE}` stamp lies beside this page, so its run date, commit and package versions "
             "are not recorded. " + (f"Regenerate it with `{cmd}`." if cmd else
                                     "The command that generated it is not recorded either.")]
    if shown:
        lines += ["", "    Raw data: " + ", ".join(f"[{f}]({f})" for f in shown)]
    return "\n".join(lines) + "\n"


def insert_after_title(markdown: str, block: str) -> str:
    """``block`` right under the page's first level-1 heading (at the top when it has none)."""
    m = re.search(r"^# .*$", markdown, flags=re.M)
    if m is None:
        return block + "\n" + markdown
    return markdown[:m.end()] + "\n\n" + block + "\n" + markdown[m.end():]


def on_page_markdown(markdown, page, config, files, **kwargs):
    src = page.file.src_uri
    if "<!-- rlconform:" in markdown:
        spec = load_spec()
        for marker, render in MARKERS.items():
            if marker in markdown:
                markdown = markdown.replace(marker, render(spec))
    markdown = plain_headings(markdown)
    if src != DOCUMENTS_PAGE:
        markdown = link_seed_files(markdown, src)
    if stamped_page(src):
        block = provenance_markdown(Path(config["docs_dir"]), src, markdown)
        if block:
            markdown = insert_after_title(markdown, block)
    return markdown


# ---------------------------------------------------------------------------------------- CLI
def build(site_dir: str | None = None, *, report: str | None = None, serve: bool = False,
          strict: bool = True) -> int:
    """Run ``mkdocs build`` (or ``serve``) on the repository's mkdocs.yml in a child process."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    if report:
        env[AUDIT_ENV] = str(Path(report).resolve())
    cmd = [sys.executable, "-m", "mkdocs", "serve" if serve else "build", "-f", str(REPO / "mkdocs.yml")]
    if strict:
        cmd.append("--strict")
    if site_dir and not serve:
        cmd += ["--site-dir", str(Path(site_dir).resolve())]
    return subprocess.call(cmd, cwd=REPO, env=env)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlconform.site", description="Build the rlconform docs site.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="generate the pages and run mkdocs build --strict")
    b.add_argument("--site-dir", default=None, help="output directory (default: site/)")
    b.add_argument("--report", default=None, help=f"render this report.json instead of auditing the reference (sets ${AUDIT_ENV})")
    b.add_argument("--serve", action="store_true", help="serve with live reload instead of building")
    args = p.parse_args(argv)
    return build(args.site_dir, report=args.report, serve=args.serve)


if __name__ == "__main__":
    sys.exit(main())
