"""``rlconform matrix``: audit every installed library adapter; write matrix.json + matrix.md."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from conformance_tests.options import PROFILES
from rlconform import audit, matrix
from rlconform.cli._common import AuditProgress, UsageError, writable_dir

MATRIX_EXIT_CODES = """exit codes of `rlconform matrix`:
  0  the matrix was written (and, with --check, agrees with the pins and every finding has a page)
  1  --check: a finding or deviation appeared or disappeared, or a failure has no finding page
  2  usage error (unknown library, malformed pins file)
  4  an adapter's audit could not run, or --check found nothing to check (no library installed, or one
     named with --library is missing)
"""


def add_parser(sub) -> None:
    """The matrix's options."""
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
    mx.add_argument("--profile", default="ci", choices=PROFILES,
                    help="hypothesis profile; 'mutant' draws the same examples as 'ci' without shrinking a failure, "
                         "so its cells equal ci's in a fraction of the time (the right choice for --check)")
    mx.add_argument("--jobs", type=int, default=None, help="run each audit's tests in N processes (pytest-xdist)")
    mx.add_argument("--timeout", type=float, default=None, help="seconds one test may take (default 120)")


def run(args, rest) -> int:
    for lib in args.library or ():
        try:
            matrix.adapter(lib)
        except KeyError as e:
            raise UsageError(f"--library {lib}: {e.args[0]}") from None
    try:
        pins = matrix.load_pins()
    except (OSError, ValueError) as e:
        raise UsageError(f"the pins file: {e}") from None
    if args.from_json:
        src = Path(args.from_json)
        try:
            earlier = json.loads(src.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UsageError(f"--from {src}: {e}") from None
        m = matrix.refresh(earlier,
                           Path(args.findings) if args.findings else matrix.default_findings(src.parent))
        matrix.write(m, src.parent)  # finding pages may have been added since the run
    else:
        out = writable_dir(args.out, "--out")

        def say(lib, msg):
            print(f"rlconform matrix: {lib}: {msg}", file=sys.stderr, flush=True)

        with AuditProgress() as progress:
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
    problems = matrix.check(m, pins)
    problems += [f"{lib}: the audit did not complete ({m['libraries'][lib].get('verdict')})" for lib in bad_runs]
    for p in problems:
        print(f"  DIFFERENCE {p}")
    print("matrix agrees with the pins" if not problems else f"{len(problems)} difference(s) from the pins")
    return 1 if problems else 0


