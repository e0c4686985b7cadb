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

from rlconform.spec import AGGREGATES, Clause, Spec, default_spec
MIN_RECORDS_LAST_HALF = 4  # a "last half" of fewer than two records is no trend at all


@dataclasses.dataclass
class GateResult:
    clause: Clause
    figure: float | None
    verdict: str  # "pass", "fail" or "missing"
    note: str = ""

    @property
    def line(self) -> str:
        g = self.clause.gate
        fig = "—" if self.figure is None else f"{self.figure:.6g}"
        tail = f"  ({self.note})" if self.note else ""
        return (f"{self.verdict.upper():7s} {self.clause.id:14s} {g['metric']} ({g.get('aggregate', 'last')}) = {fig}"
                f"  needs {g['op']} {g['threshold']}{tail}")


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
    if figure is None or not math.isfinite(figure):
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
    """Each gate clause of ``family`` against the per-update ``records`` (dicts of metric -> value).

    A NaN or infinity anywhere in a gated metric fails its gate, whatever the aggregate: min, median
    and friends would otherwise step over it and pass a run that diverged.
    """
    spec = spec or default_spec()
    records = list(records)
    out = []
    for clause in gates_of(spec, family):
        g = clause.gate
        metric, how = g["metric"], g.get("aggregate", "last")
        logged = [(i, r[metric]) for i, r in enumerate(records) if metric in r]
        if not logged:
            out.append(GateResult(clause, None, "missing", "the run never logged this metric"))
            continue
        # a null is how several loggers write NaN: a non-finite value, never a gap to step over
        bad = [i for i, v in logged if v is None or not math.isfinite(float(v))]
        if bad:
            first = records[bad[0]].get("update", bad[0])
            out.append(GateResult(clause, math.nan, "fail", f"{len(bad)} non-finite or null value(s), the first at "
                                                            f"update {first}"))
            continue
        if how.endswith("_last_half"):  # the second half of the RUN: a metric that stopped being logged is not
            if len(records) < MIN_RECORDS_LAST_HALF:  # measured there, and a few records are no half at all
                out.append(GateResult(clause, None, "missing", f"a run of {len(records)} record(s) is too short for "
                                                               f"{how} (at least {MIN_RECORDS_LAST_HALF})"))
                continue
            half = len(records) // 2
            logged = [(i, v) for i, v in logged if i >= half]
            if not logged:
                out.append(GateResult(clause, None, "missing", "not logged in the second half of the run"))
                continue
            vals, how = [float(v) for _, v in logged], how.replace("_last_half", "")
        else:
            vals = [float(v) for _, v in logged]
        fig = aggregate(vals, how)
        out.append(GateResult(clause, fig, "pass" if compare(fig, g["op"], g["threshold"]) else "fail"))
    return out


def _number(value: Any, where: str, key: str) -> None:
    """Metric values are numbers (NaN/inf allowed: JSON writers spell them NaN/Infinity) or null."""
    if value is None or isinstance(value, bool) or isinstance(value, (int, float)):
        return
    raise ValueError(f"{where}: metric {key!r} is {value!r}, not a number")


def read_metrics(path: str | Path) -> tuple[str, list[dict], list[str]]:
    """(family, records, warnings) of a metrics.jsonl file; the family comes from the records' ``family``.

    A torn last line (a crash mid-write) is dropped with a warning; any other malformed line, a
    non-numeric metric, or update numbers that repeat or go backwards are errors naming file:line.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such metrics file")
    lines = path.read_text(encoding="utf-8").splitlines()
    records, places, warnings, last_update, where_update = [], [], [], None, None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines):
                warnings.append(f"{where}: torn last line ignored ({e.msg}); the run was probably killed mid-write")
                break
            raise ValueError(f"{where}: not a JSON object ({e.msg})") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{where}: expected a JSON object per line, got {type(rec).__name__}")
        for key, value in rec.items():
            if key not in ("family", "time") and not isinstance(value, (str, list, dict)):
                _number(value, where, key)
        places.append(where)
        update = rec.get("update")
        if update is not None:
            if last_update is not None and update <= last_update:
                what = "repeats" if update == last_update else "goes backwards from"
                raise ValueError(f"{where}: update {update} {what} update {last_update} at {where_update} "
                                 "(stale records of an earlier run? start a fresh run directory)")
            last_update, where_update = update, where
        records.append(rec)
    if not records:
        raise ValueError(f"{path}: no metrics records")
    fams = {r.get("family") for r in records} - {None}
    if len(fams) != 1:
        raise ValueError(f"{path}: records must name exactly one family, found {sorted(fams) or 'none'}")
    family = fams.pop()
    if family in default_spec().families:
        for clause in gates_of(default_spec(), family):  # a gated metric must be a number everywhere
            for where, rec in zip(places, records):
                _number(rec.get(clause.gate["metric"]), where, clause.gate["metric"])
    return family, records, warnings


# ---------------------------------------------------------------------------------------------- several runs
# Gates over several runs (SAC-GATE-2: independent seeds; SAC-GATE-8: ablations) have no per-update
# metric. These helpers turn finished runs into the one record such gates read, so `rlconform gate`
# judges a suite summary exactly like a single run.

def divergence(records: list[Mapping[str, Any]], *, losses: Iterable[str], trend: str) -> str | None:
    """Why a run diverged, or None: a non-finite value of any ``losses`` metric, or the ``trend`` loss
    not going down (its median over the last quarter of the logged values above that of the first).
    """
    for key in losses:
        for r in records:
            v = r.get(key)
            if v is not None and not math.isfinite(float(v)):
                return f"{key} = {v} at update {r.get('update')}"
    vals = [float(r[trend]) for r in records if r.get(trend) is not None]
    if len(vals) < 4:
        return f"only {len(vals)} value(s) of {trend}: no trend to judge"
    q = len(vals) // 4
    first, last = statistics.median(vals[:q]), statistics.median(vals[-q:])
    if last > first:
        return f"{trend} rose: median {first:.4g} over the first quarter, {last:.4g} over the last"
    return None


def shortfall(figure: float, op: str, threshold: Any) -> float:
    """How far ``figure`` is on the failing side of the gate (negative: the margin by which it passes)."""
    if op == "in":
        lo, hi = threshold
        return max(lo - figure, figure - hi)
    if op == "==":
        return abs(figure - threshold)
    return threshold - figure if op in (">", ">=") else figure - threshold


def pooled_figures(runs: list[list[Mapping[str, Any]]], family: str, spec: Spec | None = None) -> dict[str, float]:
    """One figure per gated metric for several runs of one configuration: the worst run's (the largest
    shortfall; a non-finite figure is worst of all), so the pooled record passes only if every run does."""
    per_run = [evaluate(r, family, spec) for r in runs]
    out = {}
    for results in zip(*per_run):
        known = [res for res in results if res.verdict != "missing"]
        if known:
            g = known[0].clause.gate
            worst = max(known, key=lambda res: math.inf if not math.isfinite(res.figure)
                        else shortfall(res.figure, g["op"], g["threshold"]))
            out[g["metric"]] = worst.figure
    return out


def ablation_drops(full: float, ablated: Mapping[str, float]) -> dict[str, float]:
    """Percentage-point drop of a key metric (a share in [0, 1]) from the full run to each ablation."""
    return {name: 100 * (full - value) for name, value in ablated.items()}
