"""rlconform: audit an implementation, inspect the spec, run mutants, check gates, train, bench."""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from rlconform.spec import FAMILIES, SpecError, default_spec

# Trainers: ``rlconform train NAME ...`` calls ``module:function(argv)``.
TRAINERS = {
    "sac": "reference_impl.sac.trainer:cli",
    "ppo": "reference_impl.ppo.trainer:cli",
    "mappo": "reference_impl.ppo.mappo_trainer:cli",
    "isreshape": "reference_impl.isreshape.trainer:cli",
    "ccapo": "reference_impl.ccapo.trainer:cli",
}


def _cmd_audit(args) -> int:
    from rlconform.audit import clause_report, render_checklist, run_suite, write_report

    payload = run_suite(args.impl, profile=args.profile, device=args.device, families=args.family or None,
                        expectations=args.expectations, quiet=not args.verbose)
    report = clause_report(payload)
    rj, cm = write_report(report, args.out)
    print(render_checklist(report))
    print(f"wrote {rj} and {cm}")
    return 1 if report["summary"]["must_failed"] else 0


def _cmd_spec_list(args) -> int:
    spec = default_spec()
    for fam, f in spec.families.items():
        if args.family and fam != args.family:
            continue
        print(f"{fam}: {f.name} ({f.version}), {len(f.clauses)} clauses")
        for c in f.clauses:
            flag = " [errata]" if c.errata else ""
            print(f"  {c.id:16s} {c.level:6s} {c.kind:8s} {c.title}{flag}")
    return 0


def _cmd_spec_show(args) -> int:
    c = default_spec().clause(args.id)
    for k in ("id", "title", "family", "kind", "level", "statement", "formula", "tolerance", "errata", "notes"):
        v = getattr(c, k)
        if v:
            print(f"{k:10s} {v.name if k == 'tolerance' else v}")
    print(f"{'source':10s} {c.source['seed']} § {c.source['section']}")
    return 0


def _cmd_spec_coverage(args) -> int:
    from rlconform.coverage import coverage

    cov = coverage()
    if cov["collect_exit"] not in (0, 5):
        print(cov["collect_output"][-3000:])
        print("rlconform: collecting conformance_tests failed")
        return 2
    n, t = cov["clauses"], len(cov["tested"])
    print(f"{t}/{n} clauses have tests")
    for c in cov["untested"]:
        print(f"  untested: {c}")
    for c, nodes in cov["unknown"].items():
        print(f"  unknown clause {c} named by {nodes[0]}" + (f" (+{len(nodes) - 1} more)" if len(nodes) > 1 else ""))
    for node in cov["unmarked_tests"]:
        print(f"  test without a clause mark: {node}")
    ok = not cov["untested"] and not cov["unknown"] and not cov["unmarked_tests"]
    print("coverage: OK" if ok else "coverage: FAILED")
    return 0 if ok else 1


def _cmd_mutants(args) -> int:
    from reference_impl.common import progress
    from rlconform.mutants import run_mutant, select

    chosen = select(args.names or None, args.family or None)
    results = []
    for m in progress(chosen, desc="mutants", disable=False):
        results.append(run_mutant(m, full=args.full, profile=args.profile))
    width = max((len(r.name) for r in results), default=10)
    for r in results:
        verdict = "SURVIVED" if r.survived else "killed"
        line = f"{verdict:8s} {r.family:9s} {r.name:{width}s} by {', '.join(r.killed_by) or '-'}"
        if r.missed:
            line += f"  (not by {', '.join(r.missed)})"
        if args.full and r.also_tripped:
            line += f"  also trips {', '.join(r.also_tripped)}"
        print(line)
    survivors = [r for r in results if r.survived]
    print(f"{len(results) - len(survivors)}/{len(results)} mutants killed")
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in results], indent=1))
    return 1 if survivors else 0


