"""Mutation testing of the reference's math modules with mutmut, the conformance suite as the test command.

    nice -n 19 python tools/mutation/run.py                       # every module in config.yaml, in order
    nice -n 19 python tools/mutation/run.py --modules reference_impl/sac/losses.py --until 18:05
    nice -n 19 python tools/mutation/run.py --sync-paths conformance_tests/test_sac_losses.py
    python tools/mutation/run.py --export-only                    # rewrite results.json from the cache
    python tools/mutation/run.py --verify-kills                   # survivors that new tests kill -> verified.json
    python tools/mutation/render.py                               # docs/mutation/index.md from results.json

Needs ``pip install mutmut==2.5.1 torch==2.13.0`` and the package installed (``pip install -e .``): mutmut 2
runs a shell-free test command per mutant, a fresh pytest (through verdict.py) that imports the snapshot,
where mutmut has just written the mutant. mutmut counts a mutant killed only on exit 1; verdict.py folds
pytest's other failing exits into 1, so a mutant that no longer imports counts as detected.

Never run ``mutmut show`` or ``mutmut results`` in a snapshot while a run is going on: they re-read the
file mutmut has just mutated into the cache's line table, and the run then fails on its next mutant. Read
the cache with ``--export-only`` (or :func:`read_cache`) instead.

mutmut 2 mutates files in place, and several people share this working tree, so the driver never
mutates it: it copies the repository into a snapshot (``--workdir``, default
``$TMPDIR/rlconform-mutation``) and runs mutmut there. The snapshot is made once and refreshed only with
``--sync``, so a half-edited tree elsewhere cannot break a long run.

Resumable: mutmut records each mutant's verdict in the snapshot's ``.mutmut-cache`` (SQLite) as soon as
it is known and never re-tests a killed mutant; survivors are re-tested when the tests change (after
``--sync`` brings a new test in). A crash mid-mutant leaves ``X.py.bak`` beside the mutated file, which the
next start restores. ``results.json`` beside this file is rewritten every ``--every`` seconds while a
module runs and when it ends, so nothing that finished is lost.

Each module is tested only with its own family's test files (config.yaml), under the ci hypothesis
profile, with ``-x``: a mutant is killed by its first failing test. Before mutating a module the driver
runs that module's test command once on the unmutated snapshot and refuses to go on if it fails (a red
baseline would count every mutant as killed), and gives mutmut that run's time as the module's baseline:
mutmut keeps a single one per cache and stops a mutant's tests after 10x it, so a module with slower tests
than the snapshot's first would have its mutants, killed and surviving alike, recorded as timeouts.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CONFIG = HERE / "config.yaml"
RESULTS = HERE / "results.json"
# What the snapshot needs to import the package and run the suite (the docs are not needed).
SNAPSHOT_ITEMS = ("reference_impl", "conformance_tests", "spec", "tools", "pyproject.toml", "setup.py")
# mutmut's status names, and what the score calls them. A timeout is a detected mutant (it hung the test).
STATUS = {"ok_killed": "killed", "bad_timeout": "timeout", "ok_suspicious": "killed",
          "bad_survived": "survived", "skipped": "skipped", "untested": "untested"}
DETECTED = ("killed", "timeout")


def log(msg: str) -> None:
    print(f"[{dt.datetime.now(dt.timezone.utc):%H:%M:%S}] {msg}", flush=True)


def load_config(path: Path = CONFIG) -> dict:
    return yaml.safe_load(path.read_text())


def _ignore(_dir, names):
    return [n for n in names if n in ("__pycache__", ".mutmut-cache", "site") or n.endswith((".bak", ".pyc"))]


def sync_snapshot(tree: Path) -> None:
    """Copy the working tree into the snapshot (files only added or overwritten; the cache is kept)."""
    tree.mkdir(parents=True, exist_ok=True)
    for item in SNAPSHOT_ITEMS:
        src = REPO / item
        if src.is_dir():
            shutil.copytree(src, tree / item, ignore=_ignore, dirs_exist_ok=True)
        elif src.exists():
            shutil.copy2(src, tree / item)
    shutil.copy2(HERE / "mutmut_config.py", tree / "mutmut_config.py")
    log(f"snapshot synced from {REPO} into {tree}")


def restore_backups(tree: Path) -> None:
    """Undo a mutant left on disk by a crash: mutmut keeps the original as X.py.bak while it tests X.py."""
    for bak in (tree / "reference_impl").rglob("*.py.bak"):
        shutil.move(bak, bak.with_suffix(""))
        log(f"restored {bak.with_suffix('').relative_to(tree)} from a crashed run's backup")


def test_files(cfg: dict, module: str, tree: Path) -> list[str]:
    return list(dict.fromkeys(f"conformance_tests/{f}" for f in cfg["modules"][module]))


def pytest_command(cfg: dict, tests: list[str]) -> list[str]:
    """pytest through verdict.py, which exits 1 for any failing exit: mutmut counts only exit 1 as a kill,
    and a mutant that breaks the module's import makes pytest exit 2."""
    return [sys.executable, "-m", "tools.mutation.verdict", *cfg["pytest_args"], *tests]


