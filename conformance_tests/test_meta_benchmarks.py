"""Meta-tests of the performance page's rendering (tools/benchmarks/report.py): what a row says follows
the raw numbers, including the target's verdict."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.meta


def _suite(walls: list[float], failed: int = 0) -> dict:
    d = {"device": "cpu", "workers": 2, "tests": 1500, "failed": failed, "worker_s": 180.0,
         "wall_s": sorted(walls)[(len(walls) - 1) // 2],
         "slowest_files": [{"file": "test_meta_verdict.py", "worker_s": 40.0}]}
    if len(walls) > 1:
        d["wall_s_all"] = sorted(walls)
    return d


@pytest.mark.parametrize("walls, failed, shown, verdict", [
    ([97.4], 0, "97 s wall, 1500 tests", "met"),  # a file written before --runs: one run, no spread
    ([131.0, 96.0, 104.0], 0, "104 s wall, median of 3 runs (96-131 s)", "met"),
    ([118.0, 125.0, 122.0], 0, "122 s wall, median of 3 runs (118-125 s)", "**missed**"),
    ([90.0, 95.0, 99.0], 1, "95 s wall, median of 3 runs (90-99 s), 1500 tests, 1 failed", "**missed**"),
])
def test_the_suite_row_shows_the_median_its_spread_and_the_verdict(walls, failed, shown, verdict):
    from tools.benchmarks.report import suite_rows  # a checkout's tools/, not part of the installed package

    (row,) = suite_rows(_suite(walls, failed))
    assert shown in row[1]
    assert row[-1] == f"≤ 120 s: {verdict}"
