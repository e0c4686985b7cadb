"""Meta-tests of the spec loader and the coverage check."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import yaml
from rlconform.coverage import coverage
from rlconform.spec import (
    SEEDS,
    SpecError,
    default_spec,
    exact_reason,
    load_spec,
    spec_dir,
)

pytestmark = pytest.mark.meta


def _write(tmp_path, clauses, **family):
    shutil.copy(spec_dir() / "tolerances.yaml", tmp_path / "tolerances.yaml")
    doc = {"family": "sac", "name": "t", "document": {"title": "t", "version": "1", "seed": "000_7634b58bbee437f3.txt"},
           "clauses": clauses, **family}
    (tmp_path / "sac.yaml").write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    return tmp_path


def _clause(**kw):
    base = {"id": "SAC-X-1", "kind": "formula", "title": "t", "level": "MUST", "statement": "s.",
            "formula": r"\alpha = 1", "tolerance": "identity",
            "source": {"seed": "000_7634b58bbee437f3.txt", "section": "1. 符号与范围"}}
    base.update(kw)
    return base


def test_valid_file_loads(tmp_path):
    spec = load_spec(_write(tmp_path, [_clause()]))
    assert spec.clause("SAC-X-1").tolerance.for_dtype("float64") == (1e-9, 1e-12)


def test_an_exact_clause_says_why_and_the_site_shows_it(tmp_path):
    spec = load_spec(_write(tmp_path, [_clause(tolerance="exact", exact_because="Both sides are integer counts."),
                                       _clause(id="SAC-X-2", kind="input", tolerance="exact")]))
    assert exact_reason(spec.clause("SAC-X-1")) == "Both sides are integer counts."
    assert "rejected" in exact_reason(spec.clause("SAC-X-2"))  # the kind's reason
    assert exact_reason(load_spec(_write(tmp_path, [_clause()])).clause("SAC-X-1")) is None


@pytest.mark.parametrize("clauses, message", [
    ([_clause(), _clause()], "duplicate clause id"),
    ([_clause(source={"seed": "000_7634b58bbee437f3.txt"})], "clauses[0].source.section: required field is missing"),
    ([_clause(source={"seed": "nope.txt", "section": "x"})], "not one of the five documents"),
    ([_clause(tolerance="loose")], "unknown tolerance"),
    ([_clause(formula=r"\frac{1}{2")], "unclosed brace"),
    ([_clause(formula="$x$")], "drop the $"),
    ([_clause(formula=r"\left( x")], r"unbalanced \left/\right"),
    ([_clause(id="PPO-X-1")], "must look like SAC-SECTION-N"),
    ([_clause(level="MAY")], "clauses[0].level: 'MAY' is not one of"),
    ([_clause(title=3)], "clauses[0].title: 3 is not of type 'string'"),
    ([_clause(kind="default")], "needs 'value'"),
    ([_clause(kind="default", value={"x": "1.0e9"})], "exponent with a sign"),
    ([_clause(kind="gate")], "gate clause needs"),
    ([_clause(extra=1)], "clauses[0].extra: unknown field"),
    ([{k: v for k, v in _clause().items() if k != "statement"}], "clauses[0].statement: required field is missing"),
    ([_clause(tolerance="exact")], "must say why bit-equality holds on every device"),
    ([_clause(kind="rule", tolerance="exact")], "must say why bit-equality holds on every device"),
    ([_clause(exact_because="indices")], "'exact_because' explains an exact tolerance"),
])
def test_loader_rejects_malformed_clauses(tmp_path, clauses, message):
    with pytest.raises(SpecError, match=re.escape(message)) as err:
        load_spec(_write(tmp_path, clauses))
    assert re.match(r"sac\.yaml:\d+: ", str(err.value)), f"no file:line in {err.value}"


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    _write(tmp_path, [_clause()])
    text = (tmp_path / "sac.yaml").read_text(encoding="utf-8").splitlines()
    text.insert(3, "broken: [1, 2")
    (tmp_path / "sac.yaml").write_text("\n".join(text), encoding="utf-8")
    with pytest.raises(SpecError, match=r"^sac\.yaml:\d+: not valid YAML"):
        load_spec(tmp_path)


def test_tolerance_file_is_schema_checked(tmp_path):
    _write(tmp_path, [_clause()])
    (tmp_path / "tolerances.yaml").write_text("exact: {}\nidentity:\n  float64: {rtol: 1.0e-9}\n")
    with pytest.raises(SpecError, match=re.escape("tolerances.yaml:3: identity.float64.atol: required field is missing")):
        load_spec(tmp_path)


def test_every_tolerance_class_covers_every_declarable_dtype(tmp_path):
    """A library may declare bfloat16 only: a class without a bfloat16 entry would fail its tests with a
    SpecError in the suite's own code, so the loader refuses the spec instead."""
    _write(tmp_path, [_clause()])
    (tmp_path / "tolerances.yaml").write_text("exact: {}\nstochastic:\n  float64: {rtol: 0.05, atol: 0.05}\n"
                                              "  float32: {rtol: 0.05, atol: 0.05}\n")
    with pytest.raises(SpecError, match="tolerance 'stochastic' has no entry for float16, bfloat16"):
        load_spec(tmp_path)


