"""Run the suite against an implementation and turn per-test results into a clause verdict.

``run_suite`` runs pytest in a child process isolated from the caller's configuration (its own
rootdir and ini file, ``PYTEST_ADDOPTS`` and plugin auto-loading off, xdist only when asked for),
reads the child's event stream as it goes (progress, and a record that survives a crash), kills
and resumes the child when a test hangs beyond its budget, and marks what never ran as *not run*.
``clause_report`` folds the tests into one status per clause; ``exit_code`` is the verdict a
release can be gated on; ``render_checklist`` writes the grey-release checklist, findings first.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable

import conformance_tests
from conformance_tests import crashes
from conformance_tests.expectations import load_expectations
from conformance_tests.layout import clause_test_files
from conformance_tests.options import DEFAULT_TIMEOUT, KILLED_OPS_VAR
from conformance_tests.outcomes import KIND_RANK
from conformance_tests.preflight import resolve_impl_string
from rlconform import launch
from rlconform.provenance import code_commit
from rlconform.spec import (
    SEVERITIES,
    SEVERITY_MEANING,
    Spec,
    default_spec,
    worst_severity,
)

# Exit codes of `rlconform audit` (documented in the README).
EXIT_OK, EXIT_MUST_FAILED, EXIT_USAGE, EXIT_IMPL, EXIT_SUITE = 0, 1, 2, 3, 4

# ``deviation``: the clause passes, but only under conventions the implementation declares otherwise than
# the seeds (spec/conventions.yaml); never a failure, listed right after the findings.
STATUSES = ("fail", "error", "timeout", "deviation", "expected_fail", "not_run", "untested", "pass", "not_applicable")
FAILED = ("fail", "error", "timeout")
_ICON = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "timeout": "TIMEOUT", "expected_fail": "XFAIL",
         "not_applicable": "N/A", "not_run": "NOT RUN", "untested": "UNTESTED", "deviation": "DEVIATION"}
_STATUS_RANK = {"error": 0, "timeout": 1, "fail": 2, "expected_fail": 3}
HANG_GRACE = 30.0  # seconds past a test's own budget before the watchdog kills the child
_INI = """[pytest]
addopts =
markers =
    clause(*ids): the spec clause(s) this test checks
    meta: tests of the suite itself (not run by audits)
filterwarnings =
    ignore::DeprecationWarning
    ignore::pytest.PytestAssertRewriteWarning
"""


class SuiteError(RuntimeError):
    """The suite itself could not run (internal error, crash): exit 4, never a verdict."""


def reference_only_clauses(spec: Spec | None = None) -> frozenset[str]:
    """Clauses no operation of the contract reaches (``audited: false`` in the spec): the reference's own
    machinery is checked against them, and an audit leaves them out of its verdict."""
    spec = spec or default_spec()
    return frozenset(c for c, clause in spec.clauses.items() if not clause.audited)


IMPORT_PATH_VAR = "RLCONFORM_IMPORT_PATH"  # read by conformance_tests.plugin in the child and its workers


def import_path() -> list[str]:
    """Where the caller finds an ``--impl`` module, as absolute directories: the working directory, then
    each ``PYTHONPATH`` entry. The audit's child runs elsewhere (a temporary directory, maybe forked from a
    server started earlier), so a relative entry or the caller's directory would not reach it otherwise."""
    entries = [os.getcwd(), *(e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e)]
    return list(dict.fromkeys(os.path.abspath(e) for e in entries))


def child_env() -> dict[str, str]:
    """The caller's environment without what would reconfigure the child's pytest, plus the caller's
    import path (:func:`import_path`). That path reaches the child through :data:`IMPORT_PATH_VAR`, which
    the plugin adds to ``sys.path`` once the interpreter has started, as ``python -m`` adds the working
    directory: on ``PYTHONPATH`` the caller's directory would come before the standard library while the
    interpreter starts, and a ``types.py`` there would kill it."""
    # an audit run from inside an xdist worker (a test of the audit) must not tell its child it is that worker
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS") and not k.startswith("PYTEST_XDIST_")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    pythonpath = [os.path.abspath(e) for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    if pythonpath:  # the caller's own, absolute (the child runs elsewhere): its interpreter started with it too
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    env[IMPORT_PATH_VAR] = os.pathsep.join(import_path())
    return env