def runner(cfg: dict, module: str, tree: Path) -> str:
    """The test command: pytest on the module's test files, in the snapshot."""
    return shlex.join(pytest_command(cfg, test_files(cfg, module, tree)))


def env_for(cfg: dict) -> dict:
    env = dict(os.environ, **{k: str(v) for k, v in cfg.get("env", {}).items()})
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def fingerprint(tree: Path, module: str, files: list[str]) -> str:
    h = hashlib.sha256()
    for rel in [module, *files, "conformance_tests/conftest.py"]:
        p = tree / rel
        h.update(rel.encode() + (p.read_bytes() if p.exists() else b""))
    return h.hexdigest()[:16]


def baseline(cfg: dict, module: str, tree: Path, state: dict) -> float | None:
    """The module's test command must pass on the unmutated snapshot: its wall time in seconds (cached per
    content fingerprint), or None when it fails."""
    files = test_files(cfg, module, tree)
    key = f"{module}:{fingerprint(tree, module, files)}"
    cached = state.get("baselines", {}).get(key)
    if isinstance(cached, float):  # an older state recorded only True: measured again, for the time
        return cached
    log(f"baseline for {module}: {runner(cfg, module, tree)}")
    t0 = time.monotonic()
    proc = subprocess.run(shlex.split(runner(cfg, module, tree)), cwd=tree, env=env_for(cfg),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        log(f"baseline FAILED for {module} (exit {proc.returncode}); not mutating it:\n{proc.stdout[-3000:]}")
        return None
    seconds = time.monotonic() - t0
    log(f"baseline ok in {seconds:.0f}s")
    state.setdefault("baselines", {})[key] = seconds
    return seconds


def set_mutmut_baseline(tree: Path, seconds: float) -> None:
    """Make ``seconds`` the baseline time mutmut reads from its cache. mutmut keeps one per cache (the first
    module's) and stops a mutant's tests after 10x it as a timeout, which counts as detected: a module whose
    tests run longer than the first one's would have killed and surviving mutants alike reported as timeouts.
    A fresh snapshot has no cache yet; mutmut then measures this module's baseline itself."""
    db = tree / ".mutmut-cache"
    if not db.exists():
        return
    con = sqlite3.connect(db)
    with con:
        con.execute("INSERT OR REPLACE INTO MiscData (key, value) VALUES ('baseline_time_elapsed', ?)", (str(seconds),))
    con.close()


# ----------------------------------------------------------------------------- the cache, read directly

def read_cache(tree: Path) -> dict[str, list[dict]]:
    """Every mutant mutmut knows, per file: line number, source line, index on the line, status."""
    db = tree / ".mutmut-cache"
    if not db.exists():
        return {}
    for _ in range(10):
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
            rows = con.execute(
                "SELECT m.id, s.filename, l.line_number, l.line, m.`index`, m.status FROM Mutant m "
                "JOIN Line l ON m.line = l.id JOIN SourceFile s ON l.sourcefile = s.id "
                "ORDER BY s.filename, l.line_number, m.`index`").fetchall()
            con.close()
            break
        except sqlite3.OperationalError:
            time.sleep(2)
    else:
        return {}
    out: dict[str, list[dict]] = {}
    for pk, filename, line_number, line, index, status in rows:
        out.setdefault(filename, []).append({
            "pk": pk, "id": f"{filename.removeprefix('reference_impl/')}:{line_number + 1}:{index}",
            "line_number": line_number + 1, "line": line.strip(), "raw_line": line, "index": index,
            "status": STATUS.get(status, status)})
    return out


def forget(tree: Path, module: str) -> None:
    """Drop a module's verdicts from mutmut's cache, so the next run tests every mutant again."""
    con = sqlite3.connect(tree / ".mutmut-cache")
    with con:
        con.execute("DELETE FROM Mutant WHERE line IN (SELECT l.id FROM Line l JOIN SourceFile s ON l.sourcefile = s.id "
                    "WHERE s.filename = ?)", (module,))
    con.close()
    log(f"forgot every verdict of {module}")


def mutant_diff(tree: Path, filename: str, line_number: int, index: int, line: str) -> str:
    """The mutated line, as mutmut makes it (computed, not applied: the snapshot stays untouched)."""
    from mutmut import Context, RelativeMutationID, mutate

    path = tree / filename
    backup = path.with_name(path.name + ".bak")  # while mutmut tests a mutant, the original is here
    source = (backup if backup.exists() else path).read_text()
    ctx = Context(source=source, filename=filename, dict_synonyms=[],
                  mutation_id=RelativeMutationID(line=line, index=index, line_number=line_number - 1))
    mutated, n = mutate(ctx)
    if not n:
        return ""
    new = mutated.splitlines()[line_number - 1].strip() if len(mutated.splitlines()) >= line_number else ""
    return f"- {line.strip()}\n+ {new}"


def function_spans(source: str, names) -> dict[str, tuple[int, int]]:
    """1-based (first, last) line of each named top-level function."""
    import ast

    return {n.name: (n.lineno, n.end_lineno) for n in ast.parse(source).body
            if isinstance(n, ast.FunctionDef) and n.name in names}


def export(cfg: dict, tree: Path, selected: list[str], *, path: Path = RESULTS) -> dict:
    cache = read_cache(tree)
    old = json.loads(path.read_text()) if path.exists() else {}
    modules = {}
    for module in cfg["modules"]:
        mutants = cache.get(module)
        if not mutants:
            modules[module] = old.get("modules", {}).get(module) or {"state": "not run", "mutants": []}
            continue
        outside = (cfg.get("outside_spec") or {}).get(module) or {}
        if outside:
            src = tree / module
            bak = src.with_name(src.name + ".bak")
            spans = function_spans((bak if bak.exists() else src).read_text(), outside)
        for m in mutants:
            if outside:
                fn = next((f for f, (a, b) in spans.items() if a <= m["line_number"] <= b), None)
                if fn:
                    m["status"], m["outside_spec"] = "outside spec", f"{fn}: {outside[fn].strip()}"
            raw = m.pop("raw_line")
            if m["status"] in ("survived", "timeout"):
                m["diff"] = mutant_diff(tree, module, m["line_number"], m["index"], raw)
            m.pop("pk")
        counts = {s: sum(m["status"] == s for m in mutants)
                  for s in ("killed", "timeout", "survived", "skipped", "untested", "outside spec")}
        modules[module] = {"state": "complete" if counts["untested"] == 0 else "partial",
                           "tests": test_files(cfg, module, tree), "counts": counts, "mutants": mutants}
    data = {"tool": cfg["tool"], "profile": cfg.get("env", {}).get("RLCONFORM_PROFILE"),
            "pytest_args": cfg["pytest_args"],
            "updated": f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}", "modules": modules}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)  # atomic: a crash never leaves a half-written results file
    return data


def progress(cache: dict, module: str) -> str:
    ms = cache.get(module, [])
    c = {s: sum(m["status"] == s for m in ms) for s in ("killed", "timeout", "survived", "skipped", "untested")}
    done = len(ms) - c["untested"]
    return (f"{module}: {done}/{len(ms)} tested — killed {c['killed']}, timeout {c['timeout']}, "
            f"survived {c['survived']}, skipped {c['skipped']}")


# ----------------------------------------------------------------------------- verifying new tests
VERIFIED = HERE / "verified.json"


def locate_line(source: str, line: str, line_number: int) -> dict | None:
    """The mutmut line record of ``line`` (stripped text) in ``source``: the occurrence nearest
    ``line_number`` (1-based), since a claim's number goes stale when lines above it move."""
    lines = source.splitlines()
    hits = [i + 1 for i, raw in enumerate(lines) if raw.strip() == line.strip()]
    if not hits:
        return None
    n = min(hits, key=lambda h: abs(h - line_number))
    return {"raw_line": lines[n - 1], "line_number": n}


def verify_kills(cfg: dict, tree: Path, workdir: Path) -> dict:
    """Check each survivor that classification.yaml says a new test kills: in a scratch copy of the
    snapshot, the named test must pass on the original module and fail (exit 1) on the mutant.
    Results go to verified.json ({mutant id: {"test", "original", "mutant", "killed"}}); a claim checked with
    another test than it names now is checked again, and checks of claims no longer made are dropped. The
    mutant is rebuilt from the snapshot's cache, or, where it has none for the module, from the claim's line
    in the module. mutmut's cache is left alone (its next full run re-tests every survivor anyway)."""
    from mutmut import Context, RelativeMutationID, mutate

    entries = [e for e in (yaml.safe_load((HERE / "classification.yaml").read_text()) or {}).get("mutants") or []
               if e.get("status") == "killed"]
    scratch = workdir / "verify"
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(tree, scratch, ignore=_ignore)
    for bak in (tree / "reference_impl").rglob("*.py.bak"):  # the copy must not carry mutmut's live mutant
        shutil.copy2(bak, scratch / bak.with_suffix("").relative_to(tree))
    done = json.loads(VERIFIED.read_text()) if VERIFIED.exists() else {}
    claimed = {e["id"] for e in entries}
    for gone in sorted(set(done) - claimed):  # a claim classification.yaml no longer makes: its check is moot
        log(f"verify: {gone} is no longer claimed killed; dropped from verified.json")
        del done[gone]
    cache = read_cache(tree)
    for e in entries:
        old = done.get(e["id"])
        if old and old.get("killed") and old["test"] == e["test"] and old["line"] == e["line"].strip():
            continue  # checked already (delete verified.json to check everything again)
        module = "reference_impl/" + e["id"].split(":")[0]
        index = int(e["id"].rsplit(":", 1)[1])
        same = [m for m in cache.get(module, []) if m["line"] == e["line"].strip() and m["index"] == index]
        line_number = int(e["id"].split(":")[1])  # a line's text may repeat in a module: its number decides
        path = tree / module
        backup = path.with_name(path.name + ".bak")
        mutant = next((m for m in same if m["line_number"] == line_number), same[0] if same else None)
        if mutant is None:  # no cache for this module here: the claim names its line, so find it in the source
            mutant = locate_line((backup if backup.exists() else path).read_text(), e["line"], line_number)
        if mutant is None:
            log(f"verify: {e['id']}: its line is neither in the cache nor in {module}; skipped")
            continue
        test_file = e["test"].split("::")[0]
        shutil.copy2(REPO / test_file, scratch / test_file)  # the new test as it is in the working tree now
        shutil.copy2(HERE / "verdict.py", scratch / "tools" / "mutation" / "verdict.py")
        cmd = pytest_command(cfg, [e["test"]])

        def run_test(source: str) -> int:
            (scratch / module).write_text(source)
            return subprocess.run(cmd, cwd=scratch, env=env_for(cfg), capture_output=True).returncode

        for _ in range(3):  # a read that raced mutmut writing a mutant shows as a red original: read again
            original = (backup if backup.exists() else path).read_text()
            rc_orig = run_test(original)
            if rc_orig == 0:
                break
            time.sleep(3)
        mid = RelativeMutationID(line=mutant["raw_line"], index=index, line_number=mutant["line_number"] - 1)
        mutated, n = mutate(Context(source=original, mutation_id=mid, filename=module, dict_synonyms=[]))
        rc_mut = run_test(mutated) if n else 0
        (scratch / module).write_text(original)
        killed = rc_orig == 0 and rc_mut == 1
        done[e["id"]] = {"test": e["test"], "line": e["line"].strip(), "original_exit": rc_orig, "mutant_exit": rc_mut,
                         "killed": killed, "checked": f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}"}
        log(f"verify {e['id']}: original exit {rc_orig}, mutant exit {rc_mut} -> {'KILLED' if killed else 'NOT killed'}")
        VERIFIED.write_text(json.dumps(done, indent=1, ensure_ascii=False) + "\n")
    return done


# ----------------------------------------------------------------------------- running

def past(until: dt.datetime | None) -> bool:
    return until is not None and dt.datetime.now(dt.timezone.utc) >= until


def run_module(cfg: dict, module: str, tree: Path, logdir: Path, *, until, every: float, selected) -> int:
    cmd = ["mutmut", "run", "--paths-to-mutate", module, "--tests-dir", "conformance_tests",
           "--runner", runner(cfg, module, tree), "--simple-output", "--no-progress",
           "--test-time-multiplier", str(cfg["test_time_multiplier"]),
           "--test-time-base", str(cfg["test_time_base"])]
    logdir.mkdir(parents=True, exist_ok=True)
    logfile = logdir / (module.replace("/", "_") + ".log")
    log(f"mutating {module} (log: {logfile})")
    with open(logfile, "a") as out:
        out.write(f"\n=== {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M:%S} {shlex.join(cmd)}\n")
        out.flush()
        # mutmut and its test runs get a process group of their own, so a stop ends exactly them
        proc = subprocess.Popen(cmd, cwd=tree, env=env_for(cfg), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        _RUNNING[:] = [proc, tree]
        last = time.monotonic()
        while proc.poll() is None:
            time.sleep(5)
            if past(until):
                log(f"deadline reached: stopping {module} (the mutant in flight stays untested)")
                stop_child()
                break
            if time.monotonic() - last >= every:
                last = time.monotonic()
                log(progress(read_cache(tree), module))
                export(cfg, tree, selected)
    log(progress(read_cache(tree), module))
    export(cfg, tree, selected)
    return proc.returncode if proc.returncode is not None else -1


_RUNNING: list = []  # [the mutmut process, the snapshot] while a module runs


def stop_child() -> None:
    """End the running mutmut (its whole process group) and put back the file it had mutated."""
    if not _RUNNING:
        return
    proc, tree = _RUNNING
    # SIGKILL at once: a mutmut that got time to react could record the interrupted run as a kill
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1)
    restore_backups(tree)


def _on_signal(signum, _frame):
    log(f"signal {signum}: stopping; the cache keeps every finished mutant")
    stop_child()
    raise SystemExit(130)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def parse_until(text: str | None, now: dt.datetime | None = None) -> dt.datetime | None:
    """The next UTC time HH:MM, tomorrow's if today's has passed (a run started at 22:50 --until 01:05 must run)."""
    if not text:
        return None
    try:
        h, m = map(int, text.split(":"))
        now = now or dt.datetime.now(dt.timezone.utc)
        when = now.replace(hour=h, minute=m, second=0, microsecond=0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--until wants a UTC time HH:MM, got {text!r}") from None
    return when if when > now else when + dt.timedelta(days=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", nargs="*", help="module paths from config.yaml (default: all, in order)")
    ap.add_argument("--workdir", type=Path,
                    default=Path(os.environ.get("RLCONFORM_MUTATION_WORKDIR",
                                                Path(os.environ.get("TMPDIR", "/tmp")) / "rlconform-mutation")))
    ap.add_argument("--sync", action="store_true", help="refresh the snapshot from the working tree first")
    ap.add_argument("--sync-paths", nargs="*", default=[], metavar="PATH",
                    help="copy only these files (relative to the repository) into the snapshot, e.g. a new test")
    ap.add_argument("--until", help="UTC HH:MM: stop (resumably) at this time")
    ap.add_argument("--every", type=float, default=60, help="seconds between progress lines / results exports")
    ap.add_argument("--reset", nargs="*", default=[], metavar="MODULE",
                    help="forget these modules' verdicts first (after their test files changed in config.yaml)")
    ap.add_argument("--verify-kills", action="store_true",
                    help="check the survivors classification.yaml says new tests kill (verified.json), then exit")
    ap.add_argument("--export-only", action="store_true", help="only rewrite results.json from the cache")
    args = ap.parse_args(argv)

    try:
        os.nice(19)  # the machine is shared: mutation testing only takes idle CPU
    except OSError:
        pass
    cfg = load_config()
    selected = args.modules or list(cfg["modules"])
    unknown = [m for m in selected if m not in cfg["modules"]]
    if unknown:
        ap.error(f"not in config.yaml: {unknown}")
    try:
        until = parse_until(args.until)
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    tree = args.workdir / "tree"
    if args.verify_kills:  # works on a scratch copy: safe while a run is going on
        verify_kills(cfg, tree, args.workdir)
        return 0
    if args.export_only:  # read-only: safe while a run is going on
        export(cfg, tree, selected)
        log(f"wrote {RESULTS}")
        return 0
    lock = args.workdir / "run.pid"
    if lock.exists() and _alive(int(lock.read_text() or 0)):
        ap.error(f"a run is going on in {args.workdir} (pid {lock.read_text()}); stop it first (kill that pid)")
    if args.sync or not tree.exists():
        sync_snapshot(tree)
    for rel in args.sync_paths:
        shutil.copy2(REPO / rel, tree / rel)
        log(f"copied {rel} into the snapshot")
    for module in args.reset:
        forget(tree, module)
    lock.write_text(str(os.getpid()))
    restore_backups(tree)
    shutil.copy2(HERE / "mutmut_config.py", tree / "mutmut_config.py")  # the hook is part of the tool
    shutil.copy2(HERE / "verdict.py", tree / "tools" / "mutation" / "verdict.py")  # and so is the test command
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    state_path = args.workdir / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    for cache_dir in tree.rglob("__pycache__"):  # bytecode of an earlier mutant must never be reused
        shutil.rmtree(cache_dir, ignore_errors=True)
    failed = []
    for module in selected:
        if past(until):
            log(f"deadline reached before {module}")
            break
        seconds = baseline(cfg, module, tree, state)
        if seconds is None:
            failed.append(module)
            continue
        state_path.write_text(json.dumps(state, indent=1))
        set_mutmut_baseline(tree, seconds)  # this module's timeout, not the first module's
        run_module(cfg, module, tree, args.workdir / "logs", until=until, every=args.every, selected=selected)
    export(cfg, tree, selected)
    log(f"wrote {RESULTS}; red baselines: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