def test_checklist_must_name_known_clauses(tmp_path):
    with pytest.raises(SpecError, match="unknown clause"):
        load_spec(_write(tmp_path, [_clause()], checklist=[{"title": "x", "clauses": ["SAC-NOPE-1"]}]))


def test_the_shipped_spec_is_valid_and_every_clause_is_tested():
    spec = default_spec()
    assert spec.clauses, "the shipped spec has no clauses"
    cov = coverage()
    assert cov["collect_exit"] == 0, cov["collect_output"][-2000:]
    assert not cov["untested"], f"clauses without a test: {cov['untested']}"
    assert not cov["unknown"], f"tests naming unknown clauses: {sorted(cov['unknown'])}"
    assert not cov["unmarked_tests"], f"tests without a clause mark: {cov['unmarked_tests'][:5]}"


@pytest.mark.long
def test_every_keyword_of_the_contract_is_passed_away_from_its_default():
    """A keyword the clause tests only ever pass at its default cannot tell an operation that honours it from one
    that ignores it (an update that keeps its clip range whatever it is given)."""
    from rlconform.coverage import keyword_coverage

    kw = keyword_coverage()
    assert kw["exit"] == 0, kw["output"]
    assert kw["log"]["sac.update_step"]["huber_delta"], "the log holds the keywords the tests passed"
    assert not kw["gaps"], f"keywords only ever passed at their default: {kw['gaps']}"


def test_a_keyword_passed_only_at_its_default_is_a_gap():
    from rlconform.coverage import KEYWORD_EXEMPT, keyword_gaps

    gaps = keyword_gaps({})  # nothing passed: every keyword, exempt ones aside
    assert ("sac.update_step", "huber_delta", 1.0) in gaps and ("ppo.ppo_update", "clip_eps", None) in gaps
    assert not set(KEYWORD_EXEMPT) & {(op, key) for op, key, _ in gaps}
    log = {"sac.update_step": {"huber_delta": ["1.0"], "lambda_cql": ["0.5", "0.25"], "kappa": ["<object>"]},
           "ppo.ppo_update": {"clip_eps": ["0.2"], "vf_coef": ["0.5", "1.5"], "generator": ["<object>"]}}
    names = {(op, key) for op, key, _ in keyword_gaps(log)}
    assert ("sac.update_step", "huber_delta") in names  # only its default
    assert ("sac.update_step", "lambda_cql") not in names and ("sac.update_step", "kappa") not in names
    assert ("ppo.ppo_update", "clip_eps") in names  # a required keyword always passed at one value
    assert ("ppo.ppo_update", "vf_coef") not in names and ("ppo.ppo_update", "generator") not in names


def test_spec_coverage_with_keywords_fails_on_a_gap(monkeypatch, capsys):
    from rlconform.cli import spec as spec_cli

    monkeypatch.setattr(spec_cli, "coverage", lambda: {"collect_exit": 0, "clauses": 1, "tested": {"X": 1},
                                                       "untested": [], "unknown": {}, "unmarked_tests": []})
    monkeypatch.setattr(spec_cli, "keyword_coverage", lambda: {"exit": 0, "output": "", "log": {"a.b": {"k": ["1"]}},
                                                               "gaps": [("sac.legal_set", "min_legal", 3)]})
    args = type("A", (), {"keywords": True})()
    assert spec_cli._cmd_spec_coverage(args) == 1
    out = capsys.readouterr().out
    assert "keyword never passed away from its default: sac.legal_set(min_legal=3)" in out and "FAILED" in out
    args.keywords = False
    assert spec_cli._cmd_spec_coverage(args) == 0


def _seed_dir() -> Path | None:
    for cand in (os.environ.get("RLCONFORM_SEEDS"), Path(__file__).resolve().parents[3] / "shared" / "seeds"):
        if cand and Path(cand).is_dir():
            return Path(cand)
    return None


_SEEDS = _seed_dir()
if _SEEDS is not None:  # the source documents are beside the checkout in CI; users may not have them

    @pytest.mark.parametrize("clause", [pytest.param(c, id=c.id) for c in default_spec().clauses.values()])
    def test_cited_section_heading_exists_in_its_seed(clause):
        text = (_SEEDS / clause.source["seed"]).read_text(encoding="utf-8")
        headings = {ln.lstrip("#").strip() for ln in text.splitlines() if ln.startswith("#")}
        assert clause.source["seed"] in SEEDS
        assert clause.source["section"] in headings, (
            f"{clause.id}: section {clause.source['section']!r} is not a heading of {clause.source['seed']}")
