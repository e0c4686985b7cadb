"""The navigation and the home page's site map: the sections mkdocs.yml leaves empty, filled from what exists
at build time (families, contract Protocols, audits, results, pages others generate)."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from rlconform.spec import load_spec

from tools.site.audit_pages import FINDINGS_DIR, MATRIX_PAGE, third_party_audits
from tools.site.contract_pages import contract_families
from tools.site.documents import DOCUMENTS_PAGE
from tools.site.env import REPO
from tools.site.markup import plain, text
from tools.site.spec_pages import CONVENTIONS_PAGE

# What the hooks learnt of this build: the docs directory (on_config) and the pages MkDocs collected (on_files).
_STATE: dict[str, Any] = {}


# Guide pages that exist only once their feature has landed.
GUIDE_EXTRA = (("STDB on PostgreSQL", "stdb-postgresql.md"), ("Scaling out", "scaling-out.md"),
               ("Contributing: the layers", "contributing.md"))


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


def results_pages(docs_dir: Path) -> list[str]:
    root = docs_dir / "results"
    # a family's results, and those of its trainers on real environments (results/isreshape/lm/...)
    pages = [*root.glob("*/results.md"), *root.glob("*/*/results.md")] if root.is_dir() else []
    return sorted(str(p.relative_to(docs_dir)).replace(os.sep, "/") for p in pages)


def fill_nav(nav: list | None, docs_dir: Path) -> list:
    """mkdocs.yml's nav with its empty sections filled from what exists at build time (an empty one dropped)
    and the Guide extended by the pages in :data:`GUIDE_EXTRA` that exist."""
    _STATE["docs_dir"] = str(docs_dir)
    sections = _nav_sections(docs_dir)
    out = []
    for entry in nav or []:
        if isinstance(entry, dict) and len(entry) == 1:
            (title, value), = entry.items()
            if title in sections and not value:
                if sections[title]:
                    out.append({title: sections[title]})
                continue
            if title == "Guide":
                extra = [{t: f"guide/{f}"} for t, f in GUIDE_EXTRA if (docs_dir / "guide" / f).exists()]
                entry = {title: list(value) + extra}
        out.append(entry)
    return out


def record_pages(uris: set[str]) -> None:
    """The pages MkDocs collected: the site map links only these."""
    _STATE["uris"] = set(uris)
