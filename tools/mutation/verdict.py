"""mutmut's test command: pytest, every failing exit folded into 1.

    python -m tools.mutation.verdict -x -q conformance_tests/test_ppo_losses.py

mutmut 2.5 counts a mutant as killed only when its test command exits 1 (``tests_pass`` is
``returncode != 1``). pytest exits 2 when a test file fails to import, which is how a mutant that breaks
the module's syntax or its import-time code shows (4 and 5 are a usage error and no tests collected).
Each of those is a mutant the tests detected, so each becomes 1 here. Run with ``-m`` from the snapshot's
root, as ``python -m pytest`` is, so that the snapshot's packages are the ones imported.
"""
from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    import pytest

    return 0 if pytest.main(argv) == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
