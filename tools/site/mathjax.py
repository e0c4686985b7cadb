"""MathJax 3, copied into the site from the ``django-static-mathjax`` package (or $RLCONFORM_MATHJAX_DIR), so
the pages typeset formulas offline."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Iterable

MATHJAX_ENV = "RLCONFORM_MATHJAX_DIR"
# What the site needs from MathJax 3's es5 build: the combined TeX->CommonHTML component, the TeX
# extensions it autoloads, its fonts, and the menu/a11y components it loads lazily.
MATHJAX_PARTS = ("tex-chtml.js", "input/tex/extensions", "output/chtml/fonts/woff-v2", "ui", "a11y")


def mathjax_dir() -> Path:
    """MathJax 3's es5 directory: $RLCONFORM_MATHJAX_DIR, else the django-static-mathjax package's copy."""
    env = os.environ.get(MATHJAX_ENV)
    candidates = [Path(env)] if env else []
    spec = importlib.util.find_spec("mathjax")
    if spec and spec.origin:
        candidates.append(Path(spec.origin).parent / "static" / "mathjax" / "es5")
    for c in candidates:
        if (c / "tex-chtml.js").is_file():
            return c
    raise RuntimeError(
        "MathJax 3 not found: `pip install django-static-mathjax` (it ships MathJax's es5 build; "
        f"it is in rlconform's `docs` extra), or point ${MATHJAX_ENV} at an es5 directory "
        "(e.g. from `npm pack mathjax@3`).")


def mathjax_files(root: Path) -> Iterable[tuple[str, Path]]:
    for part in MATHJAX_PARTS:
        p = root / part
        paths = [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file())
        for q in paths:
            yield "assets/mathjax/" + str(q.relative_to(root)).replace(os.sep, "/"), q
