"""The documentation site, generated from the spec at build time (checkout only: it reads ``docs/``, and is
not part of the ``rlconform`` wheel).

``tools/site/hooks.py`` is the MkDocs hook named in ``mkdocs.yml``; the rest is split by concern:

- ``markup``: Markdown escaping, links, clause ids as links, TeX as plain text;
- ``documents``: the source documents (``docs/assets/documents.yaml``), citations, seed file links;
- ``introspect``: reference functions by dotted path, signatures, docstrings;
- ``spec_pages``: ``spec/<family>.md`` (every clause, anchored by its id), the index, errata, defaults,
  gates, conventions and documents pages;
- ``contract_pages``: ``contract/<family>.md`` (the Protocols);
- ``figures``: ``figures.md`` and the figures drawn from the reference;
- ``audit_pages``: ``conformance/reference.md`` (an audit of the bundled reference), ``audits/<name>/index.md``
  for each third-party audit under ``docs/audits/``, ``conformance/index.md``;
- ``provenance``: the provenance blocks of stamped pages (the stamp itself is ``rlconform.provenance``'s);
- ``nav``: the navigation and the home page's site map; ``markers``: the ``<!-- rlconform:... -->`` markers;
- ``pages``: every generated file at once; ``mathjax``, ``fonts`` (the CJK subset), ``search``: site assets;
- ``build``: the command line, ``python -m tools.site build [--site-dir DIR] [--report report.json] [--serve]``.

Nothing generated is committed: the spec is written once.

Environment: ``RLCONFORM_AUDIT_REPORT`` names a report.json to render instead of running the suite
(``skip`` leaves the reference audit out); ``RLCONFORM_MATHJAX_DIR`` names a MathJax 3 ``es5``
directory to use instead of the one shipped by the ``django-static-mathjax`` package;
``RLCONFORM_CJK_FONT`` names the CJK font to subset.
"""
from __future__ import annotations

from tools.site.audit_pages import (
    FINDINGS_DIR,
    MATRIX_PAGE,
    audited_spec,
    checklist_markdown,
    conformance_index,
    reference_audit_page,
    reference_report,
    third_party_audit_page,
    third_party_audits,
)
from tools.site.build import main
from tools.site.contract_pages import contract_families, contract_page
from tools.site.documents import (
    DOCUMENTS_FILE,
    DOCUMENTS_PAGE,
    cite,
    doc_anchor,
    doc_name,
    link_seed_files,
    load_documents,
    section_order,
)
from tools.site.env import AUDIT_ENV, REPO
from tools.site.figures import FIGURES, Figure, figures_page, make_figures
from tools.site.fonts import (
    CJK_DIR,
    CJK_FACE,
    CJK_FONT_ENV,
    CJK_SPANS,
    cjk_css,
    cjk_font_file,
    cjk_font_format,
    cjk_source,
    is_cjk,
    site_characters,
    write_cjk_font,
)
from tools.site.introspect import resolve_dotted, signature, summary
from tools.site.markers import MARKERS, cli_help, families_table, fill_markers
from tools.site.markup import (
    cell,
    clause_link,
    fmt_value,
    indent,
    linkify,
    linkify_document,
    math_to_text,
    outside_fences,
    plain,
    plain_headings,
    rel,
    tex_to_text,
    text,
)
from tools.site.mathjax import MATHJAX_ENV, MATHJAX_PARTS, mathjax_dir, mathjax_files
from tools.site.nav import GUIDE_EXTRA, fill_nav, page_title, record_pages, results_pages, section_pages, site_map
from tools.site.pages import generated_pages
from tools.site.provenance import (
    REGENERATE,
    ProvenanceError,
    STAMP_FILE,
    STAMPED_DIRS,
    data_files,
    insert_after_title,
    provenance_markdown,
    reference_stamp,
    stamped_page,
)
from tools.site.search import clean_search_index
from tools.site.spec_pages import (
    CONVENTIONS_PAGE,
    clause_block,
    conventions_page,
    defaults_page,
    documents_page,
    errata_page,
    family_page,
    gates_page,
    spec_index_page,
    tests_by_clause,
)

__all__ = [
    "AUDIT_ENV", "CJK_DIR", "CJK_FACE", "CJK_FONT_ENV", "CJK_SPANS", "CONVENTIONS_PAGE", "DOCUMENTS_FILE",
    "DOCUMENTS_PAGE", "FIGURES", "FINDINGS_DIR", "GUIDE_EXTRA", "MARKERS", "MATHJAX_ENV", "MATHJAX_PARTS",
    "MATRIX_PAGE", "ProvenanceError", "REGENERATE", "REPO", "STAMPED_DIRS", "STAMP_FILE", "Figure", "audited_spec", "cell",
    "checklist_markdown", "cite", "cjk_css", "cjk_font_file", "cjk_font_format", "cjk_source", "clause_block",
    "clause_link", "clean_search_index", "cli_help", "conformance_index", "contract_families", "contract_page",
    "conventions_page", "data_files", "defaults_page", "doc_anchor", "doc_name", "documents_page", "errata_page",
    "families_table", "family_page", "figures_page", "fill_markers", "fill_nav", "fmt_value",
    "gates_page", "generated_pages", "indent", "insert_after_title", "is_cjk", "link_seed_files", "linkify",
    "linkify_document", "load_documents", "main", "make_figures", "math_to_text", "mathjax_dir", "mathjax_files",
    "outside_fences", "page_title", "plain", "plain_headings", "provenance_markdown", "record_pages",
    "reference_audit_page", "reference_report", "reference_stamp", "rel", "resolve_dotted", "results_pages",
    "section_order", "section_pages", "signature", "site_characters", "site_map", "spec_index_page",
    "stamped_page", "summary", "tests_by_clause", "tex_to_text", "text", "third_party_audit_page", "third_party_audits",
    "write_cjk_font",
]