@dataclasses.dataclass
class _Run:
    """What the child has reported so far (rebuilt from its event stream)."""
    tests: dict[str, dict] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    in_flight: dict[str, float] = dataclasses.field(default_factory=dict)
    finished: dict | None = None
    preflight_error: str | None = None
    offset: int = 0

    def read(self, path: Path, on_event: Callable[[dict], None] | None) -> None:
        if not path.exists():
            return
        with open(path, encoding="utf-8") as f:
            f.seek(self.offset)
            while True:
                line = f.readline()
                if not line.endswith("\n"):  # a line still being written: read it next time
                    break
                self.offset = f.tell()
                ev = json.loads(line)
                self._apply(ev)
                if on_event:
                    on_event(ev)

    def _apply(self, ev: dict) -> None:
        kind = ev.get("event")
        if kind == "collected":
            for nodeid, rec in ev["tests"].items():
                self.tests.setdefault(nodeid, rec)
            self.info["unmatched_expectations"] = ev.get("unmatched_expectations", [])
        elif kind == "start":
            self.in_flight = {ev["nodeid"]: ev["t"]}
        elif kind == "result":
            self.tests[ev["nodeid"]] = ev["record"]
        elif kind == "finish":
            self.in_flight.pop(ev["nodeid"], None)
        elif kind == "finished":
            self.finished = ev
            self.info["unmatched_expectations"] = ev.get("unmatched_expectations", [])
        elif kind == "preflight":
            self.preflight_error = ev["error"]

    def give_up(self, nodeid: str, message: str, outcome: str = "timeout") -> None:
        """Mark a test the watchdog had to kill *timeout* (or one that killed its process, *error*), and with it
        every test not yet run whose clauses are all among its clauses (their verdict is already that): a
        hang or a crash then costs one restart per clause, not one per test."""
        rec = self.tests.setdefault(nodeid, {"clauses": [], "kind": "example", "meta": False})
        rec.update(outcome=outcome, message=message, severity="critical")
        what = "hung" if outcome == "timeout" else "crashed its process"
        hung = set(rec.get("clauses") or ())
        for other, r in self.tests.items():
            if hung and r.get("outcome") is None and r.get("clauses") and hung.issuperset(r["clauses"]):
                r.update(outcome=outcome, severity="critical",
                         message=f"not run: {nodeid}, a test of the same clause(s), {what} ({message.splitlines()[0]})")
        self.in_flight = {}

    def done(self) -> set[str]:
        return {n for n, r in self.tests.items() if r.get("outcome") not in (None, "not_run")}


def _child_args(tmp: Path, targets: list[str], *, impl, profile, device, clauses, families, expectations,
                jobs, timeout, seed, events: Path, skip: Path, extra: Iterable[str]) -> list[str]:
    """The child pytest's command line."""
    # rootdir above the package, so node ids name their file; the ini file is our own, not the caller's
    rootdir = Path(conformance_tests.__file__).resolve().parent.parent
    args = [sys.executable, "-m", "pytest", *targets, "-c", str(tmp / "pytest.ini"), "--rootdir", str(rootdir),
            "-p", "conformance_tests.plugin", "-p", "_hypothesis_pytestplugin", "-p", "no:cacheprovider",
            "-m", "not meta", "-q", "--no-header", "-rN",
            "--rlconform-profile", profile, "--rlconform-device", device,
            "--rlconform-events", str(events), "--rlconform-skip-file", str(skip)]
    for flag, value in (("impl", impl), ("clauses", ",".join(clauses or ())), ("families", ",".join(families or ())),
                        ("expectations", expectations), ("timeout", timeout), ("seed", seed)):
        if value not in (None, ""):
            args += [f"--rlconform-{flag}", str(value)]
    if jobs and jobs > 1:
        args += ["-p", "xdist.plugin", "-n", str(jobs)]
    return args + list(extra)


