"""``rlconform audit``: run the suite against an implementation and write report.json + checklist.md."""
from __future__ import annotations

import argparse
import sys

from conformance_tests.expectations import load_expectations
from conformance_tests.preflight import PreflightError, run as preflight
from rlconform import audit
from rlconform.cli._common import AuditProgress, UsageError, print_or_drop, writable_dir
from rlconform.spec import FAMILIES, default_spec
from rlconform.spec.yamlfile import YamlFileError

EXIT_CODES = """exit codes of `rlconform audit`:
  0  every selected clause ran, no MUST clause failed and no SHOULD behaviour is wrong
  1  a MUST clause failed (fail, error or timeout), or a SHOULD formula or rule the implementation
     provides computes wrongly (SHOULD lets a behaviour be left out, never be wrong)
  2  usage error (bad arguments, malformed expectations file)
  3  the implementation could not be run (import, factory, signature, device)
  4  the suite could not run (internal error, interrupted, no clause test executed, time budget exhausted)
"""



def add_parser(sub) -> None:
    """The audit's options."""
    a = sub.add_parser("audit", help="run the suite and write report.json + checklist.md", epilog=EXIT_CODES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--impl", default=None, help="module:factory (default: the bundled reference)")
    a.add_argument("--profile", default="ci", choices=("ci", "release"),
                   help="hypothesis profile: ci (25 derandomised examples per property, the same every run; default) "
                        "or release (300 examples from a recorded seed)")
    a.add_argument("--seed", type=int, default=None, help="hypothesis seed for the release profile (default: drawn, "
                                                          "and recorded in the report)")
    a.add_argument("--device", default="cpu", help="where the inputs are built: cpu (default), cuda, cuda:N, or sim "
                                                   "(a CUDA device simulated on the CPU, which refuses what CUDA refuses)")
    a.add_argument("--out", default="rlconform-audit", help="output directory (default: ./rlconform-audit)")
    a.add_argument("--family", action="append", choices=FAMILIES, help="audit only this family (repeatable)")
    a.add_argument("--families", default=None, metavar="F1,F2",
                   help="the same as --family, comma-separated, as pytest's --families spells it")
    a.add_argument("--clause", action="append", metavar="ID",
                   help="audit only this clause, e.g. SAC-TD-1 (repeatable; the report covers only these)")
    a.add_argument("--expectations", default=None, help="YAML of known failures (list of {clause, reason, link} "
                                                        "or a mapping clause: reason)")
    a.add_argument("--jobs", type=int, default=None, help="run the tests in N processes (pytest-xdist)")
    a.add_argument("--timeout", type=float, default=None,
                   help="seconds one test may take (default 120; 0: no limit); a hung test is marked timeout")
    a.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole audit; what has not run by then is reported as not run (exit 4)")


def run(args, rest) -> int:
    for flag, value, ok in (("--timeout", args.timeout, lambda v: v >= 0), ("--budget", args.budget, lambda v: v > 0),
                            ("--jobs", args.jobs, lambda v: v >= 1)):
        if value is not None and not ok(value):
            raise UsageError(f"{flag} {value:g} is out of range")

    try:
        load_expectations(args.expectations, default_spec().clauses)
    except YamlFileError as e:
        raise UsageError(f"--expectations: {e}") from None
    out = writable_dir(args.out, "--out")
    spec = default_spec()
    for fam in (args.families or "").split(","):
        if fam.strip() and fam.strip() not in FAMILIES:
            raise UsageError(f"--families: unknown family {fam.strip()!r} (choose from {', '.join(FAMILIES)})")
        if fam.strip():
            args.family = [*(args.family or []), fam.strip()]
    for cid in args.clause or ():
        if cid not in spec.clauses:
            raise UsageError(f"--clause {cid}: no such clause (rlconform spec list)")
        if cid in audit.reference_only_clauses():
            raise UsageError(f"--clause {cid} is outside every audit: no operation of the contract reaches it (gates "
                             f"judge training runs with `rlconform gate`; the others are checked on the reference's "
                             f"own machinery)")
        if args.family and spec.clause(cid).family not in args.family:
            raise UsageError(f"--clause {cid} is a {spec.clause(cid).family} clause, outside --family "
                             f"{', '.join(args.family)}")
    families = args.family or (sorted({spec.clause(c).family for c in args.clause}) if args.clause else None)
    for entry in reversed(audit.import_path()):  # an --impl module is found where the audit's child finds it
        if entry not in sys.path:
            sys.path.insert(1, entry)
    try:
        pf = preflight(args.impl, device=args.device, families=families)
    except PreflightError as e:
        print(f"rlconform audit: the implementation cannot be run (exit {audit.EXIT_IMPL}):\n{e}", file=sys.stderr)
        return audit.EXIT_IMPL
    print(f"rlconform audit: {pf.impl_string} ({pf.name or '?'} {pf.version or '?'}), families "
          f"{', '.join(families or pf.ops)}" + (f", clauses {', '.join(args.clause)}" if args.clause else "") +
          f", profile {args.profile}, device {args.device}", file=sys.stderr)
    with audit.stops_as_interrupt(), AuditProgress() as progress:
        try:
            payload = audit.run_suite(pf.impl_string, profile=args.profile, device=args.device,
                                      families=families, clauses=args.clause, expectations=args.expectations,
                                      jobs=args.jobs,
                                      timeout=args.timeout, seed=args.seed, budget=args.budget,
                                      on_event=progress, log=out / "pytest.log")
        except audit.SuiteError as e:
            print(f"rlconform audit: the suite could not run (exit {audit.EXIT_SUITE}): {e}", file=sys.stderr)
            return audit.EXIT_SUITE
    if payload.get("preflight_error"):
        print(f"rlconform audit: the implementation cannot be run:\n{payload['preflight_error']}", file=sys.stderr)
        return audit.EXIT_IMPL
    payload.update(pf.info())
    report = audit.clause_report(payload)
    rj, cm = audit.write_report(report, out)  # first: a closed pipe (`| tee` after Ctrl-C) must not lose it
    if payload.get("interrupted") or payload.get("budget_exhausted"):
        why = "the --budget ran out" if payload.get("budget_exhausted") else "stopped"
        print(f"rlconform audit: {why}; the partial report is in {rj} (exit {audit.EXIT_SUITE})", file=sys.stderr)
    print_or_drop(audit.render_checklist(report))
    print_or_drop(f"wrote {rj} and {cm} (pytest output: {out / 'pytest.log'})")
    return report["summary"]["exit_code"]
