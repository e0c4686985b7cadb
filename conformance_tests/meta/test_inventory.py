"""Meta-tests of the seed inventory (spec/inventory/) and its traceability page."""
from __future__ import annotations

import pytest
import yaml
from rlconform.inventory import check_inventory, load_inventory
from rlconform.spec import FAMILIES, default_spec
from rlconform.traceability import gate_producers, traceability_page

pytestmark = pytest.mark.meta


def test_shipped_inventory_maps_every_item():
    r = check_inventory(default_spec())
    assert r["problems"] == []
    assert [it.id for it in r["unmapped"]] == []
    assert r["unknown"] == {}
    assert set(r["items"]) == set(FAMILIES) and all(r["items"].values())


def _write(tmp_path, items):
    for fam in FAMILIES:
        body = {"family": fam, "items": items if fam == "sac" else [
            {"id": f"{fam}.x", "seed": "000_7634b58bbee437f3.txt", "section": "s", "kind": "rule", "summary": "x",
             "excluded": "a reason"}]}
        (tmp_path / f"{fam}.yaml").write_text(yaml.safe_dump(body, allow_unicode=True))
    return tmp_path


BASE = {"seed": "000_7634b58bbee437f3.txt", "section": "6. x", "kind": "formula", "summary": "s"}


def test_an_item_with_neither_clauses_nor_exclusion_is_reported(tmp_path):
    r = check_inventory(default_spec(), _write(tmp_path, [{"id": "sac.a", **BASE}]))
    assert [it.id for it in r["unmapped"]] == ["sac.a"]


def test_an_unknown_clause_and_bad_fields_are_reported(tmp_path):
    items = [{"id": "sac.a", **BASE, "clauses": ["SAC-NOPE-9"]},
             {"id": "sac.a", **BASE, "kind": "wish", "clauses": ["SAC-TD-1"]},
             {"id": "sac.b", **BASE, "clauses": ["SAC-TD-1"], "excluded": "both"}]
    r = check_inventory(default_spec(), _write(tmp_path, items))
    assert list(r["unknown"]) == ["SAC-NOPE-9"]
    text = "\n".join(r["problems"])
    assert "duplicate item id sac.a" in text and "kind must be one of" in text and "not both" in text


def test_traceability_page_links_clauses_and_shows_exclusions():
    page = traceability_page()
    items, _ = load_inventory()
    assert "[SAC-CQL-1](sac.md#SAC-CQL-1)" in page
    excluded = [it for fam in items.values() for it in fam if it.excluded]
    assert excluded and all(f"`{it.id}`" in page for it in excluded)
    assert page.count("| `") == sum(len(v) for v in items.values())  # one row per item


def test_every_gate_has_a_producer_in_the_reference():
    produced = gate_producers(default_spec())
    assert produced["SAC-GATE-1"] is True  # alpha is logged by the SAC trainer
    # GATE-2/7/8 come from the SAC go-live suite (rlconform.golive / reference_impl.sac.quality)
    assert [c for c, ok in produced.items() if not ok] == []


def test_a_gate_whose_metric_nobody_logs_is_flagged(monkeypatch):
    import rlconform.traceability as tr

    monkeypatch.setattr(tr, "_producer_sources", lambda: 'log(alpha=1.0)\n')
    produced = tr.gate_producers(default_spec())
    assert produced["SAC-GATE-1"] is True and produced["SAC-GATE-2"] is False