def run_suite(
    impl: str | None = None,
    *,
    profile: str = "ci",
    device: str = "cpu",
    clauses: Iterable[str] | None = None,
    families: Iterable[str] | None = None,
    expectations: str | None = None,
    jobs: int | None = None,
    timeout: float | None = None,
    seed: int | None = None,
    budget: float | None = None,
    grace: float = HANG_GRACE,
    on_event: Callable[[dict], None] | None = None,
    log: str | Path | None = None,
    extra: Iterable[str] = (),
) -> dict:
    """Run ``conformance_tests`` (meta-tests excluded) in a child pytest and return the per-test payload.

    A test that outlives its budget (``timeout`` + a grace period) is marked *timeout* and the child is
    restarted on the tests not yet run; ``budget`` bounds the whole run (what is left is *not run*);
    Ctrl-C stops the child and returns what ran, marked interrupted.
    """
    impl = resolve_impl_string(impl)  # always named: the plugin activates in an xdist controller too
    if expectations:  # the child runs in a temporary directory: a relative path would name nothing there
        expectations = str(Path(expectations).resolve())
    if on_event:  # one caller may follow several runs (the matrix): each starts its own count
        on_event({"event": "begin", "impl": impl})
    if profile == "release" and seed is None:  # drawn here, so a resumed child and the report share it
        seed = random.SystemRandom().randrange(2**32)
    clauses = list(clauses or ())
    fams = {default_spec().clause(c).family for c in clauses} if clauses else (set(families) if families else None)
    targets = [str(f) for f in clause_test_files(fams, clauses)]
    per_test = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    launch.prepare()  # a forkserver's start-up is no test's time
    state, started = _Run(), time.time()
    hung: list[str] = []
    killed_ops: list[str] = []  # operations a killed child was inside: the next children never call them
    crashed: list[str] = []
    interrupted = budget_exhausted = crash_limited = False
    with tempfile.TemporaryDirectory(prefix="rlconform-audit-") as tmpdir:
        tmp = Path(tmpdir)
        (tmp / "pytest.ini").write_text(_INI, encoding="utf-8")
        events, skip = tmp / "events.jsonl", tmp / "skip.txt"
        skip.write_text("", encoding="utf-8")
        log_file = open(log, "w", encoding="utf-8") if log else open(tmp / "pytest.log", "w", encoding="utf-8")
        proc = None
        try:
            while True:
                args = _child_args(tmp, targets, impl=impl, profile=profile, device=device, clauses=clauses,
                                   families=families, expectations=expectations, jobs=jobs, timeout=timeout,
                                   seed=seed, events=events, skip=skip, extra=extra)
                try:
                    # Hypothesis's cache in the run's directory: a forked child's default home was fixed where
                    # the forkserver started (the caller's directory)
                    env = {"HYPOTHESIS_STORAGE_DIRECTORY": str(tmp / ".hypothesis"),
                           **child_env(), crashes.CALL_LOG_VAR: str(tmp / "last_call.txt"),
                           KILLED_OPS_VAR: ",".join(killed_ops), crashes.FAULT_LOG_VAR: str(tmp / "fault.txt")}
                    proc = launch.start(args, cwd=tmp, env=env, stdout=log_file.name)
                    state.finished = None
                    reason = _watch(proc, state, events, on_event, per_test + grace if per_test else 0, started,
                                    budget)
                except KeyboardInterrupt:  # Ctrl-C, or SIGTERM/SIGHUP turned into one by the CLI: stop the
                    # child (it reports what ran), keep what it ran; the report marks the rest not run
                    with _signals_deferred():
                        if proc is not None:
                            _stop(proc)
                        state.read(events, on_event)
                    interrupted = True
                    break
                state.read(events, on_event)
                if reason == "budget":
                    budget_exhausted = True
                    break
                if reason == "hang":
                    nodeid = next(iter(state.in_flight))
                    hung.append(nodeid)
                    killed_ops.extend(_last_op(tmp))
                    call = crashes.last_call(tmp / "last_call.txt")  # where it hung, as a crash report says
                    state.give_up(nodeid, f"{nodeid} did not finish within {per_test:g} s (+{grace:g} s grace); "
                                       "the process was stopped" + (f"\n  last call: {call}" if call else ""))
                    skip.write_text("\n".join(sorted(state.done() | set(hung) | set(crashed))) + "\n", encoding="utf-8")
                    continue
                if state.finished is None and state.in_flight:
                    # the process died inside a test (a segfault, os._exit in the code under test): that test
                    # is a crash, the child is replaced, and the other clauses still run
                    nodeid = next(iter(state.in_flight))
                    crashed.append(nodeid)
                    state.give_up(nodeid, _crash_message(nodeid, proc.returncode, tmp), outcome="error")
                    if len(crashed) >= MAX_CRASHES:  # the rest is reported not run: no verdict, exit 4
                        crash_limited = True
                        break
                    skip.write_text("\n".join(sorted(state.done() | set(hung) | set(crashed))) + "\n", encoding="utf-8")
                    continue
                break
            log_file.flush()
            log_text = Path(log_file.name).read_text(encoding="utf-8", errors="replace")
        finally:
            log_file.close()
    fin = state.finished or {}
    if state.preflight_error is None and not fin and not (interrupted or budget_exhausted or crash_limited):
        raise SuiteError(f"the test process ended without finishing (exit {proc.returncode}):\n{log_text[-3000:]}")
    if fin.get("exitstatus") in (3, 4) and not state.preflight_error:
        raise SuiteError(f"pytest could not run the suite (exit {fin['exitstatus']}):\n{log_text[-3000:]}")
    for rec in state.tests.values():
        if rec.get("outcome") is None:
            rec["outcome"] = "not_run"
    return {
        "impl": impl, "profile": profile, "device": device, "families": list(families or ()), "clauses": clauses,
        "seed": seed if profile == "release" else "derandomized",
        "tests": state.tests, "preflight_error": state.preflight_error,
        "expectations": load_expectations(expectations, default_spec().clauses),
        "unmatched_expectations": state.info.get("unmatched_expectations", []),
        # the child stopped by the watchdog (a hang) or for the budget reports itself interrupted: neither was a stop
        "interrupted": interrupted or (bool(fin.get("interrupted")) and not hung and not budget_exhausted),
        "budget_exhausted": budget_exhausted, "hung": hung, "crashed": crashed, "crash_limited": crash_limited,
        "pytest_exit": fin.get("exitstatus"),
        "started": started, "finished": time.time(), "log_tail": log_text[-3000:],
    }


