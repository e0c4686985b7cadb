"""The command line: ``python -m tools.site build [--site-dir DIR] [--report report.json] [--serve]`` runs
``mkdocs build --strict`` (or ``mkdocs serve``) on the checkout's mkdocs.yml in a child process."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from tools.site.env import AUDIT_ENV, REPO


def build(site_dir: str | None = None, *, report: str | None = None, serve: bool = False,
          strict: bool = True) -> int:
    """Run ``mkdocs build`` (or ``serve``) on the repository's mkdocs.yml in a child process."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    if report:
        env[AUDIT_ENV] = str(Path(report).resolve())
    cmd = [sys.executable, "-m", "mkdocs", "serve" if serve else "build", "-f", str(REPO / "mkdocs.yml")]
    if strict:
        cmd.append("--strict")
    if site_dir and not serve:
        cmd += ["--site-dir", str(Path(site_dir).resolve())]
    return subprocess.call(cmd, cwd=REPO, env=env)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.site", description="Build the rlconform docs site.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="generate the pages and run mkdocs build --strict")
    b.add_argument("--site-dir", default=None, help="output directory (default: site/)")
    b.add_argument("--report", default=None,
                   help=f"render this report.json instead of auditing the reference (sets ${AUDIT_ENV})")
    b.add_argument("--serve", action="store_true", help="serve with live reload instead of building")
    args = p.parse_args(argv)
    return build(args.site_dir, report=args.report, serve=args.serve)

