"""rlconform: audit an implementation, inspect the spec, run mutants, check gates, train, bench."""
from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys
from pathlib import Path

from rlconform.spec import FAMILIES, SpecError, default_spec

# Trainers: ``rlconform train NAME ...`` calls ``module:function(argv)``.
TRAINERS = {
    "sac": "reference_impl.sac.trainer:cli",
    "sac-suite": "reference_impl.sac.suite:main",
    "ppo": "reference_impl.ppo.trainer:cli",
    "mappo": "reference_impl.ppo.mappo_trainer:cli",
    "isreshape": "reference_impl.isreshape.trainer:cli",
    "isreshape-lm": "reference_impl.isreshape.lm.trainer:cli",
    "ccapo": "reference_impl.ccapo.trainer:cli",
    "ccapo-textworld": "reference_impl.ccapo.textworld.trainer:cli",
}


# Results studies: ``rlconform study NAME`` runs ``module.run`` then ``module.publish``.
STUDIES = {"isreshape-lm": "rlconform.study.isreshape_lm"}


def _cmd_study(args) -> int:
    mod = importlib.import_module(STUDIES[args.name])
    kw = {"updates": args.updates} if args.updates else {}
    bad = ([f"--parallel {args.parallel} must be at least 1"] if args.parallel < 1 else []) + \
          ([f"--variant {args.variant}: choose from {', '.join(mod.VARIANTS)}"] if args.variant not in mod.VARIANTS else [])
    arms = tuple(a.strip() for a in args.arms.split(",") if a.strip()) if args.arms else mod.ARMS
    bad += [f"--arms: unknown arm {a!r} (choose from {', '.join(mod.ARMS)})" for a in arms if a not in mod.ARMS]
    chosen = None
    if args.lr_from:
        try:
            chosen = json.loads(Path(args.lr_from).read_text())
        except (OSError, ValueError) as e:
            bad.append(f"--lr-from {args.lr_from}: {e}")
        else:
            bad += [f"--lr-from {args.lr_from}: no positive learning rate for arm {a!r}" for a in arms
                    if not isinstance(chosen, dict) or not isinstance(chosen.get(a), (int, float)) or chosen[a] <= 0]
    if bad:
        print("\n".join(f"rlconform study: error: {b}" for b in bad), file=sys.stderr)
        return 2
    grid = {"arms": arms, "device": args.device, "variant": args.variant,
            **({"seeds": tuple(range(args.seeds))} if args.seeds else {}),
            **({"pretrains": tuple(range(args.pretrain_seeds))} if args.pretrain_seeds else {}),
            **({"chosen": chosen} if chosen is not None else {})}
    if not args.no_run:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        argv = [a for a in args.argv_ if a != "--no-run"]
        cut = [i for i, a in enumerate(argv) if a.startswith("--publish")]
        if cut:  # the page names the command that made the runs, not where it was published
            argv = argv[:cut[0]] + argv[cut[0] + (1 if "=" in argv[cut[0]] else 2):]
        (Path(args.out) / "command.txt").write_text("rlconform " + shlex.join(argv) + "\n")
        mod.run(Path(args.out), parallel=args.parallel, **kw, **grid)
    if args.publish:
        print(mod.publish(Path(args.out), Path(args.publish), **kw))
    return 0


def _cmd_audit(args) -> int:
    from conformance_tests.preflight import PreflightError, run as preflight
    from rlconform import audit
    from rlconform.expectations import load_expectations
    from rlconform.yamlfile import YamlFileError

    for flag, value, ok in (("--timeout", args.timeout, lambda v: v >= 0), ("--budget", args.budget, lambda v: v > 0),
                            ("--jobs", args.jobs, lambda v: v >= 1)):
        if value is not None and not ok(value):
            print(f"rlconform audit: error: {flag} {value:g} is out of range", file=sys.stderr)
            return audit.EXIT_USAGE

    try:
        load_expectations(args.expectations, default_spec().clauses)
    except YamlFileError as e:
        print(f"rlconform audit: error: --expectations: {e}", file=sys.stderr)
        return audit.EXIT_USAGE
    spec = default_spec()
    for cid in args.clause or ():
        if cid not in spec.clauses:
            print(f"rlconform audit: error: --clause {cid}: no such clause (rlconform spec list)", file=sys.stderr)
            return audit.EXIT_USAGE
        if cid in audit.reference_only_clauses():
            print(f"rlconform audit: error: --clause {cid} is outside every audit: no operation of the contract "
                  f"reaches it (gates judge training runs with `rlconform gate`; the others are checked on the "
                  f"reference's own machinery)", file=sys.stderr)
            return audit.EXIT_USAGE
        if args.family and spec.clause(cid).family not in args.family:
            print(f"rlconform audit: error: --clause {cid} is a {spec.clause(cid).family} clause, outside --family "
                  f"{', '.join(args.family)}", file=sys.stderr)
            return audit.EXIT_USAGE
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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with audit.stops_as_interrupt(), _AuditProgress() as progress:
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
    payload.update(impl_name=pf.name, impl_version=pf.version, impl_commit=pf.commit)
    report = audit.clause_report(payload)
    rj, cm = audit.write_report(report, out)  # first: a closed pipe (`| tee` after Ctrl-C) must not lose it
    if payload.get("interrupted"):
        print(f"rlconform audit: stopped; the partial report is in {rj} (exit {audit.EXIT_SUITE})", file=sys.stderr)
    _print_or_drop(audit.render_checklist(report))
    _print_or_drop(f"wrote {rj} and {cm} (pytest output: {out / 'pytest.log'})")
    return report["summary"]["exit_code"]