MAX_CRASHES = 20  # child restarts after crashes in one audit; past that the rest is reported not run


def _last_op(tmp: Path) -> list[str]:
    """The operation the child was calling when it was killed (``family.op``, from its call log), if known."""
    name = crashes.last_call(tmp / "last_call.txt").split("(", 1)[0].strip()
    return [name] if re.fullmatch(r"[a-z]+\.[A-Za-z_][A-Za-z0-9_]*", name) else []


def _crash_message(nodeid: str, returncode: int | None, tmp: Path) -> str:
    """What killed the child inside ``nodeid``: the signal or exit code, the call it was making, and the
    Python stack faulthandler wrote at a fatal signal (the user's frames included)."""
    how = (f"signal {signal.Signals(-returncode).name}" if returncode is not None and returncode < 0
           else f"exit code {returncode}")
    lines = [f"the test process died inside {nodeid} ({how}): the implementation crashed it"]
    return "\n".join(lines + crashes.details(tmp / "last_call.txt", tmp / "fault.txt"))


def _watch(proc, state: _Run, events: Path, on_event, hang_after: float, started: float, budget) -> str:
    """Follow the child until it exits ("exit"), a test hangs ("hang") or the budget runs out ("budget")."""
    while True:
        try:
            proc.wait(timeout=0.25)
            return "exit"
        except subprocess.TimeoutExpired:
            pass
        state.read(events, on_event)
        now = time.time()
        if budget and now - started > budget:
            _stop(proc)
            return "budget"
        if hang_after and state.in_flight:
            t0 = next(iter(state.in_flight.values()))
            if now - t0 > hang_after:
                proc.kill()
                proc.wait()
                return "hang"


@contextlib.contextmanager
def _signals_deferred():
    """While the child is being stopped, a second Ctrl-C or SIGTERM must not cut the stop short (and lose
    the report, or orphan the child): they are held and the stop completes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {s: signal.signal(s, signal.SIG_IGN) for s in STOP_SIGNALS + (signal.SIGINT,)}
    try:
        yield
    finally:
        for s, h in held.items():
            signal.signal(s, h)


# Signals that stop an audit like Ctrl-C: a CI cancel or `timeout` (SIGTERM), a closed terminal (SIGHUP).
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextlib.contextmanager
def stops_as_interrupt():
    """SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread while the block runs, so every stop
    takes Ctrl-C's path: the child is stopped, the partial report is written, the exit code is 4."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {s: signal.signal(s, interrupt) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _stop(proc) -> None:
    """Ask the child to stop as Ctrl-C would (so it reports what ran), again if it goes on, then kill it;
    what it ran is in the event stream either way. A KeyboardInterrupt can be lost where it is raised (a
    bare ``except:`` in the code under test, a finalizer running at that moment); the child's runtime
    latches every Ctrl-C and starts no test after one, and the repeat covers a child that is not ours."""
    for _ in range(3):
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=3)
            return
        except subprocess.TimeoutExpired:
            pass
    proc.kill()
    proc.wait()


# ----------------------------------------------------------------------------- the clause verdict
def _fold(outcomes: list[str]) -> str:
    if not outcomes:
        return "untested"
    if all(o in ("not_applicable", "skipped") for o in outcomes):
        return "not_applicable"
    for status in ("error", "timeout", "fail", "expected_fail", "not_run", "deviation"):
        if status in outcomes:
            return status
    return "pass"


def _clause_deviations(tests: list[tuple[str, dict]]) -> list[dict]:
    """The declared conventions a clause's tests followed, one entry per convention (tests counted)."""
    out: dict[str, dict] = {}
    for _, t in tests:
        for d in t.get("deviations") or ():
            entry = out.setdefault(d["convention"], {**d, "tests": 0})
            entry["tests"] += 1
    return [out[k] for k in sorted(out)]


def _because_of_a_sibling(message: str) -> bool:
    """The watchdog's "not run: ..." and the harness's "<op> is not called again: ..." (conformance_tests.harness)."""
    return message.startswith("not run:") or " is not called again: " in message.split("\n", 1)[0]


