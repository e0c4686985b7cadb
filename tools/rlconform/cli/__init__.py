"""rlconform: audit an implementation, inspect the spec, run mutants, check gates, train."""
from __future__ import annotations

import argparse
import sys
import traceback

from rlconform.cli import audit as audit_cmd
from rlconform.cli import gate, matrix, mutants, spec, train
from rlconform.cli._common import AuditProgress, UsageError  # noqa: F401  (the commands' shared pieces)
from rlconform.cli.train import TRAINERS  # noqa: F401  (the trainers' registry, read by the benchmarks)

# One module per command: ``add_parser(sub)`` declares its options, ``run(args, rest)`` returns its exit code.
COMMANDS = {"audit": audit_cmd, "spec": spec, "mutants": mutants, "matrix": matrix, "gate": gate, "train": train}
PASS_THROUGH = ("train",)  # commands whose unknown arguments belong to what they run


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("rlconform")
    except metadata.PackageNotFoundError:  # pragma: no cover - a bare checkout
        return "unknown"



def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlconform", description=__doc__, epilog=audit_cmd.EXIT_CODES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"rlconform {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"] and (len(argv) == 1 or argv[1] in ("-h", "--help")):
        print(train.help_text(), end="")
        return 0
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.cmd not in PASS_THROUGH:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    name = args.cmd if args.cmd != "spec" else f"spec {args.spec_cmd}"
    try:
        return COMMANDS[args.cmd].run(args, rest)
    except UsageError as e:
        print(f"rlconform {name}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlconform: interrupted", file=sys.stderr)
        return 4
    except Exception:  # a fault of rlconform, never of the caller's arguments
        traceback.print_exc()
        print(f"rlconform {name}: internal error (exit 4); please report it with the traceback above", file=sys.stderr)
        return 4