def _print_or_drop(text: str) -> None:
    """Print to stdout; if the reader has gone (`| tee` killed by the same Ctrl-C), drop stdout quietly."""
    try:
        print(text, flush=True)
    except (BrokenPipeError, OSError):
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit


class _AuditProgress:
    """Audit progress: a bar on a terminal, plain lines (one per test file) otherwise."""

    def __init__(self):
        self.tty = sys.stderr.isatty()
        self.bar = None
        self.total = 0
        self.done = 0
        self.bad = 0
        self.file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._end()
        return False

    def _end(self):
        if self.bar is not None:
            self.bar.close()
        elif self.file:
            self._line()
        self.bar, self.total, self.done, self.bad, self.file = None, 0, 0, 0, None

    def _line(self):
        print(f"  [{self.done}/{self.total}] {self.file}: {self.bad} failing so far", file=sys.stderr, flush=True)

    def __call__(self, ev: dict) -> None:
        kind = ev.get("event")
        if kind == "begin":  # a new run (the matrix audits one library after another)
            self._end()
        elif kind in ("collected", "collected_ids"):
            if self.total:  # xdist: every worker reports the same collection
                return
            self.total = len(ev["tests"]) if kind == "collected" else ev["count"]
            if self.tty:
                from reference_impl.common import progress

                self.bar = progress(total=self.total, desc="audit", disable=False)
            else:
                print(f"rlconform audit: {self.total} tests selected", file=sys.stderr, flush=True)
        elif kind == "finish":
            fname = ev["nodeid"].split("::")[0].rsplit("/", 1)[-1]
            if self.bar is None and self.file and fname != self.file:
                self._line()  # one plain line per finished test file
            self.file = fname
            self.done += 1
            self.bad += ev.get("outcome") in ("fail", "error", "timeout")
            if self.bar is not None:
                self.bar.set_postfix_str(f"{fname} {','.join(ev.get('clauses', [])[:2])} failing={self.bad}")
                self.bar.update(1)


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
    from rlconform.mutants import run_mutants, select

    chosen = select(args.names or None, args.family or None)
    with progress(total=len(chosen), desc="mutants", disable=False) as bar:
        results = run_mutants(chosen, jobs=args.jobs, full=args.full, profile=args.profile,
                              on_result=lambda r: bar.update(1))
    width = max((len(r.name) for r in results), default=10)
    for r in results:
        verdict = "SURVIVED" if r.survived else "killed"
        line = f"{verdict:8s} {r.family:9s} {r.name:{width}s} by {', '.join(r.killed_by) or '-'}"
        if r.killed_by and r.exit_code != 1:
            line += f"  (the audit exits {r.exit_code}: those failures do not fail it)"
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

    src = Path(args.metrics)
    if src.is_dir():  # a run directory: its metrics.jsonl (or a SAC suite's gates.jsonl)
        found = [src / n for n in ("metrics.jsonl", "gates.jsonl") if (src / n).is_file()]
        if not found:
            print(f"rlconform gate: error: {src} is a directory without metrics.jsonl or gates.jsonl", file=sys.stderr)
            return 2
        args.metrics = str(found[0])
    family, records, warnings = read_metrics(args.metrics)
    for w in warnings:
        print(f"rlconform gate: warning: {w}", file=sys.stderr)
    family = args.family or family
    results = evaluate(records, family)
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


def _train_help() -> str:
    lines = ["usage: rlconform train NAME [TRAINER OPTIONS]  (rlconform train NAME --help: the trainer's options)", "",
             "trainers:"]
    lines += [f"  {name:16s} {target.partition(':')[0]}" for name, target in sorted(TRAINERS.items())]
    return "\n".join(lines) + "\n"


def _cmd_train(args, rest) -> int:
    target = TRAINERS[args.name]
    mod_name, _, fn = target.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        print(f"rlconform train {args.name}: trainer not available ({e})", file=sys.stderr)
        return 2
    return int(getattr(mod, fn)(rest) or 0)


