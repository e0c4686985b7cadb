"""Run the suite against an implementation and turn per-test results into a clause report.

``run_suite`` runs pytest in-process with the rlconform plugin and returns its per-test JSON;
``clause_report`` folds that into one status per clause; ``render_checklist`` writes the
grey-release checklist (Markdown) that ``rlconform audit`` prints and saves.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import functools
import io
import json
import platform
import tempfile
from pathlib import Path
from typing import Any, Iterable

from rlconform.spec import Spec, default_spec

STATUSES = ("fail", "error", "expected_fail", "pass", "not_applicable")
_ICON = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "expected_fail": "XFAIL", "not_applicable": "N/A", "untested": "UNTESTED"}


@functools.lru_cache(maxsize=1)
def _clause_files() -> dict[str, frozenset[str]]:
    """clause id -> the test files that check it (one collection per process)."""
    from rlconform.coverage import collect_tests

    import conformance_tests

    root = Path(conformance_tests.__file__).resolve().parent
    marks, _, _, meta = collect_tests()
    out: dict[str, set[str]] = {}
    for nodeid, clauses in marks.items():
        if nodeid in meta:
            continue
        path = str(root / Path(nodeid.split("::")[0]).name)
        for c in clauses:
            out.setdefault(c, set()).add(path)
    return {c: frozenset(v) for c, v in out.items()}


def run_suite(
    impl: str | None = None,
    *,
    profile: str = "ci",
    device: str = "cpu",
    clauses: Iterable[str] | None = None,
    families: Iterable[str] | None = None,
    expectations: str | None = None,
    quiet: bool = False,
    extra: Iterable[str] = (),
) -> dict:
    """Run ``conformance_tests`` (meta-tests excluded) and return the plugin's per-test payload."""
    import pytest

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "tests.json"
        # With a clause filter, collect only the files that hold those clauses' tests (mutant runs).
        files = sorted(set().union(*(_clause_files().get(c, frozenset()) for c in clauses))) if clauses else []
        target = files if files else ["--pyargs", "conformance_tests"]
        args = [*target, "-m", "not meta", "-p", "no:cacheprovider",
                "--profile", profile, "--device", device, "--rlconform-report", str(out),
                "-W", "ignore::pytest.PytestAssertRewriteWarning"]
        if impl:
            args += ["--impl", impl]
        if clauses:
            args += ["--clauses", ",".join(clauses)]
        if families:
            args += ["--families", ",".join(families)]
        if expectations:
            args += ["--expectations", expectations]
        args += ["-q", "--no-header"] if not quiet else ["-qq", "--no-header", "--disable-warnings"]
        args += list(extra)
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink) if quiet else contextlib.nullcontext():
            code = pytest.main(args)
        if not out.exists():
            raise RuntimeError(f"the suite did not run (pytest exit code {int(code)}):\n{sink.getvalue()[-3000:]}")
        payload = json.loads(out.read_text(encoding="utf-8"))
    payload["pytest_exit"] = int(code)
    return payload


def _fold(outcomes: list[str]) -> str:
    if not outcomes:
        return "untested"
    if all(o == "not_applicable" for o in outcomes):
        return "not_applicable"
    for status in ("error", "fail", "expected_fail"):
        if status in outcomes:
            return status
    return "pass"


def clause_report(payload: dict, spec: Spec | None = None) -> dict:
    """report.json: run_info plus one entry per clause touched by the run."""
    spec = spec or default_spec()
    by_clause: dict[str, list[tuple[str, dict]]] = {}
    for nodeid, t in payload["tests"].items():
        if t.get("meta"):
            continue
        for c in t["clauses"]:
            by_clause.setdefault(c, []).append((nodeid, t))
    clauses = []
    for fam, fspec in spec.families.items():
        for c in fspec.clauses:
            tests = by_clause.get(c.id, [])
            if not tests:
                continue
            outcomes = [t["outcome"] or "error" for _, t in tests]
            status = _fold(outcomes)
            entry: dict[str, Any] = {
                "id": c.id, "family": fam, "title": c.title, "level": c.level, "kind": c.kind,
                "status": status, "tests": len(tests),
                "passed": outcomes.count("pass") + outcomes.count("xpass"),
                "not_applicable_tests": outcomes.count("not_applicable"),
            }
            bad = [(n, t) for n, t in tests if t["outcome"] in ("fail", "error", "expected_fail")]
            if bad:
                nodeid, t = bad[0]
                entry["failing_test"] = nodeid
                entry["message"] = _first_lines(t.get("message") or "", 12)
                entry["falsifying_example"] = _falsifying(t.get("message") or "")
                if t.get("repro"):
                    entry["repro"] = t["repro"]
            if status == "expected_fail":
                entry["expectation"] = payload.get("expectations", {}).get(c.id)
            clauses.append(entry)
    run_info = {
        "implementation": payload.get("impl"),
        "implementation_name": payload.get("impl_name"),
        "implementation_version": payload.get("impl_version"),
        "spec_versions": spec.versions(),
        "profile": payload.get("profile"),
        "seed": payload.get("seed"),
        "device": payload.get("device"),
        "python": platform.python_version(),
        "torch": _torch_version(),
        "started": _iso(payload.get("started")),
        "finished": _iso(payload.get("finished")),
        "pytest_exit": payload.get("pytest_exit"),
    }
    counts = {s: sum(1 for c in clauses if c["status"] == s) for s in STATUSES}
    must_failed = [c["id"] for c in clauses if c["level"] == "MUST" and c["status"] in ("fail", "error")]
    return {
        "run_info": run_info,
        "summary": {**counts, "clauses": len(clauses), "must_failed": must_failed},
        "warnings": [f"expectation for {c} matches no collected test" for c in payload.get("unmatched_expectations", [])],
        "clauses": clauses,
    }