def _cmd_gate(args) -> int:
    from rlconform.gate import evaluate, read_metrics

    family, records = read_metrics(args.metrics)
    family = args.family or family
    results = evaluate(records, family)
    if not results:
        print(f"{family}: the spec has no gate clauses")
        return 0
    print(f"{family}: {len(records)} records from {args.metrics}")
    for r in results:
        print("  " + r.line)
    failing = [r for r in results if r.verdict == "fail" or (r.verdict == "missing" and args.strict)]
    print("gates: FAILED" if failing else "gates: OK")
    return 1 if failing else 0


def _cmd_train(args, rest) -> int:
    target = TRAINERS[args.name]
    mod_name, _, fn = target.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        print(f"rlconform train {args.name}: trainer not available ({e})", file=sys.stderr)
        return 2
    return int(getattr(mod, fn)(rest) or 0)


def _cmd_bench(args, rest) -> int:
    import pytest

    bench_dir = Path(__file__).resolve().parent.parent / "benchmarks"
    return int(pytest.main([str(bench_dir), "-p", "no:cacheprovider", "--benchmark-only",
                            "--benchmark-columns=min,median,mean,rounds", *rest]))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlconform", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    a = sub.add_parser("audit", help="run the suite and write report.json + checklist.md")
    a.add_argument("--impl", default=None, help="module:factory (default: the bundled reference)")
    a.add_argument("--profile", default="ci", choices=("ci", "release"))
    a.add_argument("--device", default="cpu")
    a.add_argument("--out", default="rlconform-audit", help="output directory (default: ./rlconform-audit)")
    a.add_argument("--family", action="append", choices=FAMILIES, help="audit only this family (repeatable)")
    a.add_argument("--expectations", default=None, help="YAML of known failures {clause, reason, link}")
    a.add_argument("-v", "--verbose", action="store_true", help="show pytest's own output")

    s = sub.add_parser("spec", help="inspect the specification")
    ssub = s.add_subparsers(dest="spec_cmd", required=True)
    sl = ssub.add_parser("list", help="list clauses")
    sl.add_argument("--family", choices=FAMILIES)
    ss = ssub.add_parser("show", help="show one clause")
    ss.add_argument("id")
    ssub.add_parser("coverage", help="fail if a clause has no test or a test names an unknown clause")

    m = sub.add_parser("mutants", help="check that the suite kills every shipped mutant")
    m.add_argument("names", nargs="*", help="mutant names (default: all)")
    m.add_argument("--family", action="append", choices=FAMILIES)
    m.add_argument("--full", action="store_true", help="run the whole suite per mutant and list every clause it trips")
    m.add_argument("--profile", default="mutant", choices=("ci", "release", "mutant"))
    m.add_argument("--json", default=None, help="also write the results as JSON here")

    g = sub.add_parser("gate", help="evaluate go-live gates / SLOs on a run's metrics.jsonl")
    g.add_argument("metrics")
    g.add_argument("--family", choices=FAMILIES, default=None, help="override the family named in the file")
    g.add_argument("--strict", action="store_true", help="also fail when a gate's metric is missing from the run")

    t = sub.add_parser("train", help="train a reference trainer (see `rlconform train NAME --help`)", add_help=False)
    t.add_argument("name", choices=sorted(TRAINERS))

    sub.add_parser("bench", help="run the benchmarks (pytest-benchmark)", add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.cmd not in ("train", "bench"):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        if args.cmd == "audit":
            return _cmd_audit(args)
        if args.cmd == "spec":
            return {"list": _cmd_spec_list, "show": _cmd_spec_show, "coverage": _cmd_spec_coverage}[args.spec_cmd](args)
        if args.cmd == "mutants":
            return _cmd_mutants(args)
        if args.cmd == "gate":
            return _cmd_gate(args)
        if args.cmd == "train":
            return _cmd_train(args, rest)
        if args.cmd == "bench":
            return _cmd_bench(args, rest)
    except (SpecError, ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"rlconform: error: {e}", file=sys.stderr)
        return 2
    parser.error("unknown command")
    return 2


if __name__ == "__main__":
    sys.exit(main())
