"""Spec coverage: every clause has a test, every test names a known clause, and every item of the seed
inventory (``spec/inventory/``) maps to known clauses or carries an exclusion.

Inventory problems are folded into ``untested`` and ``unknown`` too, so any consumer that fails on
those (``rlconform spec coverage``) fails on them; ``inventory_*`` keys hold them on their own.

Tests are found by collecting ``conformance_tests`` with pytest (so parametrised marks count too).
"""
from __future__ import annotations

import contextlib
import io

import pytest

from conformance_tests.marks import item_clauses
from rlconform.inventory import check_inventory
from rlconform.spec import Spec, default_spec


def clause_marks(items) -> tuple[dict[str, tuple[str, ...]], set[str]]:
    """nodeid -> clause ids of collected pytest items, and the node ids of the meta-tests among them."""
    return ({it.nodeid: item_clauses(it) for it in items},
            {it.nodeid for it in items if it.get_closest_marker("meta") is not None})


class _Collector:
    def __init__(self):
        self.items: dict[str, tuple[str, ...]] = {}
        self.meta: set[str] = set()

    def pytest_collection_modifyitems(self, session, config, items):
        self.items, self.meta = clause_marks(items)


def collect_tests() -> tuple[dict[str, tuple[str, ...]], int, str, set[str]]:
    """nodeid -> clause ids for every collected test, pytest's exit code, its output, the meta tests."""
    col = _Collector()
    sink = io.StringIO()
    # Collect without the plugin's unknown-id check, so coverage can list unknown ids itself.
    with contextlib.redirect_stdout(sink):
        code = pytest.main(["--pyargs", "conformance_tests", "--collect-only", "-q", "-p", "no:cacheprovider",
                            "--rlconform-skip-id-check"], plugins=[col])
    return col.items, int(code), sink.getvalue(), col.meta


def coverage(spec: Spec | None = None) -> dict:
    spec = spec or default_spec()
    marks, code, output, meta = collect_tests()
    tested: dict[str, int] = {}
    unknown: dict[str, list[str]] = {}
    unmarked = []
    for nodeid, clauses in marks.items():
        if not clauses and nodeid not in meta:  # meta-tests check the suite itself, not a clause
            unmarked.append(nodeid)
        for c in clauses:
            if c in spec.clauses:
                tested[c] = tested.get(c, 0) + 1
            else:
                unknown.setdefault(c, []).append(nodeid)
    untested = [c for c in spec.clauses if c not in tested and not spec.clauses[c].deprecated]
    inv = inventory_coverage(spec)
    untested += inv["problems"] + [f"inventory item {it.id} ({it.path}) names no clause and has no exclusion"
                                   for it in inv["unmapped"]]
    for c, where in inv["unknown"].items():
        unknown.setdefault(c, []).extend(where)
    return {"clauses": len(spec.clauses), "tested": tested, "untested": untested, "unknown": unknown,
            "unmarked_tests": unmarked, "collect_exit": code, "collect_output": output,
            "inventory_items": sum(len(v) for v in inv["items"].values()),
            "inventory_excluded": sum(1 for v in inv["items"].values() for it in v if it.excluded),
            "inventory_problems": inv["problems"], "inventory_unmapped": [it.id for it in inv["unmapped"]],
            "inventory_unknown": inv["unknown"]}


def inventory_coverage(spec: Spec | None = None, directory=None) -> dict:
    """The inventory check alone (no test collection): see :func:`rlconform.inventory.check_inventory`."""
    return check_inventory(spec or default_spec(), directory)
