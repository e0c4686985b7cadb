"""The audit matrix: every installed library adapter against every clause, in one table.

``rlconform matrix`` audits each adapter of :data:`ADAPTERS` whose library is installed (each in its own
child pytest, as ``rlconform audit`` does), writes a per-library audit (report.json + checklist.md) and
``matrix.json`` / ``matrix.md``: one row per clause, one column per library, each cell one of
:data:`CELLS`. A failing cell is a *finding*; a published finding must have its own page under
``findings/`` that names the clause (an upstream bug report), so every alarm in the matrix is explained.

Each adapter module declares ``LEFT_OUT`` (``{"family.op": why}``), the contract operations of the families
it covers that it does not provide; the matrix carries them per library (``left_out``) and lists them with
their reasons, so a clause that is not applicable says why.

``--check`` compares the findings and deviations of each library with the pins in
``conformance_tests/adapters/pins.yaml``: a suite change that adds or loses one is a difference to
review, never a silent drift.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import re
from importlib import metadata, util
from pathlib import Path
from typing import Callable, Iterable

import conformance_tests.adapters
from conformance_tests.preflight import PreflightError
from conformance_tests.preflight import run as preflight
from rlconform import audit
from rlconform.provenance import render_markdown as stamp_md
from rlconform.provenance import stamp as make_stamp
from rlconform.spec import SEVERITIES, SEVERITY_MEANING, Spec, default_spec
from rlconform.spec.yamlfile import load_yaml, validate

# The cell values, worst first (the order of the Markdown legend).
CELLS = ("fail", "deviation", "pass", "not_applicable", "not_run")
_SYMBOL = {"fail": "✗", "deviation": "≈", "pass": "✓", "not_applicable": "–", "not_run": "?"}
_LABEL = {"fail": "finding", "deviation": "declared deviation", "pass": "pass", "not_applicable": "not applicable",
          "not_run": "not run"}
_ROOT = Path(__file__).resolve().parents[2]
FINDINGS = _ROOT / "docs" / "audits" / "findings"  # the published finding pages (a source checkout only)


def _pins_path() -> Path:
    """pins.yaml as installed (package data of conformance_tests.adapters), a checkout or a wheel alike."""
    return Path(conformance_tests.adapters.__file__).resolve().parent / "pins.yaml"


PINS = _pins_path()
_PINS_SCHEMA = {"type": "object", "additionalProperties": {
    "type": "object", "additionalProperties": False,
    "properties": {k: {"type": "array", "items": {"type": "string"}} for k in ("findings", "deviations")}}}
_CLAUSE_ID = re.compile(r"\b[A-Z]{2,6}(?:-[A-Z0-9]+)+-\d+\b")


@dataclasses.dataclass(frozen=True)
class Adapter:
    """One library behind the contract: its adapter factory and the distributions whose versions matter."""
    library: str
    impl: str
    distributions: tuple[str, ...]
    module: str  # importable iff the library is installed
    install: str  # how to install it next to rlconform

    def installed(self) -> bool:
        return util.find_spec(self.module) is not None

    def left_out(self, families: Iterable[str]) -> dict[str, str]:
        """``"family.op" -> why`` for the ops of ``families`` the adapter declares it leaves out (its ``LEFT_OUT``)."""
        declared = getattr(importlib.import_module(self.impl.split(":")[0]), "LEFT_OUT", {})
        return {op: why for op, why in sorted(declared.items()) if op.split(".")[0] in set(families)}

    def versions(self) -> dict[str, str | None]:
        out = {}
        for d in self.distributions:
            try:
                out[d] = metadata.version(d)
            except metadata.PackageNotFoundError:
                out[d] = None
        return out


ADAPTERS = (
    Adapter("torchrl", "conformance_tests.adapters.torchrl:make", ("torchrl", "tensordict"), "torchrl",
            'pip install "rlconform[torchrl]"'),
    Adapter("tianshou", "conformance_tests.adapters.tianshou:make", ("tianshou",), "tianshou",
            'pip install "rlconform[tianshou]"'),
    Adapter("sb3-contrib", "conformance_tests.adapters.sb3_contrib:make", ("sb3-contrib", "stable-baselines3"),
            "sb3_contrib", 'pip install "rlconform[sb3]"'),
    Adapter("trl", "conformance_tests.adapters.trl:make", ("trl", "transformers"), "trl",
            'pip install "rlconform[trl]"'),
    # verl pins tensordict and transformers below torchrl's and the LM trainer's: no extra, no dependencies
    Adapter("verl", "conformance_tests.adapters.verl:make", ("verl",), "verl",
            'pip install --no-deps "verl>=0.9,<0.10" && pip install ray omegaconf codetiming'),
    Adapter("d3rlpy", "conformance_tests.adapters.d3rlpy:make", ("d3rlpy",), "d3rlpy",
            'pip install "rlconform[d3rlpy]"'),
)


def adapter(library: str) -> Adapter:
    for a in ADAPTERS:
        if a.library == library:
            return a
    raise KeyError(f"no adapter for {library!r} (known: {', '.join(a.library for a in ADAPTERS)})")


def cell(status: str) -> str:
    """A clause status of ``rlconform audit`` as a matrix cell."""
    if status in ("fail", "error", "timeout", "expected_fail"):
        return "fail"
    if status in ("pass", "xpass"):
        return "pass"
    if status == "deviation":
        return "deviation"
    if status in ("not_applicable", "skipped"):
        return "not_applicable"
    return "not_run"  # not_run, untested


def library_column(report: dict | None, spec: Spec, *, reason: str | None = None) -> dict[str, str]:
    """Every clause of the spec -> its cell for one library (a family not audited is not applicable)."""
    col = {c.id: "not_applicable" for c in spec.clauses.values() if not c.deprecated}
    if report is None:
        return {cid: "not_run" for cid in col} if reason else col
    audited = set(report["run_info"].get("families") or ())
    for c in spec.clauses.values():
        if c.family in audited and c.id in col:
            col[c.id] = "not_run"
    for entry in report["clauses"]:
        if entry["id"] in col:
            col[entry["id"]] = cell(entry["status"])
    return col


def _bullet(text: str, key: str) -> str | None:
    """The text of a page's ``- **key**:`` bullet, continuation lines included (None when absent)."""
    m = re.search(rf"^- \*\*{re.escape(key)}\*\*:(.*?)(?=^- \*\*|^\s*$|^#|\Z)", text, re.S | re.M)
    return m.group(1) if m else None