def _failing_tests(tests: list[tuple[str, dict]]) -> list[dict]:
    """Every failing test of a clause, worst status first, then golden before example before property."""
    bad = [(n, t) for n, t in tests if t.get("outcome") in _STATUS_RANK]
    # a test that never ran, or never called the op, because a sibling hung or crashed explains less than that
    # sibling: the clause's headline is the test that hung
    bad.sort(key=lambda nt: (_STATUS_RANK[nt[1]["outcome"]], _because_of_a_sibling(nt[1].get("message") or ""),
                             KIND_RANK.get(nt[1].get("kind"), 1), nt[0]))
    out = []
    for nodeid, t in bad:
        entry = {"test": nodeid, "status": t["outcome"], "kind": t.get("kind"),
                 "severity": t.get("severity") or ("critical" if t["outcome"] in ("error", "timeout") else "major"),
                 "message": _first_lines(t.get("message") or "", 12)}
        for key in ("falsifying_example", "reproduce_failure", "repro", "train_dtype_evidence"):
            if t.get(key):
                entry[key] = t[key]
        out.append(entry)
    return out


def _versions() -> dict[str, str | None]:
    try:
        version = metadata.version("rlconform")
    except metadata.PackageNotFoundError:
        version = None
    return {"rlconform": version, "rlconform_commit": code_commit()}


def clause_report(payload: dict, spec: Spec | None = None) -> dict:
    """report.json: run_info, a summary with the exit code, and one entry per clause the run touched."""
    spec = spec or default_spec()
    by_clause: dict[str, list[tuple[str, dict]]] = {}
    for nodeid, t in payload["tests"].items():
        if t.get("meta"):
            continue
        for c in t.get("clauses", []):
            by_clause.setdefault(c, []).append((nodeid, t))
    audited = payload.get("families") or list(spec.families)
    selected = set(payload.get("clauses") or ())
    clauses = []
    for fam in audited:
        for c in spec.families[fam].clauses if fam in spec.families else ():
            if selected and c.id not in selected:
                # a clause that only shares tests with a selected one: some of its tests never ran (and the
                # mutant profile stops the shared ones early), so the run gives it no verdict
                continue
            tests = by_clause.get(c.id, [])
            if not tests:
                # A clause of the audited families that no test checks is never passed silently; one
                # checked only on the reference's machinery (gates, the STDB store) is outside the verdict.
                if (not payload.get("preflight_error") and (not selected or c.id in selected)
                        and not c.deprecated and c.id not in reference_only_clauses()):
                    clauses.append({"id": c.id, "family": fam, "title": c.title, "level": c.level, "kind": c.kind,
                                    "binding": c.binding, "status": "untested", "tests": 0, "passed": 0, "not_applicable_tests": 0,
                                    "not_run_tests": 0})
                continue
            outcomes = [t.get("outcome") or "not_run" for _, t in tests]
            entry: dict[str, Any] = {
                "id": c.id, "family": fam, "title": c.title, "level": c.level, "kind": c.kind, "binding": c.binding,
                "status": _fold(outcomes), "tests": len(tests),
                "passed": outcomes.count("pass") + outcomes.count("xpass") + outcomes.count("deviation"),
                "not_applicable_tests": outcomes.count("not_applicable"),
                "not_run_tests": outcomes.count("not_run"),
            }
            devs = _clause_deviations(tests)
            if devs:
                entry["deviations"] = devs
            failing = _failing_tests(tests)
            if failing:
                first = failing[0]
                entry.update(severity=worst_severity(*(f["severity"] for f in failing)),
                             requires=_first_sentence(c.statement))
                entry.update(failing_test=first["test"], message=first["message"],
                             falsifying_example=first.get("falsifying_example"),
                             reproduce_failure=first.get("reproduce_failure"), failing_tests=failing)
                if first.get("repro"):
                    entry["repro"] = first["repro"]
            if entry["status"] == "expected_fail":
                entry["expectation"] = (payload.get("expectations") or {}).get(c.id)
            clauses.append(entry)
    run_info = {
        "implementation": payload.get("impl"),
        "implementation_name": payload.get("impl_name"),
        "implementation_version": payload.get("impl_version"),
        "implementation_commit": payload.get("impl_commit"),
        **({"steps_itself": payload["impl_steps_itself"]} if payload.get("impl_steps_itself") else {}),
        **_versions(),
        "families": audited,
        "spec_versions": {f: spec.families[f].version for f in audited if f in spec.families},
        "profile": payload.get("profile"),
        "seed": payload.get("seed"),
        "device": payload.get("device"),
        "python": platform.python_version(),
        "torch": _torch_version(),
        "started": _iso(payload.get("started")),
        "finished": _iso(payload.get("finished")),
        "pytest_exit": payload.get("pytest_exit"),
        "interrupted": bool(payload.get("interrupted")),
        "budget_exhausted": bool(payload.get("budget_exhausted")),
        "crash_limited": bool(payload.get("crash_limited")),
        "hung_tests": payload.get("hung", []),
    }
    counts = {s: sum(1 for c in clauses if c["status"] == s) for s in STATUSES}
    must_failed = [c["id"] for c in clauses if c["level"] == "MUST" and c["status"] in FAILED]
    # a SHOULD behaviour that is there and wrong (spec.BINDING_KINDS) fails the audit too
    should_failed = [c["id"] for c in clauses if c["level"] != "MUST" and c["binding"] and c["status"] in FAILED]
    advisory = [c["id"] for c in clauses if not c["binding"] and c["status"] in FAILED]
    executed = sum(1 for t in payload["tests"].values()
                   if not t.get("meta") and t.get("outcome") not in ("not_applicable", "skipped", "not_run", None))
    outside = sorted(c for c in reference_only_clauses() if spec.clause(c).family in audited)
    report = {
        "run_info": run_info,
        "reference_only": outside,
        "summary": {**counts, "clauses": len(clauses), "must_failed": must_failed, "should_failed": should_failed,
                    "advisory_failed": advisory, "tests_executed": executed,
                    "tests_not_run": sum(1 for t in payload["tests"].values() if t.get("outcome") == "not_run")},
        "warnings": [f"expectation for {c} matches no collected test" for c in payload.get("unmatched_expectations", [])]
        + stale_expectations(clauses, payload.get("expectations") or {}),
        "clauses": clauses,
    }
    code, verdict = exit_code(report)
    report["summary"].update(exit_code=code, verdict=verdict)
    return report


