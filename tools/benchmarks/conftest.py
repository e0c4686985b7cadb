"""Collects the medians of paired benchmarks and prints their ratio at the end of the run.

Benchmarks ask for the ``record_median`` fixture (conftest modules are not imported by name, so the
shared state lives here and reaches the tests through the fixture).
"""
from __future__ import annotations

import pytest

MEDIANS: dict[str, float] = {}  # key -> median seconds (scaled when a variant ran on fewer rows)
PAIRS: dict[str, tuple[str, str]] = {}  # label -> (slow key, fast key)


@pytest.fixture
def record_median():
    def record(key: str, benchmark, *, scale: float = 1.0, pair: tuple[str, str, str] | None = None) -> None:
        stats = getattr(benchmark, "stats", None)
        if stats is not None and getattr(stats, "stats", None) is not None:
            MEDIANS[key] = stats.stats.median * scale
        if pair is not None:
            PAIRS[pair[0]] = (pair[1], pair[2])
    return record


def pytest_terminal_summary(terminalreporter):
    lines = [f"{label}: median {slow} / median {fast} = {MEDIANS[slow]:.4g} s / {MEDIANS[fast]:.4g} s "
             f"= {MEDIANS[slow] / MEDIANS[fast]:.2f}x"
             for label, (slow, fast) in PAIRS.items() if slow in MEDIANS and fast in MEDIANS]
    if lines:
        terminalreporter.write_sep("-", "speed-up ratios (measured in this run)")
        for ln in lines:
            terminalreporter.write_line(ln)


def pytest_collect_file(file_path, parent):
    """Collect ``bench_*.py`` here (pytest's default pattern is ``test_*.py``)."""
    if file_path.suffix == ".py" and file_path.name.startswith("bench_"):
        return pytest.Module.from_parent(parent, path=file_path)
    return None