def page_facts(text: str) -> tuple[set[str], bool]:
    """The clauses a finding page explains (its **Clauses** bullet; every id on the page without one) and
    whether the audit observed it (its **Found by** bullet names ``rlconform audit``), not a reading of the
    library's source that the suite does not reach."""
    clauses = _bullet(text, "Clauses")
    found_by = _bullet(text, "Found by")
    return set(_CLAUSE_ID.findall(clauses if clauses is not None else text)), found_by is None or "rlconform audit" in found_by


def finding_pages(findings_dir: Path, *, observed: bool = True) -> dict[tuple[str, str], list[str]]:
    """(library, clause) -> the finding pages (file names) that explain that clause: those the audit observed
    (``observed=True``, linked from the matrix's cells) or those found by reading the source (False)."""
    out: dict[tuple[str, str], list[str]] = {}
    if not findings_dir.is_dir():
        return out
    libs = sorted((a.library for a in ADAPTERS), key=len, reverse=True)
    for page in sorted(findings_dir.glob("*.md")):
        lib = next((lib for lib in libs if page.stem.startswith(lib + "-")), None)
        if lib is None:
            continue
        clauses, seen = page_facts(page.read_text(encoding="utf-8"))
        if seen != observed:
            continue
        for cid in clauses:
            out.setdefault((lib, cid), []).append(page.name)
    return out


def build(columns: dict[str, dict], spec: Spec, findings_dir: Path, stamp: dict) -> dict:
    """matrix.json: the stamp, per library its version, verdict, findings and deviations, and the cells."""
    pages = finding_pages(findings_dir)
    libs = {}
    for lib, info in columns.items():
        cells = info["cells"]
        findings = sorted(c for c, v in cells.items() if v == "fail")
        libs[lib] = {k: v for k, v in info.items() if k != "cells"} | {
            "findings": findings,
            "deviations": sorted(c for c, v in cells.items() if v == "deviation"),
            "finding_pages": {c: pages.get((lib, c), []) for c in findings},
            # outside a checkout (an installed wheel) there are no finding pages to hold the failures to
            "unexplained": [c for c in findings if not pages.get((lib, c))] if Path(findings_dir).is_dir() else [],
            "read_in_source": _read_in_source(findings_dir, lib),
            "cells": cells,
        }
    return {"stamp": stamp, "libraries": libs,
            "clauses": [{"id": c.id, "family": c.family, "level": c.level, "title": c.title}
                        for c in spec.clauses.values() if not c.deprecated]}


def default_findings(out: Path) -> Path:
    return out / "findings" if (out / "findings").is_dir() else FINDINGS


def refresh(matrix: dict, findings_dir: Path) -> dict:
    """The same matrix with its finding pages looked up again (after pages were added or renamed), and each
    audited library's left-out ops read again from its adapter's ``LEFT_OUT`` (reasons edited since the run)."""
    pages = finding_pages(findings_dir)
    for lib, info in matrix["libraries"].items():
        if info.get("families"):
            info["left_out"] = adapter(lib).left_out(info["families"])
        info["finding_pages"] = {c: pages.get((lib, c), []) for c in info.get("findings", [])}
        info["unexplained"] = [c for c in info.get("findings", []) if not pages.get((lib, c))]
        info["read_in_source"] = _read_in_source(findings_dir, lib)
    return matrix