BENCH_HELP = """usage: rlconform bench [PYTEST-ARGS...]

Run the benchmarks in tools/benchmarks/ with pytest-benchmark (timings on one torch thread; each
benchmark file prints the ratios between the contenders it interleaves). Any other argument goes
to pytest, e.g. `rlconform bench -k top_p` or `rlconform bench --benchmark-json out.json`.
"""


def _cmd_bench(args, rest) -> int:
    import pytest

    if "-h" in rest or "--help" in rest:
        print(BENCH_HELP, end="")
        return 0
    bench_dir = Path(__file__).resolve().parent.parent / "benchmarks"
    return int(pytest.main([str(bench_dir), "-p", "no:cacheprovider", "--benchmark-only",
                            "--benchmark-columns=min,median,mean,rounds", *rest]))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlconform", description=__doc__, epilog=EXIT_CODES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"rlconform {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True)

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
    a.add_argument("--clause", action="append", metavar="ID",
                   help="audit only this clause, e.g. SAC-TD-1 (repeatable; the report covers only these)")
    a.add_argument("--expectations", default=None, help="YAML of known failures (list of {clause, reason, link} "
                                                        "or a mapping clause: reason)")
    a.add_argument("--jobs", type=int, default=None, help="run the tests in N processes (pytest-xdist)")
    a.add_argument("--timeout", type=float, default=None,
                   help="seconds one test may take (default 120; 0: no limit); a hung test is marked timeout")
    a.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole audit; what has not run by then is reported as not run (exit 4)")

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
    m.add_argument("--jobs", type=int, default=None, help="mutants run at once (default: the number of cores)")

    mx = sub.add_parser("matrix", help="audit every installed library adapter; write matrix.json + matrix.md",
                        epilog=MATRIX_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    mx.add_argument("--library", action="append", help="audit only this library (repeatable; default: every "
                                                       "installed one: torchrl, tianshou, sb3-contrib, trl, verl)")
    mx.add_argument("--out", default="rlconform-matrix", help="output directory (default: ./rlconform-matrix)")
    mx.add_argument("--findings", default=None, help="directory of finding pages (default: OUT/findings if it "
                                                     "exists, else the checkout's docs/audits/findings)")
    mx.add_argument("--check", action="store_true", help="compare findings and deviations with the pins "
                                                         "(conformance_tests/adapters/pins.yaml); exit 1 on a difference")
    mx.add_argument("--from", dest="from_json", default=None, metavar="MATRIX_JSON",
                    help="re-read the finding pages beside an existing matrix.json, rewrite it and "
                         "matrix.md, and check it, instead of running the audits (implies --check)")
    mx.add_argument("--profile", default="ci", choices=("ci", "release", "mutant"),
                    help="hypothesis profile; 'mutant' draws the same examples as 'ci' without shrinking a failure, "
                         "so its cells equal ci's in a fraction of the time (the right choice for --check)")
    mx.add_argument("--jobs", type=int, default=None, help="run each audit's tests in N processes (pytest-xdist)")
    mx.add_argument("--timeout", type=float, default=None, help="seconds one test may take (default 120)")

    g = sub.add_parser("gate", help="evaluate go-live gates / SLOs on a run's metrics.jsonl")
    g.add_argument("metrics")
    g.add_argument("--family", choices=FAMILIES, default=None, help="override the family named in the file")
    g.add_argument("--allow-missing", action="store_true",
                   help="accept gates whose metric the run never logged (by default a missing gate fails)")

    t = sub.add_parser("train", help="train a reference trainer (see `rlconform train NAME --help`)", add_help=False)
    t.add_argument("name", choices=sorted(TRAINERS))

    sub.add_parser("bench", help="run the benchmarks (pytest-benchmark)", add_help=False)

    st = sub.add_parser("study", help="run a results study (seeds x initial models x arms) and write its page")
    st.add_argument("name", choices=sorted(STUDIES))
    st.add_argument("--out", required=True, help="study directory (re-running the command continues it)")
    st.add_argument("--parallel", type=int, default=2, help="runs at once, one torch thread each (default 2)")
    st.add_argument("--updates", type=int, default=None, help="updates per run (default: the study's own)")
    st.add_argument("--publish", default=None, help="write the page, plot and raw logs into this directory")
    st.add_argument("--no-run", action="store_true", help="only summarise the runs already in --out")
    st.add_argument("--device", default="cpu", help="torch device of every run (default cpu)")
    st.add_argument("--variant", default="tiny", help="model size of the study (isreshape-lm: tiny, large)")
    st.add_argument("--lr-from", default=None, help="skip the sweep: each arm's learning rate from this chosen_lr.json")
    st.add_argument("--arms", default=None, help="comma-separated arms (default: all)")
    st.add_argument("--seeds", type=int, default=None, help="RL seeds 0..N-1 (default: the study's)")
    st.add_argument("--pretrain-seeds", type=int, default=None, help="initial models 0..N-1 (default: the study's)")
    return p


EXIT_CODES = """exit codes of `rlconform audit`:
  0  every selected clause ran, no MUST clause failed and no SHOULD behaviour is wrong
  1  a MUST clause failed (fail, error or timeout), or a SHOULD formula or rule the implementation
     provides computes wrongly (SHOULD lets a behaviour be left out, never be wrong)
  2  usage error (bad arguments, malformed expectations file)
  3  the implementation could not be run (import, factory, signature, device)
  4  the suite could not run (internal error, interrupted, no clause test executed, time budget exhausted)
"""


MATRIX_EXIT_CODES = """exit codes of `rlconform matrix`:
  0  the matrix was written (and, with --check, agrees with the pins and every finding has a page)
  1  --check: a finding or deviation appeared or disappeared, or a failure has no finding page
  2  usage error (unknown library, malformed pins file)
  4  an adapter's audit could not run, or --check found nothing to check (no library installed, or one
     named with --library is missing)
"""


def _cmd_matrix(args) -> int:
    from rlconform import audit, matrix

    if args.library:
        for lib in args.library:
            matrix.adapter(lib)  # KeyError -> usage error below
    if args.from_json:
        src = Path(args.from_json)
        m = matrix.refresh(json.loads(src.read_text(encoding="utf-8")),
                           Path(args.findings) if args.findings else matrix.default_findings(src.parent))
        matrix.write(m, src.parent)  # finding pages may have been added since the run
    else:
        out = Path(args.out)

        def say(lib, msg):
            print(f"rlconform matrix: {lib}: {msg}", file=sys.stderr, flush=True)

        with _AuditProgress() as progress:
            try:
                m = matrix.run(args.library, out, profile=args.profile, jobs=args.jobs, timeout=args.timeout,
                               findings=Path(args.findings) if args.findings else None, on_library=say,
                               on_event=progress)
            except audit.SuiteError as e:
                print(f"rlconform matrix: an audit could not run (exit {audit.EXIT_SUITE}): {e}", file=sys.stderr)
                return audit.EXIT_SUITE
        print(f"wrote {out / 'matrix.json'} and {out / 'matrix.md'}")
    for lib, info in m["libraries"].items():
        state = info.get("skipped") or f"{len(info['findings'])} finding(s) {info['findings']}, " \
                                         f"{len(info['deviations'])} deviation(s)"
        print(f"  {lib}: {state}")
    bad_runs = [lib for lib, info in m["libraries"].items() if info.get("exit_code") in (audit.EXIT_IMPL,
                                                                                       audit.EXIT_SUITE)]
    if not (args.check or args.from_json):
        return audit.EXIT_SUITE if bad_runs else 0
    skipped = [lib for lib, info in m["libraries"].items() if info.get("skipped")]
    for lib in skipped:
        print(f"  NOT CHECKED {lib}: {m['libraries'][lib]['skipped']}")
    if len(skipped) == len(m["libraries"]) or set(args.library or ()) & set(skipped):
        print(f"rlconform matrix: nothing to check for {', '.join(skipped)}: not installed (exit {audit.EXIT_SUITE})",
              file=sys.stderr)
        return audit.EXIT_SUITE  # a check that audited nothing must never pass
    problems = matrix.check(m, matrix.load_pins())
    problems += [f"{lib}: the audit did not complete ({m['libraries'][lib].get('verdict')})" for lib in bad_runs]
    for p in problems:
        print(f"  DIFFERENCE {p}")
    print("matrix agrees with the pins" if not problems else f"{len(problems)} difference(s) from the pins")
    return 1 if problems else 0


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("rlconform")
    except metadata.PackageNotFoundError:  # pragma: no cover - a bare checkout
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"] and (len(argv) == 1 or argv[1] in ("-h", "--help")):
        print(_train_help(), end="")
        return 0
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    args.argv_ = argv
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
        if args.cmd == "matrix":
            return _cmd_matrix(args)
        if args.cmd == "train":
            return _cmd_train(args, rest)
        if args.cmd == "bench":
            return _cmd_bench(args, rest)
        if args.cmd == "study":
            return _cmd_study(args)
    except (SpecError, ValueError, KeyError, FileNotFoundError, FileExistsError) as e:
        print(f"rlconform: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlconform: interrupted", file=sys.stderr)
        return 4
    parser.error("unknown command")
    return 2


if __name__ == "__main__":
    sys.exit(main())