def exit_code(report: dict) -> tuple[int, str]:
    """The audit's exit code and its one-line reason (README, "Exit codes")."""
    info, s = report["run_info"], report["summary"]
    if info.get("budget_exhausted"):  # before "interrupted": the budget stops the child as Ctrl-C would
        return EXIT_SUITE, (f"the time budget (--budget) ran out: {s['tests_not_run']} test(s) never ran, "
                            "so no verdict")
    if info.get("interrupted"):
        return EXIT_SUITE, f"interrupted: {s['tests_not_run']} test(s) never ran, so no verdict"
    if info.get("crash_limited"):
        return EXIT_SUITE, (f"the implementation killed the test process {MAX_CRASHES} times; {s['tests_not_run']} "
                            f"test(s) never ran, so no verdict (the crashes are findings below)")
    if s["tests_executed"] == 0:
        return EXIT_SUITE, "no clause test was executed (everything selected is not applicable), so no verdict"
    should = s.get("should_failed") or []
    if s["must_failed"] or should:
        parts = [f"{len(s['must_failed'])} MUST clause(s) failed: {', '.join(s['must_failed'])}"] if s["must_failed"] else []
        if should:
            parts.append(f"{len(should)} SHOULD behaviour(s) present but wrong: {', '.join(should)}")
        return EXIT_MUST_FAILED, "; ".join(parts)
    if s["tests_not_run"]:
        return EXIT_SUITE, f"{s['tests_not_run']} test(s) never ran, so no verdict"
    if s["untested"]:
        ids = [c["id"] for c in report["clauses"] if c["status"] == "untested"]
        return EXIT_SUITE, f"{len(ids)} clause(s) of the spec have no test in this suite ({', '.join(ids[:5])})"
    return EXIT_OK, f"every selected clause ran; no MUST clause failed and no SHOULD behaviour is wrong ({s['clauses']} clauses)"


def _torch_version() -> str:
    try:
        import torch

        return torch.__version__
    except ImportError:  # pragma: no cover
        return "absent"


def _iso(ts: float | None) -> str | None:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds") if ts else None


_OURS = ("but should be", "modified its input", "left a gradient in", "did not return within", "raised ")
_QUALIFIED = re.compile(r"^(?:[\w.]+\.)?(ImplementationError|InputMutated|OpTimeout|Failed|AssertionError): ")


def _first_lines(text: str, n: int) -> str:
    """The informative part of a failure: from our own failure line (or the exception line) on,
    without pytest's ``E`` gutter, source lines or module-qualified exception names."""
    lines = [ln[1:].strip() if ln.startswith("E ") else ln.rstrip() for ln in text.splitlines() if ln.strip()]
    lines = [_QUALIFIED.sub("", ln) for ln in lines]
    for i, ln in enumerate(lines):
        if any(k in ln for k in _OURS):
            return "\n".join(ln for ln in lines[i: i + n] if not re.match(r"^\S+\.py:\d+: ", ln))
    return "\n".join(lines[-n:])


