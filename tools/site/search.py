"""The search index after the build: previews as plain text (TeX written out in Unicode). Chinese is segmented
by the search plugin itself (jieba, configured in mkdocs.yml)."""
from __future__ import annotations

import json
from pathlib import Path

from tools.site.markup import math_to_text


def clean_search_index(site_dir: Path) -> int:
    """Search previews as plain text: TeX written out in Unicode; returns the number of entries changed."""
    path = site_dir / "search" / "search_index.json"
    if not path.is_file():
        return 0
    index = json.loads(path.read_text(encoding="utf-8"))
    changed = 0
    for entry in index.get("docs", []):
        for key in ("title", "text"):
            old = entry.get(key, "")
            new = math_to_text(old)
            if new != old:
                entry[key] = new
                changed += 1
    path.write_text(json.dumps(index, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    return changed
