"""Spec coverage: every clause has a test, every test names a known clause, and every item of the seed
inventory (``spec/inventory/``) maps to known clauses or carries an exclusion.

Inventory problems are folded into ``untested`` and ``unknown`` too, so any consumer that fails on
those (``rlconform spec coverage``) fails on them; ``inventory_*`` keys hold them on their own.

Tests are found by collecting ``conformance_tests`` with pytest (so parametrised marks count too).

Keyword coverage (:func:`keyword_coverage`) runs the clause tests on the reference and lists every keyword
of the contract that no test passes at a value other than its default: a test that only ever passes the
default cannot tell an operation that honours the keyword from one that ignores it.
"""
from __future__ import annotations

import contextlib
import inspect
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

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


# Keywords the clause tests may leave at their default, each with the reason.
KEYWORD_EXEMPT = {
    ("ccapo.macro_advantage", "eps"): "the advantage_std convention sets the guard (spec/conventions.yaml); the "
                                      "tests follow the declared value, not a drawn one",
}


def keyword_gaps(log: dict[str, dict[str, list[str]]]) -> list[tuple[str, str, Any]]:
    """``(op, keyword, default)`` for every keyword-only parameter of the contract that the calls in ``log``
    (:mod:`conformance_tests.keyword_log`'s file) never vary: one with a default never passed at another
    value, a required one (default None here) passed at fewer than two plain values (an object argument,
    a network or a generator, counts as varied: its value cannot be read). Exempt ones aside."""
    from conformance_tests import contract

    gaps = []
    for family in contract.FAMILIES:
        for op in contract.op_names(family):
            name = f"{family}.{op}"
            for key, param in inspect.signature(getattr(contract.protocol(family), op)).parameters.items():
                if param.kind is not inspect.Parameter.KEYWORD_ONLY or (name, key) in KEYWORD_EXEMPT:
                    continue
                seen = set(log.get(name, {}).get(key, []))
                if param.default is not inspect.Parameter.empty:
                    if seen <= {repr(param.default)}:
                        gaps.append((name, key, param.default))
                elif "<object>" not in seen and len(seen) < 2:
                    gaps.append((name, key, None))
    return gaps


def keyword_coverage(*, profile: str = "smoke", timeout: float = 1200) -> dict:
    """Run the clause tests on the bundled reference, one process, recording every keyword passed; returns
    pytest's exit code, the gaps (:func:`keyword_gaps`) and the log."""
    from rlconform import launch

    with tempfile.TemporaryDirectory(prefix="rlconform-keywords-") as tmp:
        path = Path(tmp) / "keywords.json"
        env = {**os.environ, "RLCONFORM_KEYWORD_LOG": str(path)}
        proc = launch.run([sys.executable, "-m", "pytest", "--pyargs", "conformance_tests", "-m", "not meta", "-q",
                           "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "conformance_tests.keyword_log",
                           "--impl", "reference_impl:make", "--profile", profile],
                          cwd=tmp, env=env, timeout=timeout, tmp=tmp)
        log = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    return {"exit": proc.returncode, "output": proc.stdout[-3000:], "gaps": keyword_gaps(log), "log": log}

