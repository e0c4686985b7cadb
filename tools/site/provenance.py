"""Provenance blocks on the site's pages: the stamp of a results, audit, performance or mutation page (its
own block, the ``provenance.json`` beside it, the audit report it renders, or the stamp of the run above it)
rendered under its title, and the stamp of the reference audit page. A stamped page without a stamp, or
with one from a tree whose code had uncommitted changes, is a build error. The stamp itself is
``rlconform.provenance``'s."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from rlconform.provenance import render_markdown, stamp

from tools.site.env import AUDIT_ENV

STAMP_FILE = "provenance.json"  # rlconform.provenance.stamp(), written beside a generated page
STAMPED_DIRS = ("results/", "audits/", "performance/", "mutation/")
# The command that regenerates a page's figures, named when its stamp is missing or dirty.
REGENERATE = {
    "results/ppo/": "python -m tools.experiments.ppo_curves --seeds 0,1,2",
    "results/isreshape/lm": "python -m tools.experiments study isreshape-lm --out DIR "
                            "--publish docs/results/isreshape/lm... (see the page)",
    "results/isreshape/": "python -m tools.experiments.isreshape_curves --train",
    "results/ccapo/textworld-study/": "python -m tools.experiments study ccapo-textworld --out DIR "
                                      "--publish docs/results/ccapo/textworld-study (see the page)",
    "results/ccapo/textworld-multiroom/": "python -m tools.experiments study ccapo-textworld --out DIR --variant "
                                          "multiroom --publish docs/results/ccapo/textworld-multiroom (see the page)",
    "results/ccapo/textworld/": "python -m reference_impl.ccapo.textworld.plot RUNS --out docs/results/ccapo/textworld",
    "results/ccapo/": "python -m tools.experiments.ccapo_curves --train --seeds 0,1,2",
    "results/sac/": "python -m tools.experiments.sac.build SUITE CEILING.jsonl REEVAL.jsonl SUPERVISED.jsonl EXTRA "
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


class ProvenanceError(Exception):
    """A stamped page that cannot be traced to a clean commit: the site build stops on it."""


_INLINE_COMMIT = re.compile(r"from commit `([^`]*)`")


def page_stamp(docs_dir: Path, src_uri: str, markdown: str) -> tuple[dict | None, str]:
    """The stamp a page's figures come from, and where it was found: the page's own block (``inline``),
    the ``provenance.json`` beside it, the audit report it renders (``report.json``, or ``X.json`` beside
    ``X_checklist.md``), or the nearest enclosing directory's stamp or ``matrix.json`` (a finding page is
    reproduced by the matrix run). ``(None, "")`` when none of these exists."""
    if 'info "Provenance"' in markdown:
        m = _INLINE_COMMIT.search(markdown)
        return {"commit": m.group(1) if m else None}, "inline"
    here = (docs_dir / src_uri).parent
    if (here / STAMP_FILE).is_file():
        return json.loads((here / STAMP_FILE).read_text(encoding="utf-8")), STAMP_FILE
    stem = Path(src_uri).stem
    for report in (here / "report.json", here / f"{stem.removesuffix('_checklist')}.json"):
        if stem != "report" and report.is_file():
            info = json.loads(report.read_text(encoding="utf-8")).get("run_info")
            if info:
                return audit_facts(info), report.name
    section = docs_dir / src_uri.split("/", 1)[0]  # results/, audits/, ...: nothing above it stamps a page
    for d in (d for d in here.parents if d == section or section in d.parents):
        if (d / STAMP_FILE).is_file():
            return json.loads((d / STAMP_FILE).read_text(encoding="utf-8")), _rel(d / STAMP_FILE, here)
        if (d / "matrix.json").is_file():
            return json.loads((d / "matrix.json").read_text(encoding="utf-8"))["stamp"], _rel(d / "matrix.json", here)
    return None, ""


def _rel(path: Path, here: Path) -> str:
    return os.path.relpath(path, here).replace(os.sep, "/")


def audit_facts(info: dict) -> dict:
    """A stamp read from an audit report's ``run_info``. ``tree_commit``, where recorded, names the commit
    whose tree ran (a GPU machine's copy of the tree has the session's base commit as its HEAD)."""
    cmd = f"rlconform audit --impl {info.get('implementation', '?')} --families {','.join(info.get('families', []))}"
    cmd += f" --profile {info.get('profile', '?')} --device {info.get('device', '?')}"
    return {"date": info.get("finished", "?"), "commit": info.get("tree_commit") or info.get("rlconform_commit"),
            "command": cmd, "python": info.get("python"), "machine": info.get("device_name") or info.get("device"),
            "versions": {"rlconform": info.get("rlconform"), "torch": info.get("torch")}}


def check_stamp(src_uri: str, facts: dict | None, origin: str) -> None:
    """A published page names the clean commit its figures came from; anything else stops the build."""
    cmd = next((c for d, c in REGENERATE.items() if src_uri.startswith(d)), None)
    again = f" Regenerate it from a clean checkout: `{cmd}`." if cmd else " Regenerate it from a clean checkout."
    if facts is None:
        raise ProvenanceError(f"{src_uri}: no provenance: no stamp on the page, no {STAMP_FILE}, audit report "
                              f"or matrix.json beside it or above it.{again}")
    commit = facts.get("commit") or ""
    if not re.fullmatch(r"[0-9a-f]{7,40}", commit):
        what = "commit" if commit else "no commit"
        why = f"{what} `{commit}`" if commit else what
        if commit.endswith("+dirty"):
            why += f" (a tree with uncommitted code changes: {', '.join(facts.get('modified', [])) or 'not recorded'})"
        raise ProvenanceError(f"{src_uri}: its stamp ({origin}) records {why}.{again}")


def provenance_markdown(docs_dir: Path, src_uri: str, markdown: str) -> str | None:
    """The provenance admonition for a stamped page (None when the page already carries one). Raises
    :class:`ProvenanceError` for a page with no stamp, or one from a dirty tree."""
    facts, origin = page_stamp(docs_dir, src_uri, markdown)
    check_stamp(src_uri, facts, origin)
    if origin == "inline":
        return None
    files = data_files(docs_dir, src_uri)
    shown = files[:MAX_DATA_LINKS]
    md = render_markdown(facts, data_files=shown)
    if origin != STAMP_FILE:
        md += f"\n    Stamp read from [{origin}]({origin}), the run this page reports on.\n"
    if facts.get("regenerate"):  # the command that re-runs the experiments, as it was named at the stamp's commit
        at = f" (at commit `{facts['commit'][:7]}`)" if facts.get("commit") else ""
        md += f"\n    Regenerate from scratch{at}: `{facts['regenerate']}`\n"
    if len(files) > len(shown):
        md += f"    (and {len(files) - len(shown)} more data files in this directory)\n"
    return md


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
