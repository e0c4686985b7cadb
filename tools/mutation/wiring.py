"""Hand-written mutants of the reference trainers' data path, each run against the trainers' wiring tests.

    python tools/mutation/wiring.py                   # every family's mutants
    python tools/mutation/wiring.py --family ppo      # wiring_mutants/ppo.yaml -> wiring_mutants/ppo.results.json
    python tools/mutation/wiring.py --family ppo --only mappo-   # those whose id starts with mappo-

mutmut mutates operators and constants; the bugs that ruin a trainer silently are wiring bugs (a done
flag lost before GAE, a mask stored one step late, the wrong episode's return), and mutmut's mutants of a
trainer are mostly its help strings. So these are written by hand, one plausible bug each, in
``wiring_mutants/<family>.yaml``; each family's verdicts go to ``wiring_mutants/<family>.results.json``.

Like run.py, this never mutates the working tree: it copies the repository into a scratch directory,
writes one mutant at a time there, and runs that trainer's wiring tests from it (``python -m pytest``
imports the copy's reference_impl first). A mutant is killed when the tests fail (a crash counts: the
trainer cannot run with the bug). The unmutated copy must pass first, or nothing is run.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MUTANTS = HERE / "wiring_mutants"  # <family>.yaml: the mutants; <family>.results.json: their verdicts
COPY_ITEMS = ("reference_impl", "conformance_tests", "spec", "tools", "pyproject.toml", "setup.py")
TIMEOUT_S = 900  # a mutant that hangs the tests this long is detected, as mutmut counts a timeout


def families(folder: Path = MUTANTS) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml"))


def load(family: str, folder: Path = MUTANTS) -> dict:
    return yaml.safe_load((folder / f"{family}.yaml").read_text())


def results_path(family: str, folder: Path = MUTANTS) -> Path:
    return folder / f"{family}.results.json"


def load_results(family: str, folder: Path = MUTANTS) -> dict:
    """The family's recorded verdicts ({"updated": ..., "mutants": {id: verdict}}), empty if never run."""
    path = results_path(family, folder)
    return json.loads(path.read_text()) if path.exists() else {"updated": None, "mutants": {}}


def edits(mutant: dict) -> list[list[str]]:
    """A mutant's text replacements, [[old, new], ...]: its ``old``/``new``, or its ``edits`` (a bug written in
    several places, e.g. a value computed once and then used in the wrong spot)."""
    return [[e["old"], e["new"]] for e in mutant["edits"]] if "edits" in mutant else [[mutant["old"], mutant["new"]]]


def apply(mutant: dict, text: str) -> str:
    for old, new in edits(mutant):
        text = text.replace(old, new)
    return text


def problems(spec: dict, repo: Path = REPO) -> list[str]:
    """What makes a family's mutant file unusable against this tree: an ``old`` text that is not exactly once in its
    file (the trainer changed under the mutant), a no-op mutant, a repeated id, a missing test file."""
    out, seen = [], set()
    for m in spec["mutants"]:
        if m["id"] in seen:
            out.append(f"{m['id']}: the id is used twice")
        seen.add(m["id"])
        text = (repo / m["file"]).read_text()
        for old, new in edits(m):
            if text.count(old) != 1:
                out.append(f"{m['id']}: its old text occurs {text.count(old)} times in {m['file']}, not once")
            if old == new:
                out.append(f"{m['id']}: old and new are the same")
        tests = spec["tests"].get(m["file"])
        if not tests:
            out.append(f"{m['id']}: no wiring tests are configured for {m['file']}")
        out += [f"{m['id']}: no test file {t}" for t in tests or () if not (repo / "conformance_tests" / t).exists()]
    return out


def copy_repo(dest: Path) -> None:
    for item in COPY_ITEMS:
        src = REPO / item
        if src.is_dir():
            shutil.copytree(src, dest / item, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "site"))
        elif src.exists():
            shutil.copy2(src, dest / item)


def run_tests(tree: Path, tests: list[str], select: str | None = None) -> tuple[bool, str, float]:
    """(passed, the first failing test or the reason, seconds) of the wiring tests run from ``tree``
    (``select``: a pytest ``-k`` expression, for a mutant that only some of a slow file's tests can reach)."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--tb=no", "-rfE",
           *(["-k", select] if select else []), *(f"conformance_tests/{t}" for t in tests)]
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, f"timeout after {TIMEOUT_S} s", time.time() - t0
    failed = [ln.split(" ", 1)[1].split(" - ")[0] for ln in proc.stdout.splitlines()
              if ln.startswith(("FAILED", "ERROR"))]
    reason = failed[0] if failed else (proc.stdout.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return proc.returncode == 0, reason, time.time() - t0


def run_family(family: str, only: str = "") -> int:
    """Run one family's mutants (those whose id starts with ``only``); 0 all killed, 1 a survivor, 2 unusable."""
    spec = load(family)
    bad = problems(spec)
    if bad:
        print(f"{family}.yaml does not match the tree:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 2
    chosen = [m for m in spec["mutants"] if m["id"].startswith(only)]
    if not chosen:
        print(f"{family}: no mutant id starts with {only!r}", file=sys.stderr)
        return 2
    ids = {m["id"] for m in spec["mutants"]}
    results = {k: v for k, v in load_results(family)["mutants"].items() if k in ids}  # drop removed mutants
    with tempfile.TemporaryDirectory(prefix="rlconform-wiring-") as tmp:
        tree = Path(tmp)
        copy_repo(tree)
        for file in dict.fromkeys(m["file"] for m in chosen):
            ok, reason, secs = run_tests(tree, spec["tests"][file])
            if not ok:
                print(f"the wiring tests of {file} fail on the unmutated tree ({reason}); nothing run", file=sys.stderr)
                return 2
            print(f"baseline of {file}: green in {secs:.0f} s", flush=True)
        for m in chosen:
            path = tree / m["file"]
            original = path.read_text()
            path.write_text(apply(m, original))
            try:
                passed, reason, secs = run_tests(tree, spec["tests"][m["file"]], m.get("select"))
            finally:
                path.write_text(original)
            results[m["id"]] = {"file": m["file"], "bug": m["bug"], "edits": edits(m), "select": m.get("select"),
                                "verdict": "survived" if passed else "killed",
                                "killed_by": None if passed else reason, "seconds": round(secs, 1)}
            print(f"{m['id']}: {results[m['id']]['verdict']}" + ("" if passed else f" by {reason}"), flush=True)
    out = results_path(family)
    out.write_text(json.dumps({"updated": f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
                               "mutants": results}, indent=1, ensure_ascii=False) + "\n")
    survived = [k for k, v in results.items() if v["verdict"] == "survived"]
    print(f"wrote {out.relative_to(REPO)}: {len(results) - len(survived)} of {len(results)} killed"
          + (f"; survived: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=families(), help="one family's mutants (default: every family)")
    ap.add_argument("--only", default="", help="run only the mutants whose id starts with this")
    args = ap.parse_args(argv)
    chosen = [args.family] if args.family else [
        f for f in families() if any(m["id"].startswith(args.only) for m in load(f)["mutants"])]
    if not chosen:
        ap.error(f"no mutant id starts with {args.only!r}")
    return max(run_family(f, args.only) for f in chosen)


if __name__ == "__main__":
    sys.exit(main())
