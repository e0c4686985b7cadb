"""The SAC results page (docs/results/sac/): the n-gram ceiling, re-evaluation and supervised probes, the plot,
and ``build``, which writes the page's figures from a finished suite of ``python -m rlconform.golive``."""
from __future__ import annotations

import sys
from typing import Callable


def run_positional(main: Callable[..., object], doc: str, lo: int, hi: int | None = None) -> None:
    """``main(*argv)`` for a script that takes ``lo`` to ``hi`` positional arguments: its docstring is the usage,
    printed on -h/--help (exit 0) or on a wrong count (exit 2)."""
    args = sys.argv[1:]
    asked = bool({"-h", "--help"} & set(args))
    if asked or not lo <= len(args) <= (lo if hi is None else hi):
        print(doc.strip(), file=sys.stdout if asked else sys.stderr)
        sys.exit(0 if asked else 2)
    main(*args)
