"""The conformance pages: the reference implementation's audit (a report given by $RLCONFORM_AUDIT_REPORT, else
a run at build time), one page per third-party audit under ``docs/audits/``, and the section's index."""
from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from rlconform.audit import clause_report, render_checklist, run_suite

from tools.site.env import AUDIT_ENV
from tools.site.markup import indent, linkify, linkify_document
from tools.site.provenance import reference_stamp

MATRIX_PAGE = "audits/matrix.md"
FINDINGS_DIR = "audits/findings"
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
