"""Provenance blocks on the site's pages: the ``provenance.json`` stamp beside a results, audit, performance
or mutation page rendered under its title (or a warning naming the command that would write one), and the
stamp of the reference audit page. The stamp itself is ``rlconform.provenance``'s."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from rlconform.provenance import render_markdown, stamp

from tools.site.env import AUDIT_ENV

STAMP_FILE = "provenance.json"  # rlconform.provenance.stamp(), written beside a generated page
STAMPED_DIRS = ("results/", "audits/", "performance/", "mutation/")
# The command that regenerates a page whose directory holds no stamp yet (the page then says so).
REGENERATE = {
    "results/ppo/": "python tools/ppo_learning_curves.py --seeds 0,1,2",
    "results/isreshape/lm": "rlconform study isreshape-lm --out DIR --publish docs/results/isreshape/lm... (see the page)",
    "results/isreshape/": "python docs/results/isreshape/plot_curves.py --train",
    "results/ccapo/textworld/": "python -m reference_impl.ccapo.textworld.plot RUNS --out docs/results/ccapo/textworld",
    "results/ccapo/": "python docs/results/ccapo/plot_curves.py --train --seeds 0,1,2",
    "results/sac/": "python docs/results/sac/build.py SUITE CEILING.jsonl REEVAL.jsonl SUPERVISED.jsonl EXTRA "
                    "(see the page)",
}
MAX_DATA_LINKS = 12


def stamped_page(src_uri: str) -> bool:
    return src_uri.startswith(STAMPED_DIRS) and src_uri.endswith(".md") and "/_" not in "/" + src_uri


def data_files(docs_dir: Path, src_uri: str) -> list[str]:
    """Raw data beside a page (JSONL, JSON reports, CSV), as links relative to the page's source."""
    here = (docs_dir / src_uri).parent
    found = sorted(p for ext in ("jsonl", "csv") for p in here.rglob(f"*.{ext}"))
    found += [p for p in (here / "report.json", here / "matrix.json") if p.is_file()]
    return [str(p.relative_to(here)).replace(os.sep, "/") for p in found]


def provenance_markdown(docs_dir: Path, src_uri: str, markdown: str) -> str | None:
    """The provenance admonition for a stamped page (None when the page already carries one)."""
    if 'info "Provenance"' in markdown:
        return None
    here = (docs_dir / src_uri).parent
    files = data_files(docs_dir, src_uri)
    shown = files[:MAX_DATA_LINKS]
    stamp_path = here / STAMP_FILE
    if stamp_path.is_file():
        facts = json.loads(stamp_path.read_text(encoding="utf-8"))
        md = render_markdown(facts, data_files=shown)
        if facts.get("regenerate"):  # the command that re-runs the experiments, not only the plotting
            md += f"\n    Regenerate from scratch: `{facts['regenerate']}`\n"
        if len(files) > len(shown):
            md += f"    (and {len(files) - len(shown)} more data files in this directory)\n"
        return md
    cmd = next((c for d, c in REGENERATE.items() if src_uri.startswith(d)), None)
    lines = ['!!! warning "Provenance"',
             f"    No `{STAMP_FILE}` stamp lies beside this page, so its run date, commit and package versions "
             "are not recorded. " + (f"Regenerate it with `{cmd}`." if cmd else
                                     "The command that generated it is not recorded either.")]
    if shown:
        lines += ["", "    Raw data: " + ", ".join(f"[{f}]({f})" for f in shown)]
    return "\n".join(lines) + "\n"


def insert_after_title(markdown: str, block: str) -> str:
    """``block`` right under the page's first level-1 heading (at the top when it has none)."""
    m = re.search(r"^# .*$", markdown, flags=re.M)
    if m is None:
        return block + "\n" + markdown
    return markdown[:m.end()] + "\n\n" + block + "\n" + markdown[m.end():]


def reference_stamp(report: dict | None) -> str:
    """Provenance of the reference page: this build's commit and versions, and when the audit finished."""
    info = (report or {}).get("run_info", {})
    facts = stamp("python -m tools.site build" + (f" --report {Path(os.environ[AUDIT_ENV]).name}"
                                                    if os.environ.get(AUDIT_ENV, "skip") != "skip" else ""),
                  packages=("mkdocs", "mkdocs-material"))
    md = render_markdown(facts)
    if info:
        md += (f"\n    Audit: `{info.get('implementation', '?')}`, rlconform commit "
               f"`{info.get('rlconform_commit') or 'unknown'}`, finished {info.get('finished', '?')}.\n")
    return md
