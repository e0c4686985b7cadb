"""``rlconform gate``: evaluate go-live gates and SLOs on a run's metrics."""
from __future__ import annotations

import sys
from pathlib import Path

from rlconform.cli._common import UsageError
from rlconform.spec import FAMILIES
from rlconform.spec.gates import evaluate, read_metrics


def add_parser(sub) -> None:
    """The gate's options."""
    g = sub.add_parser("gate", help="evaluate go-live gates / SLOs on a run's metrics.jsonl")
    g.add_argument("metrics")
    g.add_argument("--family", choices=FAMILIES, default=None, help="override the family named in the file")
    g.add_argument("--allow-missing", action="store_true",
                   help="accept gates whose metric the run never logged (by default a missing gate fails)")


def run(args, rest) -> int:
    src = Path(args.metrics)
    if src.is_dir():  # a run directory: its metrics.jsonl (or a SAC suite's gates.jsonl)
        found = [src / n for n in ("metrics.jsonl", "gates.jsonl") if (src / n).is_file()]
        if not found:
            raise UsageError(f"{src} is a directory without metrics.jsonl or gates.jsonl")
        args.metrics = str(found[0])
    if not Path(args.metrics).is_file():
        raise UsageError(f"{args.metrics}: no such file or directory")
    try:
        family, records, warnings = read_metrics(args.metrics)
        results = evaluate(records, args.family or family)
    except ValueError as e:  # a damaged metrics file, or a family the spec does not have
        raise UsageError(str(e)) from None
    for w in warnings:
        print(f"rlconform gate: warning: {w}", file=sys.stderr)
    family = args.family or family
    if not results:
        print(f"{family}: the spec has no gate clauses")
        return 0
    print(f"{family}: {len(records)} records from {args.metrics}")
    for r in results:
        print("  " + r.line)
    failing = [r for r in results if r.verdict == "fail" or (r.verdict == "missing" and not args.allow_missing)]
    missing = [r for r in results if r.verdict == "missing"]
    if missing and not args.allow_missing:
        print(f"  {len(missing)} gate(s) have no data in this run: a gate that was not measured is not passed "
              "(--allow-missing to accept that)")
    print("gates: FAILED" if failing else "gates: OK" + (f" ({len(missing)} missing, allowed)" if missing else ""))
    return 1 if failing else 0