# ----------------------------------------------------------------------------- the checklist
def _finding_line(c: dict) -> str:
    msg = (c.get("message") or "").splitlines()
    more = len(c.get("failing_tests", [])) - 1
    tail = f" (+{more} more failing test{'s' if more > 1 else ''})" if more > 0 else ""
    sev = f"[{c['severity']}] " if c.get("severity") else ""
    need = f" The clause requires: {c['requires']} (`rlconform spec show {c['id']}`)." if c.get("requires") else ""
    return (f"- {sev}**{c['id']}** ({c['level']}) {c['title']}: {_ICON[c['status']]}. {msg[0] if msg else ''}{tail}"
            + need + _train_dtype_note(c))


def _train_dtype_note(c: dict) -> str:
    """What the failing call gives in the dtype the library trains in, when the test ran it in float64."""
    ev = next((t["train_dtype_evidence"] for t in c.get("failing_tests", []) if t.get("train_dtype_evidence")), None)
    if not ev or ev.get("error"):
        return ""
    if ev.get("severity"):
        return (f" In {ev['dtype']}, the dtype the library trains in, the same call returns {ev['train']} "
                f"(float64: {ev['float64']}; they differ by up to {ev['max_difference']:.3g}).")
    if c.get("severity") == "minor":  # a residue that the training dtype does not show
        return (f" In {ev['dtype']}, the dtype the library trains in, the same call agrees with float64 to "
                f"{ev['max_difference']:.2g}: the residue exists in float64 only.")
    return ""  # the same in the training dtype: nothing to add


def _first_sentence(text: str) -> str:
    """The clause's statement up to its first full stop: what it requires, in one sentence."""
    flat = " ".join(text.split())
    m = re.search(r"(?<=[.!?])\s+(?=[A-Z(])", flat)
    return flat[:m.start()] if m else flat


def _binding(c: dict) -> bool:
    return c.get("binding", c["level"] == "MUST")  # reports written before the field: MUST only


# What each group of findings means (spec.BINDING_KINDS): the level says whether a behaviour may be left
# out, never whether a behaviour that is there may be wrong.
_FINDING_GROUPS = (
    ("Findings that fail the audit", "A MUST clause failed, or a SHOULD behaviour the implementation provides "
     f"computes its documented formula, rule or gate metric wrongly. Worst first: {SEVERITY_MEANING}.", True),
    ("Recommendations not followed", "SHOULD defaults and input checks the implementation does differently or "
     "leaves out; they do not fail the audit.", False),
)


def _findings_section(clauses: list[dict]) -> list[str]:
    out: list[str] = []
    for head, meaning, binding in _FINDING_GROUPS:
        rows = [c for c in clauses if c["status"] in FAILED and _binding(c) == binding]
        rows.sort(key=lambda c: (SEVERITIES.index(c.get("severity") or "major"), c["level"] != "MUST",
                                 _STATUS_RANK.get(c["status"], 9), c["id"]))
        if rows:
            out += ["", f"## {head}", "", meaning, ""] + [_finding_line(c) for c in rows]
    return out


def _cell(x: Any) -> str:
    return (json.dumps(x) if isinstance(x, (dict, list)) else str(x)).replace("|", "\\|")


def _deviation_section(clauses: list[dict]) -> list[str]:
    """The clauses that pass only under declared conventions: convention, declared and seed values, consequence."""
    rows = [(c, d) for c in clauses if c["status"] == "deviation" for d in c.get("deviations", [])]
    if not rows:
        return []
    out = ["", "## Deviations", "",
           "Declared departures from the seeds' conventions (spec/conventions.yaml); the normative part of each "
           "clause was still checked.", "",
           "| clause | convention | declared | seed | consequence |", "|---|---|---|---|---|"]
    out += [f"| {c['id']} | {d['convention']} | {_cell(d['declared'])} | {_cell(d['seed'])} | {_cell(d['consequence'])} |"
            for c, d in rows]
    return out


def stale_expectations(clauses: list[dict], expectations: dict) -> list[str]:
    """A clause declared an expected failure that no longer fails: the declaration hides nothing now,
    and would hide the next regression, so the report asks for it to go."""
    return [f"{c['id']} is declared an expected failure but passed in this run: the expectation is stale; "
            "remove it from the expectations file" for c in clauses
            if c["id"] in expectations and c["status"] in ("pass", "deviation")]