def _read_in_source(findings_dir: Path, lib: str) -> dict[str, list[str]]:
    """page -> clauses, for ``lib``'s finding pages found by reading its source (the audit did not see them)."""
    out: dict[str, list[str]] = {}
    for (l, cid), names in finding_pages(findings_dir, observed=False).items():
        if l == lib:
            for name in names:
                out.setdefault(name, []).append(cid)
    return {k: sorted(v) for k, v in sorted(out.items())}


def render_markdown(matrix: dict) -> str:
    libs = matrix["libraries"]
    names = list(libs)
    lines = ["# Audit matrix", "", stamp_md(matrix["stamp"]), ""]
    lines += ["Each library's adapter (`conformance_tests/adapters/`) was audited against every clause. "
              "A **finding** is a MUST or SHOULD clause the library fails; each has its own page, written as an "
              "upstream bug report. A **deviation** is a convention the adapter declares (see the Conventions "
              "page): the clause passes under it and the consequence is documented. `–` means the library "
              "offers no operation the clause could check.", ""]
    lines += ["| library | version | families | verdict | findings | deviations |", "|---|---|---|---|---|---|"]
    for lib, info in libs.items():
        versions = ", ".join(f"{k} {v}" for k, v in (info.get("versions") or {}).items() if v) or "not installed"
        fams = ", ".join(info.get("families") or []) or "–"
        name = lib if info.get("skipped") or info.get("error") else f"[{lib}]({lib}/checklist.md)"
        lines.append(f"| {name} | {versions} | {fams} | {info.get('verdict') or info.get('skipped') or ''} "
                     f"| {len(info['findings'])} | {len(info['deviations'])} |")
    lines += ["", "## Findings", "", f"Worst first: {SEVERITY_MEANING}.", ""]
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    rows = sorted(((rank.get((info.get("severity") or {}).get(cid), 1), lib, cid) for lib, info in libs.items()
                   for cid in info["findings"]))
    any_finding = bool(rows)
    for r, lib, cid in rows:
        pages = libs[lib]["finding_pages"].get(cid) or []
        link = ", ".join(f"[{p[:-3]}](findings/{p})" for p in pages) or "**no finding page yet**"
        sev = (libs[lib].get("severity") or {}).get(cid)
        lines.append(f"- {f'[{sev}] ' if sev else ''}**{lib}** — `{cid}`: {link}")
    if not any_finding:
        lines.append("No library fails a clause.")
    read = [(lib, page, cids) for lib, info in libs.items() for page, cids in (info.get("read_in_source") or {}).items()]
    if read:
        lines += ["", "## Found by reading the source", "",
                  "Defects seen in a library's code that no contract operation reaches yet: they are not cells of "
                  "this matrix, and the clauses named are those the page argues from.", ""]
        lines += [f"- **{lib}** — [{page[:-3]}](findings/{page}) ({', '.join(f'`{c}`' for c in cids)})"
                  for lib, page, cids in read]
    shown = [c for c in matrix["clauses"]
             if any(libs[lib]["cells"].get(c["id"]) not in ("not_applicable", None) for lib in names)]
    lines += ["", "## Clause × library", "",
              "Clauses that no library can reach are left out. Legend: "
              + ", ".join(f"{_SYMBOL[c]} {_LABEL[c]}" for c in CELLS) + ".", "",
              "| clause | level | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for c in shown:
        row = [_SYMBOL[libs[lib]["cells"].get(c["id"], "not_applicable")] for lib in names]
        lines.append(f"| `{c['id']}` | {c['level']} | " + " | ".join(row) + " |")
    return "\n".join(lines + _left_out_lines(libs)) + "\n"


def _left_out_lines(libs: dict) -> list[str]:
    """Per library, the contract ops its adapter leaves out, grouped by the adapter's reason."""
    if not any(info.get("left_out") for info in libs.values()):
        return []
    lines = ["", "## Left out by the adapters", "",
             "The contract operations of each audited family that the library's adapter does not provide, with the "
             "adapter's reason: the clauses that only they reach are not applicable for that library.", ""]
    for lib, info in libs.items():
        by_reason: dict[str, list[str]] = {}
        for op, why in (info.get("left_out") or {}).items():
            by_reason.setdefault(why, []).append(op)
        if by_reason:
            lines += [f"### {lib}", ""] + [f"- {', '.join(f'`{op}`' for op in ops)}: {why}"
                                           for why, ops in by_reason.items()] + [""]
    return lines[:-1]


def load_pins(path: Path = PINS) -> dict[str, dict[str, list[str]]]:
    data, lines = load_yaml(path)
    validate(data or {}, _PINS_SCHEMA, path, lines)
    return {lib: {"findings": sorted(v.get("findings") or []), "deviations": sorted(v.get("deviations") or [])}
            for lib, v in (data or {}).items()}


def check(matrix: dict, pins: dict[str, dict[str, list[str]]]) -> list[str]:
    """Differences between the matrix and the pins, and failures no finding page explains ([] = agreed).

    A library that was not audited (not installed) is not compared."""
    problems = []
    for lib, info in matrix["libraries"].items():
        if info.get("skipped"):
            continue
        pin = pins.get(lib)
        if pin is None:
            problems.append(f"{lib}: no pins in {PINS.name}; add findings {info['findings']} and deviations "
                            f"{info['deviations']} after confirming them")
            continue
        for kind in ("findings", "deviations"):
            got, want = set(info[kind]), set(pin[kind])
            if got - want:
                problems.append(f"{lib}: new {kind} {sorted(got - want)} (not pinned)")
            if want - got:
                problems.append(f"{lib}: pinned {kind} {sorted(want - got)} no longer reported")
        for cid in info["unexplained"]:
            problems.append(f"{lib}: {cid} fails but no page under findings/ names it (a false alarm until "
                            "one does)")
    return problems


def run(libraries: Iterable[str] | None, out: Path, *, profile: str = "ci", jobs: int | None = None,
        timeout: float | None = None, findings: Path | None = None,
        on_library: Callable[[str, str], None] | None = None, on_event: Callable[[dict], None] | None = None) -> dict:
    """Audit the chosen (default: every installed) library and write matrix.json / matrix.md under ``out``.

    Finding pages are looked up in ``findings`` (default: ``out/findings`` if it exists, else the
    published pages of the checkout)."""
    spec = default_spec()
    chosen = [adapter(lib) for lib in libraries] if libraries else list(ADAPTERS)
    columns: dict[str, dict] = {}
    for a in chosen:
        info: dict = {"impl": a.impl, "versions": a.versions()}
        if not a.installed():
            info["skipped"] = f"not installed ({a.install})"
            columns[a.library] = info | {"cells": library_column(None, spec, reason="skipped")}
            _say(on_library, a.library, info["skipped"])
            continue
        _say(on_library, a.library, "auditing")
        try:
            pf = preflight(a.impl)
        except PreflightError as e:
            info.update(verdict="adapter cannot run", exit_code=audit.EXIT_IMPL, error=str(e))
            columns[a.library] = info | {"cells": library_column(None, spec, reason="error")}
            _say(on_library, a.library, f"cannot run: {str(e).splitlines()[0]}")
            continue
        families = [f for f in pf.ops if pf.ops[f]]
        lib_out = out / a.library
        lib_out.mkdir(parents=True, exist_ok=True)
        payload = audit.run_suite(pf.impl_string, profile=profile, families=families, jobs=jobs, timeout=timeout,
                                  on_event=on_event, log=lib_out / "pytest.log")
        payload.update(pf.info())
        report = audit.clause_report(payload)
        audit.write_report(report, lib_out)
        info.update(families=families, audited=report["run_info"].get("finished"), exit_code=report["summary"]["exit_code"],
                    verdict=report["summary"]["verdict"], seconds=round(payload["finished"] - payload["started"], 1))
        info["severity"] = {c["id"]: c["severity"] for c in report["clauses"] if c.get("severity")}
        info["left_out"] = a.left_out(families)
        columns[a.library] = info | {"cells": library_column(report, spec)}
        _say(on_library, a.library, f"exit {info['exit_code']}: {info['verdict']} ({info['seconds']} s)")
    previous = out / "matrix.json"
    if libraries and previous.exists():  # re-auditing some libraries keeps the others' columns
        kept = json.loads(previous.read_text(encoding="utf-8"))["libraries"]
        columns = {lib: info for lib, info in kept.items() if lib not in columns} | columns
        columns = {a.library: columns[a.library] for a in ADAPTERS if a.library in columns}
    stamp = make_stamp(packages=[d for a in ADAPTERS if a.library in columns for d in a.distributions],
                       extra={"profile": profile})
    matrix = build(columns, spec, findings or default_findings(out), stamp)
    write(matrix, out)
    return matrix


def write(matrix: dict, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    mj, mm = out / "matrix.json", out / "matrix.md"
    for path, text in ((mj, json.dumps(matrix, indent=1, ensure_ascii=False)), (mm, render_markdown(matrix))):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return mj, mm


def _say(cb, lib: str, msg: str) -> None:
    if cb is not None:
        cb(lib, msg)
