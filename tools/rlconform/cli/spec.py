"""``rlconform spec list|show|coverage``: inspect the specification."""
from __future__ import annotations

from rlconform.cli._common import UsageError
from rlconform.coverage import coverage, keyword_coverage
from rlconform.spec import FAMILIES, default_spec


def add_parser(sub) -> None:
    """The spec subcommands."""
    s = sub.add_parser("spec", help="inspect the specification")
    ssub = s.add_subparsers(dest="spec_cmd", required=True)
    sl = ssub.add_parser("list", help="list clauses")
    sl.add_argument("--family", choices=FAMILIES)
    ss = ssub.add_parser("show", help="show one clause")
    ss.add_argument("id")
    sc = ssub.add_parser("coverage", help="fail if a clause has no test or a test names an unknown clause")
    sc.add_argument("--keywords", action="store_true",
                    help="also run the clause tests on the reference and fail if a keyword of the contract is "
                         "never passed at a value other than its default (about a minute)")


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
    spec = default_spec()
    if args.id not in spec.clauses:
        raise UsageError(f"no such clause {args.id!r} (rlconform spec list)")
    c = spec.clause(args.id)
    for k in ("id", "title", "family", "kind", "level", "statement", "formula", "tolerance", "errata", "notes"):
        v = getattr(c, k)
        if v:
            print(f"{k:10s} {v.name if k == 'tolerance' else v}")
    # the document by its title and version, never by its archive file name
    docs = {f.document.get("seed"): f.document for f in spec.families.values()}
    doc = docs.get(c.source["seed"])
    name = f"{doc['title']} ({doc['version']})" if doc else c.source["seed"]
    print(f"{'source':10s} {name} § {c.source['section']}")
    return 0


def _cmd_spec_coverage(args) -> int:
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
    if args.keywords:
        kw = keyword_coverage()
        if kw["exit"] != 0:
            print(kw["output"])
            print("rlconform: the clause tests failed on the reference: no keyword coverage")
            return 2
        for op, key, default in kw["gaps"]:
            print(f"  keyword never passed away from its default: {op}({key}={default!r})")
        print(f"{sum(len(v) for v in kw['log'].values())} keywords passed; {len(kw['gaps'])} only at their default")
        ok = ok and not kw["gaps"]
    print("coverage: OK" if ok else "coverage: FAILED")
    return 0 if ok else 1



def run(args, rest) -> int:
    return {"list": _cmd_spec_list, "show": _cmd_spec_show, "coverage": _cmd_spec_coverage}[args.spec_cmd](args)
