"""Go-live gates and health SLOs: spec clauses of kind ``gate`` evaluated on a run's metrics.

A gate names a metric, a comparison and a threshold; ``aggregate`` says how a run's per-update
values become one figure (default ``last``). Metrics come from a ``metrics.jsonl`` file (one JSON
object per update) or from a dict of figures.
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path
from typing import Any, Iterable, Mapping

from rlconform.spec import Clause, Spec, default_spec

AGGREGATES = ("last", "mean", "median", "min", "max", "mean_last_half", "median_last_half", "first")


@dataclasses.dataclass
class GateResult:
    clause: Clause
    figure: float | None
    verdict: str  # "pass", "fail" or "missing"

    @property
    def line(self) -> str:
        g = self.clause.gate
        fig = "—" if self.figure is None else f"{self.figure:.6g}"
        return f"{self.verdict.upper():7s} {self.clause.id:14s} {g['metric']} ({g.get('aggregate', 'last')}) = {fig}  needs {g['op']} {g['threshold']}"


def aggregate(values: list[float], how: str) -> float:
    if how not in AGGREGATES:
        raise ValueError(f"unknown aggregate {how!r} (known: {', '.join(AGGREGATES)})")
    if how == "first":
        return values[0]
    if how == "last":
        return values[-1]
    if how.endswith("_last_half"):
        values = values[len(values) // 2 :]
        how = how.replace("_last_half", "")
    return {"mean": statistics.fmean, "median": statistics.median, "min": min, "max": max}[how](values)


def compare(figure: float, op: str, threshold: Any) -> bool:
    if figure is None or (isinstance(figure, float) and math.isnan(figure)):
        return False
    if op == "in":
        lo, hi = threshold
        return lo <= figure <= hi
    return {"<": figure < threshold, "<=": figure <= threshold, ">": figure > threshold,
            ">=": figure >= threshold, "==": figure == threshold}[op]


def gates_of(spec: Spec, family: str) -> list[Clause]:
    if family not in spec.families:
        raise ValueError(f"unknown family {family!r} (known: {', '.join(spec.families)})")
    return [c for c in spec.families[family].clauses if c.kind == "gate"]


def evaluate(records: Iterable[Mapping[str, Any]], family: str, spec: Spec | None = None) -> list[GateResult]:
    """Each gate clause of ``family`` against the per-update ``records`` (dicts of metric -> value)."""
    spec = spec or default_spec()
    records = list(records)
    out = []
    for clause in gates_of(spec, family):
        g = clause.gate
        vals = [float(r[g["metric"]]) for r in records if r.get(g["metric"]) is not None]
        if not vals:
            out.append(GateResult(clause, None, "missing"))
            continue
        fig = aggregate(vals, g.get("aggregate", "last"))
        out.append(GateResult(clause, fig, "pass" if compare(fig, g["op"], g["threshold"]) else "fail"))
    return out


def read_metrics(path: str | Path) -> tuple[str, list[dict]]:
    """(family, records) of a metrics.jsonl file; the family comes from the records' ``family`` field."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such metrics file")
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not a JSON object ({e.msg})") from None
    if not records:
        raise ValueError(f"{path}: no metrics records")
    fams = {r.get("family") for r in records} - {None}
    if len(fams) != 1:
        raise ValueError(f"{path}: records must name exactly one family, found {sorted(fams) or 'none'}")
    return fams.pop(), records