def _torch_version() -> str:
    try:
        import torch

        return torch.__version__
    except ImportError:  # pragma: no cover
        return "absent"


def _iso(ts: float | None) -> str | None:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds") if ts else None


def _first_lines(text: str, n: int) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):  # start at our own failure line when there is one
        if "but should be" in ln:
            return "\n".join(lines[i : i + n])
    return "\n".join(lines[-n:])


def _falsifying(text: str) -> str | None:
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        if "Falsifying example" in ln:
            block = [ln]
            for nxt in lines[i + 1 :]:
                if not nxt.strip() or nxt.startswith(("E ", "Traceback", "---")):
                    break
                block.append(nxt)
            return "\n".join(block)
    return None


def render_checklist(report: dict, spec: Spec | None = None) -> str:
    """The grey-release checklist as Markdown: checklist items, then per family failed MUSTs first."""
    spec = spec or default_spec()
    info, summ = report["run_info"], report["summary"]
    status = {c["id"]: c for c in report["clauses"]}
    out = [
        f"# rlconform audit: {info.get('implementation_name') or info['implementation']} {info.get('implementation_version') or ''}".rstrip(),
        "",
        f"- implementation: `{info['implementation']}`",
        "- checked against: " + ", ".join(f"{f} ({v})" for f, v in info["spec_versions"].items()),
        f"- profile `{info['profile']}`, device `{info['device']}`, torch {info['torch']}, finished {info['finished']}",
        "",
        "## Grey-release checklist",
        "",
    ]
    any_items = False
    for fam, fspec in spec.families.items():
        for item in fspec.checklist:
            sts = [status[c]["status"] for c in item.clauses if c in status]
            if not sts:
                continue
            any_items = True
            ok = all(s in ("pass", "expected_fail") for s in sts)
            na = all(s == "not_applicable" for s in sts)
            box = "n/a" if na else ("x" if ok else " ")
            refs = ", ".join(f"{c} {_ICON[status[c]['status']]}" for c in item.clauses if c in status)
            out.append(f"- [{box}] **{item.title}** ({fam}): {refs}")
    if not any_items:
        out.append("(no checklist item applies to this run)")
    for fam, fspec in spec.families.items():
        rows = [c for c in report["clauses"] if c["family"] == fam]
        if not rows:
            continue
        out += ["", f"## {fam}: {fspec.name} ({fspec.version})", ""]
        rank = {"fail": 0, "error": 0, "expected_fail": 2, "pass": 3, "not_applicable": 4}
        rows.sort(key=lambda c: (0 if c["level"] == "MUST" and c["status"] in ("fail", "error") else 1,
                                 rank.get(c["status"], 5), c["id"]))
        failed = [c for c in rows if c["level"] == "MUST" and c["status"] in ("fail", "error")]
        if failed:
            out.append("### Failed MUST clauses")
            out.append("")
            for c in failed:
                msg = (c.get("message") or "").splitlines()
                out.append(f"- **{c['id']}** {c['title']}: {_ICON[c['status']]}. {msg[0] if msg else ''}")
            out.append("")
        out.append("| clause | level | status | tests | title |")
        out.append("|---|---|---|---|---|")
        for c in rows:
            out.append(f"| {c['id']} | {c['level']} | {_ICON[c['status']]} | {c['tests']} | {c['title']} |")
    for w in report.get("warnings", []):
        out += ["", f"> warning: {w}"]
    s = summ
    out += ["", f"**Summary:** {s['clauses']} clauses: {s['pass']} pass, {s['fail']} fail, {s['error']} error, "
            f"{s['expected_fail']} expected failures, {s['not_applicable']} not applicable; "
            f"MUST failures: {len(s['must_failed'])}" + (f" ({', '.join(s['must_failed'])})" if s["must_failed"] else "") + "."]
    return "\n".join(out) + "\n"


def write_report(report: dict, out_dir: str | Path, spec: Spec | None = None) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rj, cm = out / "report.json", out / "checklist.md"
    for path, text in ((rj, json.dumps(report, indent=1, ensure_ascii=False)), (cm, render_checklist(report, spec))):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return rj, cm
