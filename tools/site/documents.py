"""The source documents the spec is written from (``docs/assets/documents.yaml``): their anchors on the
Documents page, their short names, citations of their sections, and seed file names turned into links."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from tools.site.env import REPO
from tools.site.markup import outside_fences, plain, rel, text

DOCUMENTS_PAGE = "spec/documents.md"
DOCUMENTS_FILE = "assets/documents.yaml"  # under docs/: title, version, date, role, headings in order


def load_documents(docs_dir: Path | None = None) -> dict[str, dict]:
    """seed file name -> its entry in ``docs/assets/documents.yaml`` (empty when the file is absent)."""
    import yaml

    path = Path(docs_dir or REPO / "docs") / DOCUMENTS_FILE
    key = str(path)
    if key not in _DOC_CACHE:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}
        _DOC_CACHE[key] = {d["seed"]: d for d in (raw or {}).get("documents", [])}
    return _DOC_CACHE[key]


_DOC_CACHE: dict[str, dict] = {}


def doc_anchor(seed: str, section: str | None = None) -> str:
    """``doc-004`` for a document, ``doc-004-s7`` for its 8th heading (the headings' order is the file's)."""
    base = f"doc-{seed[:3]}"
    doc = load_documents().get(seed)
    if section is None or doc is None or section not in doc["sections"]:
        return base
    return f"{base}-s{doc['sections'].index(section)}"


def doc_name(seed: str) -> str:
    doc = load_documents().get(seed)
    return doc["short"] if doc else seed


def cite(src: Mapping[str, str], from_page: str) -> str:
    """A source as a link to its section on the Documents page: ``[CCAPO v4.1 § 7.2 …](…#doc-004-s21)``."""
    section = plain(src.get("section", ""))
    label = f"{doc_name(src['seed'])}" + (f" § {section}" if section else "")
    if src["seed"] not in load_documents():
        return f"`{src['seed']}`" + (f" § {text(section)}" if section else "")
    return f"[{text(label)}]({rel(from_page, DOCUMENTS_PAGE)}#{doc_anchor(src['seed'], src.get('section'))})"


def section_order(seed: str, section: str) -> tuple:
    """Sort key putting a document's sections in the document's own order (unknown ones last)."""
    doc = load_documents().get(seed)
    if doc and section in doc["sections"]:
        return (0, doc["sections"].index(section), "")
    return (1, 0, section)


_SEED_FILE = re.compile(r"`?\b(\d{3}_[0-9a-f]{16}\.txt)\b`?")


def link_seed_files(markdown: str, from_page: str) -> str:
    """Any seed file name (``004_7fb0ad4f8a70eeae.txt``) outside code becomes its document's name, linked."""
    def sub(m: re.Match) -> str:
        seed = m.group(1)
        if seed not in load_documents():
            return m.group(0)
        return f"[{text(doc_name(seed))}]({rel(from_page, DOCUMENTS_PAGE)}#{doc_anchor(seed)})"

    return outside_fences(markdown, lambda p: _SEED_FILE.sub(sub, p))

