"""``rlconform mutants``: check that the suite kills every shipped mutant."""
from __future__ import annotations

import json
from pathlib import Path

from tqdm.auto import tqdm

from conformance_tests.options import PROFILES
from rlconform.cli._common import UsageError
from rlconform.mutants import run_mutants, select
from rlconform.spec import FAMILIES


def add_parser(sub) -> None:
    """The mutants' options."""
    m = sub.add_parser("mutants", help="check that the suite kills every shipped mutant")
    m.add_argument("names", nargs="*", help="mutant names (default: all)")
    m.add_argument("--family", action="append", choices=FAMILIES)
    m.add_argument("--full", action="store_true", help="run the whole suite per mutant and list every clause it trips")
    m.add_argument("--profile", default="mutant", choices=PROFILES)
    m.add_argument("--json", default=None, help="also write the results as JSON here")
    m.add_argument("--jobs", type=int, default=None, help="mutants run at once (default: the number of cores)")


def run(args, rest) -> int:
    try:
        chosen = select(args.names or None, args.family or None)
    except ValueError as e:
        raise UsageError(str(e)) from None
    with tqdm(total=len(chosen), desc="mutants", dynamic_ncols=True) as bar:
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


