"""Meta-tests of the audit matrix: cells, finding pages, pins, and the published matrix itself.

The adapters' own audits are slow, so the published ``docs/audits/matrix.json`` is checked against the
pins here, and CI re-runs ``rlconform matrix --check`` for the libraries it installs.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlconform import cli, matrix
from rlconform.spec import default_spec

from conformance_tests.meta.test_harness import _run_repro

pytestmark = pytest.mark.meta
ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "docs" / "audits" / "matrix.json"


def _report(family: str, statuses: dict[str, str]) -> dict:
    return {"run_info": {"families": [family]},
            "clauses": [{"id": cid, "status": st} for cid, st in statuses.items()]}


def test_cells_fold_every_audit_status():
    assert [matrix.cell(s) for s in ("fail", "error", "timeout", "expected_fail")] == ["fail"] * 4
    assert [matrix.cell(s) for s in ("pass", "xpass", "deviation", "not_applicable", "not_run", "untested")] == [
        "pass", "pass", "deviation", "not_applicable", "not_run", "not_run"]


def test_column_marks_unaudited_families_not_applicable_and_unreported_clauses_not_run():
    spec = default_spec()
    ppo = [c.id for c in spec.clauses.values() if c.family == "ppo" and not c.deprecated]
    col = matrix.library_column(_report("ppo", {ppo[0]: "fail", ppo[1]: "deviation"}), spec)
    assert col[ppo[0]] == "fail" and col[ppo[1]] == "deviation"
    assert col[ppo[2]] == "not_run"  # audited family, but the report says nothing of it
    sac = next(c.id for c in spec.clauses.values() if c.family == "sac")
    assert col[sac] == "not_applicable"
    assert set(matrix.library_column(None, spec, reason="skipped").values()) == {"not_run"}


def _matrix(tmp_path, cells: dict[str, str], page: str | None) -> dict:
    findings = tmp_path / "findings"
    findings.mkdir()
    if page:
        (findings / "torchrl-nan-actor.md").write_text(page, encoding="utf-8")
    spec = default_spec()
    col = {c.id: "not_applicable" for c in spec.clauses.values() if not c.deprecated} | cells
    return matrix.build({"torchrl": {"versions": {"torchrl": "0.14.1"}, "cells": col}}, spec, findings,
                        {"date": "d", "commit": "c", "versions": {}})


def test_a_failure_without_a_finding_page_is_a_difference(tmp_path):
    m = _matrix(tmp_path, {"SAC-POL-1": "fail"}, page=None)
    pins = {"torchrl": {"findings": ["SAC-POL-1"], "deviations": []}}
    assert m["libraries"]["torchrl"]["unexplained"] == ["SAC-POL-1"]
    assert any("no page under findings/" in p for p in matrix.check(m, pins))


def test_a_finding_page_naming_the_clause_explains_it(tmp_path):
    m = _matrix(tmp_path, {"SAC-POL-1": "fail", "SAC-ENT-1": "deviation"},
                page="# NaN actor loss\n\nClause SAC-POL-1 (000 §6).\n")
    info = m["libraries"]["torchrl"]
    assert info["finding_pages"] == {"SAC-POL-1": ["torchrl-nan-actor.md"]} and info["unexplained"] == []
    assert matrix.check(m, {"torchrl": {"findings": ["SAC-POL-1"], "deviations": ["SAC-ENT-1"]}}) == []
    md = matrix.render_markdown(m)
    assert "findings/torchrl-nan-actor.md" in md and "| `SAC-ENT-1` |" in md


def test_a_page_is_linked_by_what_the_audit_observed_not_by_the_ids_it_mentions(tmp_path):
    """A page found by reading the source names a clause the suite does not reach; it must not
    stand under that clause's cell as if the audit had found it, and a page's asides do not link it."""
    page = ("# SAPO ignores the aggregation mode\n\n- **Clauses**: SAC-POL-1 (the asked mode).\n"
            "- **Found by**: reading the source; the suite does not reach it yet.\n\nCompare SAC-ENT-1.\n")
    m = _matrix(tmp_path, {"SAC-POL-1": "fail"}, page=page)
    info = m["libraries"]["torchrl"]
    assert info["finding_pages"] == {"SAC-POL-1": []} and info["unexplained"] == ["SAC-POL-1"]
    assert info["read_in_source"] == {"torchrl-nan-actor.md": ["SAC-POL-1"]}
    md = matrix.render_markdown(m)
    assert "## Found by reading the source" in md and "SAC-ENT-1" not in md.split("## Found by reading")[1]
    observed = page.replace("reading the source; the suite does not reach it yet", "`rlconform audit --impl x:make`")
    assert matrix.page_facts(observed) == ({"SAC-POL-1"}, True)  # the Clauses bullet, not the aside


@pytest.mark.parametrize("pins, needle", [
    ({"torchrl": {"findings": [], "deviations": ["SAC-ENT-1"]}}, "new findings ['SAC-POL-1']"),
    ({"torchrl": {"findings": ["SAC-POL-1", "SAC-ENT-2"], "deviations": ["SAC-ENT-1"]}},
     "pinned findings ['SAC-ENT-2'] no longer reported"),
    ({"torchrl": {"findings": ["SAC-POL-1"], "deviations": []}}, "new deviations ['SAC-ENT-1']"),
    ({}, "no pins"),
])
def test_check_names_each_difference_from_the_pins(tmp_path, pins, needle):
    m = _matrix(tmp_path, {"SAC-POL-1": "fail", "SAC-ENT-1": "deviation"}, page="SAC-POL-1")
    assert any(needle in p for p in matrix.check(m, pins))


def test_a_library_not_installed_is_not_compared(tmp_path):
    m = _matrix(tmp_path, {}, page=None)
    m["libraries"]["torchrl"]["skipped"] = "not installed"
    assert matrix.check(m, {}) == []


def test_malformed_pins_name_file_and_line(tmp_path):
    bad = tmp_path / "pins.yaml"
    bad.write_text("torchrl:\n  findings: [SAC-POL-1]\n  finding: []\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"pins.yaml:3"):
        matrix.load_pins(bad)


def test_unknown_library_is_a_usage_error(capsys):
    assert cli.main(["matrix", "--library", "nosuchlib"]) == 2
    assert "no adapter for 'nosuchlib'" in capsys.readouterr().err


def test_published_matrix_agrees_with_the_pins_and_every_finding_has_its_page():
    m = json.loads(PUBLISHED.read_text(encoding="utf-8"))
    assert matrix.check(m, matrix.load_pins()) == []
    for lib, info in m["libraries"].items():
        for cid, pages in info["finding_pages"].items():
            for page in pages:
                assert (PUBLISHED.parent / "findings" / page).exists(), (lib, cid, page)


def test_a_check_that_audited_nothing_exits_4_never_0(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(matrix, "ADAPTERS", tuple(
        matrix.Adapter(a.library, a.impl, a.distributions, "no_such_module_for_rlconform", a.install)
        for a in matrix.ADAPTERS))
    assert cli.main(["matrix", "--check", "--out", str(tmp_path / "m")]) == 4
    out = capsys.readouterr()
    assert "NOT CHECKED verl: not installed (pip install --no-deps" in out.out
    assert "agrees with the pins" not in out.out


def test_progress_counts_each_library_run_on_its_own(capsys):
    """The matrix streams one audit after another through one progress printer: each run's count
    restarts at its own total (it once read [2076/598])."""
    def run(n_tests, failing):
        yield {"event": "begin", "impl": "x:make"}
        tests = {f"conformance_tests/test_a.py::t{i}": {} for i in range(n_tests)}
        for _ in range(2):  # xdist: every worker reports the same collection
            yield {"event": "collected", "tests": tests}
        for i, nodeid in enumerate(tests):
            yield {"event": "finish", "nodeid": nodeid, "outcome": "fail" if i < failing else "pass"}

    with cli.AuditProgress() as progress:
        for ev in [*run(3, 1), *run(2, 0)]:
            progress(ev)
    lines = [ln.strip() for ln in capsys.readouterr().err.splitlines()]
    assert lines == ["rlconform audit: 3 tests selected", "[3/3] test_a.py: 1 failing so far",
                     "rlconform audit: 2 tests selected", "[2/2] test_a.py: 0 failing so far"], lines


@pytest.mark.long
@pytest.mark.parametrize("adapter", matrix.ADAPTERS, ids=lambda a: a.library)  # spread over the xdist workers
def test_every_repro_in_the_published_matrix_runs(adapter):
    """The published libraries' reports carry repros a maintainer can paste: each compiles and runs
    against the installed library (the library raising can be the finding; a broken snippet cannot)."""
    if not adapter.installed():
        pytest.skip(f"{adapter.library} is not installed")
    report = matrix.FINDINGS.parent / adapter.library / "report.json"
    assert report.is_file(), f"no published report for {adapter.library}"
    ran = 0
    for c in json.loads(report.read_text())["clauses"]:
        for t in c.get("failing_tests", []):
            if t.get("repro"):
                _run_repro(t["repro"], f"{adapter.library} {c['id']} {t['test']}")
                ran += 1
    assert ran > 0, f"the published {adapter.library} report has no repro"


@pytest.mark.parametrize("adapter", matrix.ADAPTERS, ids=lambda a: a.library)
def test_every_contract_op_of_a_covered_family_is_provided_or_left_out_with_a_reason(adapter):
    """An adapter provides an op of each family it covers or names it in ``LEFT_OUT`` with a reason: a new
    contract op cannot go missing from an adapter without someone saying why."""
    if not adapter.installed():
        pytest.skip(f"{adapter.library} is not installed")
    from conformance_tests import contract
    from conformance_tests.preflight import run as preflight

    provided = {f: set(ops) for f, ops in preflight(adapter.impl).ops.items() if ops}
    declared = adapter.left_out(contract.FAMILIES)
    assert {op.split(".")[0] for op in declared} <= set(provided), "LEFT_OUT names a family the adapter does not cover"
    for family, ops in provided.items():
        for op in contract.op_names(family):
            name = f"{family}.{op}"
            assert (op in ops) != (name in declared), f"{adapter.library}: {name} is " + (
                "both provided and left out" if op in ops else "neither provided nor in LEFT_OUT")
            assert op in ops or len(declared[name].strip()) > 20, f"{adapter.library}: {name} has no real reason"
    assert adapter.left_out(["sac"]) == {k: v for k, v in declared.items() if k.startswith("sac.")}


def test_the_matrix_lists_each_librarys_left_out_ops_with_their_reason(tmp_path):
    m = _matrix(tmp_path, {"SAC-POL-1": "fail"}, page="SAC-POL-1")
    m["libraries"]["torchrl"]["left_out"] = {"sac.bc_loss": "no behaviour-cloning term",
                                             "sac.popart_step": "no PopArt", "sac.cql_penalty": "no behaviour-cloning term"}
    md = matrix.render_markdown(m)
    section = md.split("## Left out by the adapters")[1]
    assert "### torchrl" in section and "- `sac.bc_loss`, `sac.cql_penalty`: no behaviour-cloning term" in section
    assert "- `sac.popart_step`: no PopArt" in section
    m["libraries"]["torchrl"]["left_out"] = {}
    assert "## Left out by the adapters" not in matrix.render_markdown(m)


def test_the_published_matrix_carries_what_each_audited_adapter_leaves_out():
    m = json.loads(PUBLISHED.read_text(encoding="utf-8"))
    for lib, info in m["libraries"].items():
        if info.get("families"):
            assert info.get("left_out"), f"{lib}: matrix.json has no left_out (regenerate the matrix)"
            assert {op.split(".")[0] for op in info["left_out"]} <= set(info["families"]), lib
