"""Provenance stamps for generated pages: when, from which commit, with which packages, by which command.

Every results, audit, matrix and performance page carries one, so a reader can trace a figure to the
run that made it. ``stamp()`` gathers the facts (a dict, stored beside the data as JSON);
``render_markdown()`` turns them into the admonition the site shows under a page's title.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import sys
from importlib import metadata
from typing import Iterable, Sequence

import rlconform
from conformance_tests.preflight import checkout_dir, git_commit, modified_paths

# Packages whose versions matter for every page; callers add the libraries they exercised.
BASE_PACKAGES = ("rlconform", "torch", "hypothesis", "numpy")


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def generated_output(path: str) -> bool:
    """A change that does not make the code dirty: the docs' pages and data (what stamped runs write),
    but not the scripts kept beside them."""
    return path.startswith("docs/") and not path.endswith(".py")


def code_commit() -> str | None:
    """rlconform's commit, ``+dirty`` only when code (not generated docs output) differs from it."""
    return git_commit(rlconform, ignore=generated_output)


def dirty_code_paths() -> list[str]:
    where = checkout_dir(rlconform)
    return [p for p in modified_paths(where) if not generated_output(p)] if where else []


def stamp(command: str | Sequence[str] | None = None, *, packages: Iterable[str] = (),
          extra: dict | None = None) -> dict:
    """The facts of this run: UTC date, rlconform commit, Python, platform, thread count and package
    versions. ``command`` defaults to the current process's command line."""
    if command is None:
        command = [os.path.basename(sys.argv[0]) or "python", *sys.argv[1:]]
    if not isinstance(command, str):
        command = shlex.join(list(command))
    names = list(dict.fromkeys([*BASE_PACKAGES, *packages]))
    threads = None
    try:
        import torch

        threads = torch.get_num_threads()
    except ImportError:  # a torch-free caller (the site build) still gets a stamp
        pass
    out = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": code_commit(),
        "command": command,
        "python": platform.python_version(),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
        "torch_threads": threads,
        "versions": {n: package_version(n) for n in names},
    }
    if (out["commit"] or "").endswith("+dirty"):  # say what differed, so a reader can judge
        out["modified"] = dirty_code_paths()[:20]
    if extra:
        out.update(extra)
    return out


def render_markdown(facts: dict, *, data_files: Iterable[str] = ()) -> str:
    """An mkdocs admonition with the stamp; ``data_files`` are links to the raw data beside the page."""
    versions = ", ".join(f"{k} {v}" for k, v in (facts.get("versions") or {}).items() if v)
    lines = [
        '!!! info "Provenance"',
        f"    Generated {facts.get('date', '?')} from commit `{facts.get('commit') or 'unknown'}`"
        f" on {facts.get('machine', '?')} (Python {facts.get('python', '?')}"
        + (f", {facts['torch_threads']} torch thread(s)" if facts.get("torch_threads") else "") + ").",
        "",
        f"    Versions: {versions}.",
        "",
        f"    Command: `{facts.get('command', '?')}`",
    ]
    files = list(data_files)
    if files:
        lines += ["", "    Raw data: " + ", ".join(f"[{f}]({f})" for f in files)]
    return "\n".join(lines) + "\n"
