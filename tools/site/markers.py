"""The markers hand-written pages carry (``<!-- rlconform:NAME -->``) and what replaces them: the families
table, the CLI's help, the home page's site map."""
from __future__ import annotations

import argparse
from typing import Any, Callable

from rlconform.cli import build_parser
from rlconform.spec import load_spec

from tools.site.markup import cell
from tools.site.nav import site_map


def families_table(spec) -> str:
    rows = ["| family | document | version | clauses |", "|---|---|---|---|"]
    for fam, f in spec.families.items():
        rows.append(f"| [{fam}](spec/{fam}.md) | {cell(f.document['title'])} | {cell(f.version)} | {len(f.clauses)} |")
    return "\n".join(rows)


def cli_help() -> str:
    """`rlconform --help` and every subcommand's help, as written by argparse."""
    parser = build_parser()
    blocks = []

    def walk(p: argparse.ArgumentParser) -> None:
        p.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=96)
        blocks.append((p.prog, p.format_help()))
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in dict.fromkeys(action.choices.values()):
                    walk(sub)

    walk(parser)
    return "\n".join(f"### `{prog}`\n\n```text\n{help_.rstrip()}\n```\n" for prog, help_ in blocks)


MARKERS: dict[str, Callable[[Any], str]] = {
    "<!-- rlconform:families -->": families_table,
    "<!-- rlconform:cli-help -->": lambda spec: cli_help(),
    "<!-- rlconform:site-map -->": lambda spec: site_map(spec),
}


def fill_markers(markdown: str) -> str:
    """``markdown`` with every marker of :data:`MARKERS` it holds replaced by its rendering."""
    if "<!-- rlconform:" not in markdown:
        return markdown
    spec = load_spec()
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render(spec))
    return markdown