def render_checklist(report: dict, spec: Spec | None = None) -> str:
    """The grey-release checklist as Markdown: the verdict and findings first, then checklist and tables."""
    spec = spec or default_spec()
    info, summ = report["run_info"], report["summary"]
    status = {c["id"]: c for c in report["clauses"]}
    impl_line = " ".join(str(x) for x in (info.get("implementation_name") or info["implementation"],
                                          info.get("implementation_version") or "") if x).strip()
    out = [
        f"# rlconform audit: {impl_line}",
        "",
        f"**Verdict (exit {summ['exit_code']}):** {summ['verdict']}.",
        "",
        f"- implementation: `{info['implementation']}`"
        + (f", commit `{info['implementation_commit']}`" if info.get("implementation_commit") else ""),
        "- checked against: " + ", ".join(f"{f} ({v})" for f, v in info["spec_versions"].items()),
        f"- rlconform {info.get('rlconform') or '?'}"
        + (f" (commit `{info['rlconform_commit']}`)" if info.get("rlconform_commit") else "")
        + f", profile `{info['profile']}`, seed `{info.get('seed')}`, device `{info['device']}`, "
          f"torch {info['torch']}, finished {info['finished']}",
    ]
    if str(info.get("device", "")).startswith("cpu"):  # where every tensor lives on one device, none is misplaced
        out.append("- device mistakes (a tensor or generator made on the CPU beside inputs on a GPU) are not "
                   "checked on the CPU: `--device sim` checks them without a GPU, `--device cuda` on one")
    if info.get("steps_itself"):
        out.append("- gradients measured from the library's own optimiser step (it calls backward() and step() "
                   "itself; only the leaves it steps can show a gradient): "
                   + "; ".join(f"`{op}` {', '.join(keys)}" for op, keys in info["steps_itself"].items()))
    out += _findings_section(report["clauses"])
    out += _deviation_section(report["clauses"])
    for st, head in (("not_run", "Not run"), ("untested", "No test in this suite")):
        ids = [c["id"] for c in report["clauses"] if c["status"] == st]
        if ids:
            out += ["", f"## {head}", "", ", ".join(ids)]
    out += ["", "## Grey-release checklist", ""]
    any_items = False
    for fam, fspec in spec.families.items():
        for item in fspec.checklist:
            sts = [status[c]["status"] for c in item.clauses if c in status]
            if not sts:
                continue
            any_items = True
            ok = all(s in ("pass", "deviation", "expected_fail", "not_applicable") for s in sts)
            na = all(s == "not_applicable" for s in sts)
            box = "n/a" if na else ("x" if ok else " ")
            refs = ", ".join(f"{c} {_ICON[status[c]['status']]}" for c in item.clauses if c in status)
            out.append(f"- [{box}] **{item.title}** ({fam}): {refs}")
    if not any_items:
        out.append("(no checklist item applies to this run)")
    rank = {"fail": 0, "error": 0, "timeout": 0, "deviation": 1, "expected_fail": 2, "not_run": 2, "untested": 2, "pass": 3,
            "not_applicable": 4}
    for fam, fspec in spec.families.items():
        rows = [c for c in report["clauses"] if c["family"] == fam]
        if not rows:
            continue
        out += ["", f"## {fam}: {fspec.name} ({fspec.version})", ""]
        rows.sort(key=lambda c: (0 if _binding(c) and c["status"] in FAILED else 1,
                                 rank.get(c["status"], 5), c["id"]))
        out.append("| clause | level | status | tests | title |")
        out.append("|---|---|---|---|---|")
        for c in rows:
            out.append(f"| {c['id']} | {c['level']} | {_ICON[c['status']]} | {c['tests']} | {c['title']} |")
    if report.get("reference_only"):
        out += ["", "Outside this verdict (gates judge training runs with `rlconform gate`; the others are checked "
                "on the reference's own machinery only): " + ", ".join(report["reference_only"]) + "."]
    for w in report.get("warnings", []):
        out += ["", f"> warning: {w}"]
    s = summ
    out += ["", f"**Summary:** {s['clauses']} clauses: {s['pass']} pass, {s['fail']} fail, {s['error']} error, "
            f"{s['timeout']} timeout, {s.get('deviation', 0)} deviation, {s['expected_fail']} expected failures, {s['not_applicable']} not applicable, "
            f"{s['not_run']} not run, {s['untested']} untested; MUST failures: {len(s['must_failed'])}"
            + (f" ({', '.join(s['must_failed'])})" if s["must_failed"] else "")
            + f"; SHOULD behaviours present but wrong: {len(s.get('should_failed') or [])}"
            + (f" ({', '.join(s['should_failed'])})" if s.get("should_failed") else "")
            + f"; recommendations not followed: {len(s.get('advisory_failed') or [])}."]
    return "\n".join(out) + "\n"


def write_report(report: dict, out_dir: str | Path, spec: Spec | None = None) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rj, cm = out / "report.json", out / "checklist.md"
    for path, text in ((rj, json.dumps(report, indent=1, ensure_ascii=False)), (cm, render_checklist(report, spec))):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return rj, cm
