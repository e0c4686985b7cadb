"""Wall time of the README's test command (the conformance suite, ci profile, ``-n auto``), with the
files that take the most worker time; with ``--baseline``, side by side with another checkout's.

The target is the wall time a developer waits for, on this machine's cores. A shared machine makes a run
longer, never shorter, and one run can land on a busy minute: ``--runs N`` runs the suite N times and
reports the median with the fastest and slowest run. ``--baseline CHECKOUT`` (e.g. a ``git worktree`` at
an older commit, installed in its own environment: ``--baseline-python``) runs that checkout's suite
between this one's runs, so both see the same machine, and reports the ratio of the medians.

Each contender has a cache directory of its own (``XDG_CACHE_HOME``), kept across its runs and never the
machine's: its first run is a fresh checkout's, the later ones a developer's repeat runs, so a checkout that
caches work between runs gets that benefit in the median of three, as its users do.

Run: ``python -m tools.benchmarks.bench_suite_time [--device cpu] [--runs 3] [--baseline DIR
[--baseline-python PY]]``
"""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from tools.benchmarks import _common as C

ROOT = Path(__file__).resolve().parents[2]


def per_file_seconds(junit: Path) -> tuple[dict[str, float], int, list[str]]:
    """Worker seconds per test file (setup + call + teardown), the number of tests, and the failed tests
    (``module::name``): a slow run with failures is not a time of the suite."""
    by_file: collections.Counter = collections.Counter()
    tests, failed = 0, []
    for case in ET.parse(junit).getroot().iter("testcase"):
        tests += 1
        parts = case.get("classname", "?").split(".")  # package.test_module[.TestClass]
        module = next((p for p in parts if p.startswith("test_")), parts[-1])
        if any(child.tag in ("failure", "error") for child in case):
            failed.append(f"{module}.py::{case.get('name')}")
        by_file[module + ".py"] += float(case.get("time") or 0)
    return dict(by_file), tests, failed


def one_run(device: str, root: Path = ROOT, python: str = sys.executable, cache: Path | None = None) -> dict:
    """One run of the README's test command in ``root`` with ``cache`` as its XDG cache (default: a fresh
    one): wall time, tests, failed tests, worker seconds per file."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, RLCONFORM_PROFILE="ci", RLCONFORM_DEVICE=device, XDG_CACHE_HOME=str(cache or tmp),
                   RLCONFORM_SITE_TESTS="1")  # site tests in
        junit = Path(tmp) / "junit.xml"
        t0 = time.perf_counter()
        # SIGINT at its default, as from a terminal: a bench started in the background (nohup, ``&``) would hand
        # the suite SIGINT ignored, and its Ctrl-C tests would fail and time the wrong thing
        proc = subprocess.run([python, "-m", "pytest", "conformance_tests", "-q", "-n", "auto",
                               "-p", "no:cacheprovider", f"--junitxml={junit}"], cwd=root, env=env,
                              capture_output=True, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        wall = time.perf_counter() - t0
        if not junit.exists():
            sys.exit(f"the suite in {root} did not run (exit {proc.returncode}):\n"
                     f"{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
        by_file, tests, failed = per_file_seconds(junit)
    return {"wall_s": wall, "exit_code": proc.returncode, "tests": tests, "failed": len(failed),
            "failed_tests": failed, "by_file": by_file}


def commit(root: Path) -> str | None:
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or None if done.returncode == 0 else None


def summary(runs: list[dict]) -> dict:
    """The median run (the lower middle one: a real run) and the spread of all."""
    median = sorted(runs, key=lambda r: r["wall_s"])[(len(runs) - 1) // 2]
    top = sorted(median["by_file"].items(), key=lambda kv: -kv[1])[:8]
    return {"wall_s": median["wall_s"], "runs": len(runs), "wall_s_all": sorted(round(r["wall_s"], 1) for r in runs),
            "exit_code": max(r["exit_code"] for r in runs), "tests": median["tests"],
            "failed": max(r["failed"] for r in runs), "worker_s": sum(median["by_file"].values()),
            "failed_tests": sorted({t for r in runs for t in r.get("failed_tests", [])}),
            "slowest_files": [{"file": f, "worker_s": round(s, 1)} for f, s in top]}


def main(argv=None) -> dict:
    ap = C.parser(__doc__)
    ap.add_argument("--runs", type=int, default=1, help="run the suite this many times; the median run is reported")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another checkout whose suite runs between this one's runs (side by side)")
    ap.add_argument("--baseline-python", default=sys.executable,
                    help="the interpreter of the environment the baseline checkout is installed in")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if args.baseline is not None and not (args.baseline / "conformance_tests").is_dir():
        ap.error(f"--baseline {args.baseline} is not a checkout of this project (no conformance_tests/)")
    contenders = {"this": (ROOT, sys.executable)}
    if args.baseline is not None:
        contenders["baseline"] = (args.baseline.resolve(), args.baseline_python)
    runs: dict[str, list[dict]] = {name: [] for name in contenders}
    with tempfile.TemporaryDirectory(prefix="bench-suite-cache-") as caches:
        for k in range(args.runs):
            for name, (root, python) in contenders.items():  # interleaved: both see the same minutes of the machine
                runs[name].append(one_run(args.device, root, python, cache=Path(caches) / name))
                r = runs[name][-1]
                print(f"run {k + 1}/{args.runs} ({name}, {root}): {r['wall_s']:.0f} s wall, {r['tests']} tests, "
                      f"{r['failed']} failed" + (f": {', '.join(r['failed_tests'])}" if r["failed"] else ""),
                      flush=True)
    res = {"benchmark": "suite_time", "device": args.device, "workers": os.cpu_count(), "commit": commit(ROOT),
           **summary(runs["this"])}
    if args.baseline is not None:
        base = summary(runs["baseline"])
        res["baseline"] = {"commit": commit(args.baseline), **base}
        res["ratio_to_baseline"] = res["wall_s"] / base["wall_s"]
    path = C.write(f"suite_time_{args.device.split(':')[0]}", res, args.json)
    walls = res["wall_s_all"]
    spread = f" (median of {args.runs}: {walls[0]:.0f}-{walls[-1]:.0f} s)" if args.runs > 1 else ""
    print(f"conformance suite: {res['wall_s']:.0f} s wall{spread} on {os.cpu_count()} workers "
          f"({res['worker_s']:.0f} worker-s), {res['tests']} tests, {res['failed']} failed")
    if args.baseline is not None:
        b = res["baseline"]
        print(f"baseline {b['commit']}: {b['wall_s']:.0f} s wall ({b['tests']} tests); "
              f"ratio {res['ratio_to_baseline']:.2f}x")
    print(f"wrote {path}")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
