"""Wall time of the README's test command (the conformance suite, ci profile, ``-n auto``), with the
files that take the most worker time.

Not a ratio: the target is the wall time a developer waits for, on this machine's cores. A shared
machine makes a run longer, never shorter, and one run can land on a busy minute: ``--runs N`` runs the
suite N times, one after another, and reports the median with the fastest and slowest run.

Run: ``python -m tools.benchmarks.bench_suite_time [--device cpu] [--runs 3]``
"""
from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from tools.benchmarks import _common as C

ROOT = Path(__file__).resolve().parents[2]


def per_file_seconds(junit: Path) -> tuple[dict[str, float], int, int]:
    """Worker seconds per test file (setup + call + teardown), the number of tests, and of failures."""
    by_file: collections.Counter = collections.Counter()
    tests = failed = 0
    for case in ET.parse(junit).getroot().iter("testcase"):
        tests += 1
        failed += any(child.tag in ("failure", "error") for child in case)
        parts = case.get("classname", "?").split(".")  # package.test_module[.TestClass]
        module = next((p for p in parts if p.startswith("test_")), parts[-1])
        by_file[module + ".py"] += float(case.get("time") or 0)
    return dict(by_file), tests, failed


def one_run(device: str) -> dict:
    """One cold run of the README's test command: wall time, tests, failures, worker seconds per file."""
    with tempfile.TemporaryDirectory() as tmp:
        # as a fresh checkout runs it: no collection cached by earlier runs (XDG_CACHE_HOME), site tests in
        env = dict(os.environ, RLCONFORM_PROFILE="ci", RLCONFORM_DEVICE=device, XDG_CACHE_HOME=tmp,
                   RLCONFORM_SITE_TESTS="1")
        junit = Path(tmp) / "junit.xml"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", "conformance_tests", "-q", "-n", "auto",
                               "-p", "no:cacheprovider", f"--junitxml={junit}"], cwd=ROOT, env=env,
                              capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if not junit.exists():
            sys.exit(f"the suite did not run (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
        by_file, tests, failed = per_file_seconds(junit)
    return {"wall_s": wall, "exit_code": proc.returncode, "tests": tests, "failed": failed, "by_file": by_file}


def main(argv=None) -> dict:
    ap = C.parser(__doc__)
    ap.add_argument("--runs", type=int, default=1, help="run the suite this many times; the median run is reported")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    runs = []
    for k in range(args.runs):
        runs.append(one_run(args.device))
        print(f"run {k + 1}/{args.runs}: {runs[-1]['wall_s']:.0f} s wall, {runs[-1]['failed']} failed", flush=True)
    walls = sorted(r["wall_s"] for r in runs)
    median = sorted(runs, key=lambda r: r["wall_s"])[(len(runs) - 1) // 2]  # a real run (the lower middle one)
    by_file = median["by_file"]
    top = sorted(by_file.items(), key=lambda kv: -kv[1])[:8]
    res = {"benchmark": "suite_time", "device": args.device, "wall_s": median["wall_s"],
           "runs": len(runs), "wall_s_all": [round(w, 1) for w in walls],
           "exit_code": max(r["exit_code"] for r in runs), "tests": median["tests"],
           "failed": max(r["failed"] for r in runs), "workers": os.cpu_count(), "worker_s": sum(by_file.values()),
           "slowest_files": [{"file": f, "worker_s": round(s, 1)} for f, s in top]}
    path = C.write(f"suite_time_{args.device.split(':')[0]}", res, args.json)
    spread = f" (median of {len(runs)}: {walls[0]:.0f}-{walls[-1]:.0f} s)" if len(runs) > 1 else ""
    print(f"conformance suite: {res['wall_s']:.0f} s wall{spread} on {os.cpu_count()} workers "
          f"({res['worker_s']:.0f} worker-s), {res['tests']} tests, {res['failed']} failed\nwrote {path}")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
