"""Every page and figure the build generates, in one call (what the ``on_files`` hook adds)."""
from __future__ import annotations

from pathlib import Path

from rlconform.coverage import collect_tests
from rlconform.spec import load_spec
from rlconform.traceability import traceability_page

from tools.site.audit_pages import conformance_index, reference_audit_page, third_party_audit_page, third_party_audits
from tools.site.contract_pages import contract_families, contract_page
from tools.site.documents import DOCUMENTS_PAGE
from tools.site.figures import figures_page, make_figures
from tools.site.spec_pages import (
    CONVENTIONS_PAGE,
    conventions_page,
    defaults_page,
    documents_page,
    errata_page,
    family_page,
    gates_page,
    spec_index_page,
    tests_by_clause,
)


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
