"""``python -m tools.experiments study NAME``: a results study (seeds x initial models x arms) and its page."""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import shlex
import sys
import traceback
from pathlib import Path

from rlconform.cli._common import UsageError, writable_dir

from tools.experiments.grid import Unfinished, pack, read_archive, restore

PROG = "python -m tools.experiments"
# Results studies: ``python -m tools.experiments study NAME`` runs ``module.run`` then ``module.publish``.
STUDIES = {"isreshape-lm": "tools.experiments.isreshape_lm", "ccapo-textworld": "tools.experiments.ccapo_textworld"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="The experiments behind docs/results/ (run from the repository "
                                "root). Exit codes: 0 done, 1 runs left unfinished (re-run to continue), 2 bad "
                                "arguments or input files, 4 an internal error.")
    sub = p.add_subparsers(dest="cmd", required=True)
    add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done, 1 runs left unfinished, 2 bad arguments or input files (nothing started), 4 an internal
    error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        return run(args, argv)
    except UsageError as e:
        print(f"{PROG} {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    except Unfinished as e:
        print(f"{PROG} {args.cmd}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 4
    except Exception:
        traceback.print_exc()
        print(f"{PROG} {args.cmd}: internal error (exit 4)", file=sys.stderr)
        return 4


def add_parser(sub) -> None:
    """The study's options."""
    st = sub.add_parser("study", help="run a results study (seeds x initial models x arms) and write its page")
    st.add_argument("name", choices=sorted(STUDIES))
    st.add_argument("--out", required=True, help="study directory (re-running the command continues it)")
    st.add_argument("--parallel", type=int, default=2, help="runs at once, one torch thread each (default 2)")
    st.add_argument("--updates", type=int, default=None, help="updates per run (default: the study's own)")
    st.add_argument("--publish", default=None, help="write the page, plot and raw logs into this directory")
    st.add_argument("--no-run", action="store_true", help="only summarise the runs already in --out")
    st.add_argument("--device", default="cpu", help="torch device of every run (default cpu)")
    st.add_argument("--variant", default=None,
                    help="the study's variant (isreshape-lm: tiny, large; ccapo-textworld: single, multiroom); "
                         "default: its first")
    st.add_argument("--lr-from", default=None, help="skip the sweep: each arm's learning rate from this chosen_lr.json")
    st.add_argument("--arms", default=None, help="comma-separated arms (default: all)")
    st.add_argument("--seeds", type=int, default=None, help="RL seeds 0..N-1 (default: the study's)")
    st.add_argument("--pretrain-seeds", type=int, default=None, help="initial models 0..N-1 (default: the study's)")
    st.add_argument("--resume-from", action="append", default=[], metavar="ARCHIVE",
                    help="first unpack the finished runs of this archive (a page's runs.tar.gz, a --progress file) "
                         "into --out, so they are read, not rerun; repeatable")
    st.add_argument("--progress", default=None, metavar="ARCHIVE",
                    help="keep the study's finished runs in this archive: unpacked first when it exists, re-packed "
                         "as each run ends (with --no-run: packed once). Committed, it carries an unfinished study "
                         "to another machine")


# Options that say where a study is published or kept, not what it runs: the page's command leaves them out.
NOT_THE_STUDY = ("--publish", "--progress", "--resume-from")


def study_command(argv: list[str]) -> list[str]:
    """``argv`` without ``--no-run`` and ``NOT_THE_STUDY`` (``--opt V`` or ``--opt=V``): the command that makes
    the runs from nothing, which a page names."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        opt = a.split("=", 1)[0]
        if a == "--no-run" or opt in NOT_THE_STUDY:
            i += 1 if a == "--no-run" or "=" in a else 2
            continue
        out.append(a)
        i += 1
    return out


def run(args, argv: list[str]) -> int:
    """Check the arguments against the study, then run it (``module.run``) and publish its page (``module.publish``);
    ``argv``, the command line, goes to ``DIR/command.txt`` for the page."""
    mod = importlib.import_module(STUDIES[args.name])
    kw = {"updates": args.updates} if args.updates else {}
    variant = args.variant or next(iter(mod.VARIANTS))  # a study's first variant is its default
    bad = ([f"--parallel {args.parallel} must be at least 1"] if args.parallel < 1 else []) + \
          ([f"--variant {variant}: choose from {', '.join(mod.VARIANTS)}"] if variant not in mod.VARIANTS else []) + \
          ([f"--lr-from: the {args.name} study has no learning-rate sweep"]
           if args.lr_from and not hasattr(mod, "LRS") else [])
    arms = tuple(a.strip() for a in args.arms.split(",") if a.strip()) if args.arms else mod.ARMS
    bad += [f"--arms: unknown arm {a!r} (choose from {', '.join(mod.ARMS)})" for a in arms if a not in mod.ARMS]
    chosen = None
    if args.lr_from and hasattr(mod, "LRS"):
        try:
            chosen = json.loads(Path(args.lr_from).read_text())
        except (OSError, ValueError) as e:
            bad.append(f"--lr-from {args.lr_from}: {e}")
        else:
            bad += [f"--lr-from {args.lr_from}: no positive learning rate for arm {a!r}" for a in arms
                    if not isinstance(chosen, dict) or not isinstance(chosen.get(a), (int, float)) or chosen[a] <= 0]
    archives = [*args.resume_from, *([args.progress] if args.progress and Path(args.progress).exists() else [])]
    if args.progress and not Path(args.progress).resolve().parent.is_dir():  # found now, not after the first run
        bad.append(f"--progress {args.progress}: its directory does not exist")
    for a in archives:  # every archive is read before any is unpacked
        try:
            read_archive(Path(a))
        except (OSError, ValueError) as e:
            bad.append(f"--resume-from/--progress {a}: {e}")
    if bad:
        raise UsageError("\n".join(bad))
    updates = args.updates or mod.default_updates(variant)
    if archives or not args.no_run:
        writable_dir(args.out, "--out")
    for a in archives:  # before any run: a run the archive holds is read, not rerun
        done, present, skipped = restore(Path(a), Path(args.out), updates, relocate=getattr(mod, "relocate", None))
        print(f"{a}: {done} finished runs unpacked into {args.out}, {present} already there"
              + (f"; {skipped} unfinished runs left out (they could not resume without a checkpoint)" if skipped
                 else ""))
    grid = {"arms": arms, "device": args.device, "variant": variant,
            **({"seeds": tuple(range(args.seeds))} if args.seeds else {}),
            **({"pretrains": tuple(range(args.pretrain_seeds))} if args.pretrain_seeds else {}),
            **({"chosen": chosen} if chosen is not None else {})}
    if not args.no_run:
        (Path(args.out) / "command.txt").write_text(f"{PROG} {shlex.join(study_command(argv))}\n")
        mod.run(Path(args.out), parallel=args.parallel, **kw, **grid,
                **({"progress": Path(args.progress)} if args.progress else {}))
    if args.progress:
        print(f"{args.progress}: {pack(Path(args.out), updates, Path(args.progress))} finished runs")
    if args.publish:
        if "variant" in inspect.signature(mod.publish).parameters:  # a study whose variants are separate pages
            kw["variant"] = variant
        print(mod.publish(Path(args.out), Path(args.publish), **kw))
    return 0
