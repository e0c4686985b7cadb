"""The suite's machinery for one pytest session, registered by :func:`conformance_tests.plugin.activate`.

It owns everything the plugin must not do to other projects: loading rlconform's hypothesis profile,
one torch thread, the recording proxy's configuration, the pre-flight, the per-test time budget,
per-test records (streamed as JSON lines for ``rlconform audit`` and written whole with
``--rlconform-report``) and the restoration of all of it when the session ends.

Per-test records travel on ``report.user_properties`` so that a pytest-xdist controller, which
collects nothing itself, builds the same records from its workers' reports.
"""
from __future__ import annotations

import gc
import json
import os
import random
import re
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

from conformance_tests import crashes, harness, preflight, simdevice

try:
    from builtins import BaseExceptionGroup as _ExceptionGroup
except ImportError:  # Python 3.10: Hypothesis' backport
    from exceptiongroup import BaseExceptionGroup as _ExceptionGroup
from rlconform.spec import SpecError, default_spec, worst_severity
from rlconform.spec.yamlfile import YamlFileError

from conformance_tests.expectations import load_expectations
from conformance_tests.marks import item_clauses, test_kind  # noqa: F401  (item_clauses: read by the runners)
from conformance_tests.options import DEFAULT_TIMEOUT, PROFILES, option
from conformance_tests.outcomes import KIND_RANK

_PROP = "rlconform"  # the user_properties key holding a test's record
_BLOB = re.compile(r"@reproduce_failure\([^()]*\)")


def _profiles():
    from hypothesis import HealthCheck, Phase, settings

    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large]
    # An explicit parent: without one a profile inherits whatever profile is loaded when it is registered (a
    # second session in one process would make release derandomised and explain-free, like ci).
    base = settings.get_profile("default")
    # ci: no explain phase. It re-runs a shrunk failure hundreds of times to annotate which parts of the
    # example do not matter (most of the time spent on a failing property test); release keeps it.
    settings.register_profile("rlconform-ci", parent=base, max_examples=25, derandomize=True, deadline=None,
                              database=None, print_blob=True, suppress_health_check=quiet,
                              phases=[p for p in Phase if p.name != "explain"])
    settings.register_profile("rlconform-release", parent=base, max_examples=300, deadline=None, database=None,
                              print_blob=True, suppress_health_check=quiet)
    # Killing a mutant needs one failing example, not the minimal one: no shrinking.
    settings.register_profile("rlconform-mutant", parent=settings.get_profile("rlconform-ci"),
                              phases=[Phase.explicit, Phase.reuse, Phase.generate])
    # For checks of where and how the suite builds its inputs (the device audits), not of the values: with 5
    # examples the strategies and the harness run the same lines and branches as with 25, except value-only
    # ones (measured with coverage.py over every family on the simulated device), in a third of the time.
    settings.register_profile("rlconform-smoke", parent=settings.get_profile("rlconform-ci"), max_examples=5)
    return settings


def stable_test_key(item) -> str:
    """``module::Class::test[params]``: a test's name whatever the rootdir or the path it was collected by."""
    return f"{item.module.__name__}::{item.nodeid.split('::', 1)[1]}"


def failure_message(exc: BaseException) -> str:
    """A failure in words: the suite's own message (``got X, but should be Y [CLAUSE: call]``, an input
    changed in place, a time-out) whole; any other exception as ``Type: message``. Of a group of failures
    (Hypothesis found several), the first."""
    while isinstance(exc, _ExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, (harness.InputMutated, harness.ImplementationError, harness.OpTimeout, pytest.fail.Exception)):
        return harness.plain_text(str(exc))
    text = str(exc).strip()
    return harness.plain_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def _plain_repr_failure(excinfo, style=None) -> str:
    return "".join(traceback.format_exception(excinfo.type, excinfo.value, excinfo.tb))


def _notes(excinfo) -> list[str]:
    notes = getattr(excinfo.value, "__notes__", None) or []
    return [n for n in notes if isinstance(n, str)]


class RlconformRun:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.worker = getattr(config, "workerinput", None) is not None
        self.impl = preflight.resolve_impl_string(option(config, "impl"))
        self.device = option(config, "device", "RLCONFORM_DEVICE", "cpu")
        self.profile = option(config, "profile", "RLCONFORM_PROFILE", "ci")
        if self.profile not in PROFILES:
            raise pytest.UsageError(f"RLCONFORM_PROFILE must be one of {', '.join(PROFILES)}, got {self.profile!r}")
        self.timeout = float(option(config, "timeout", "RLCONFORM_TIMEOUT", DEFAULT_TIMEOUT))
        self.families = _csv(option(config, "families"))
        self.clauses = _csv(option(config, "clauses"))
        self.failed_clauses: set[str] = set()  # by this process's tests (the mutant profile skips on it)
        self._restore: list = []
        config.add_cleanup(gc.unfreeze)  # after pytest's own final collections (see pytest_sessionfinish)
        self._setup_torch()
        self.ctrl_c = False  # set by a Ctrl-C (see _latch_ctrl_c)
        self._latch_ctrl_c()
        self.seed = self._setup_hypothesis()
        prev = harness.configure(self.impl, self.device)
        self._restore.append(lambda: harness.configure(*prev))
        self._simulate_device()
        self.spec = self._spec()
        try:
            self.expectations = load_expectations(option(config, "expectations"), self.spec.clauses)
        except YamlFileError as e:
            raise pytest.UsageError(f"--expectations: {e}") from None
        self.preflight_error: str | None = None
        self._preflight_reported = False
        self.info: dict[str, Any] = {}
        try:
            pf = preflight.run(self.impl, device=self.device, families=self.families or None)
            self.info = pf.info()
        except preflight.PreflightError as e:
            self.preflight_error = str(e)
        self.tests: dict[str, dict] = {}
        self.unmatched: list[str] = []
        self.meta_left_out = 0  # meta-tests deselected because --impl is not the bundled reference
        self.started = time.time()
        path = option(config, "events")
        self.events = open(path, "a", encoding="utf-8", buffering=1) if path and not self.worker else None

    # ------------------------------------------------------------------ setup / restore
    def _setup_torch(self) -> None:
        import torch

        if os.environ.get("RLCONFORM_THREADS") is None:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # the suite's tensors are tiny: intra-op threads only add synchronisation
            self._restore.append(lambda: torch.set_num_threads(threads))

    def _simulate_device(self) -> None:
        """``--device sim``: a CUDA device simulated on the CPU for the whole session (see simdevice)."""
        if self.device != simdevice.NAME:
            return
        sim = simdevice.simulate()
        sim.__enter__()
        self._restore.append(lambda: sim.__exit__(None, None, None))

    def _latch_ctrl_c(self) -> None:
        """Remember every Ctrl-C, so that no test starts after one. Python raises KeyboardInterrupt wherever
        the main thread happens to be, and it can be lost there: code under test with a bare ``except:``,
        or a finalizer (``__del__``, a weakref callback) that was running at that moment, whose exception
        Python discards. The run then went on to the end (seen in audits' budget stops and a CI run)."""
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGINT)
        if not callable(previous):  # ignored (SIG_IGN) or not Python's: leave it to whoever set it
            return

        def latch(signum, frame):
            self.ctrl_c = True
            previous(signum, frame)
        signal.signal(signal.SIGINT, latch)
        self._restore.append(lambda: signal.signal(signal.SIGINT, previous))

    def _setup_hypothesis(self) -> int | str:
        import hypothesis.core

        settings = _profiles()
        previous = settings._current_profile  # no public getter for the active profile's name
        settings.load_profile(f"rlconform-{self.profile}")
        self._restore.append(lambda: settings.load_profile(previous))
        if self.profile == "release":
            seed = option(self.config, "seed")
            seed = int(seed) if seed is not None else random.SystemRandom().randrange(2**32)
            forced = hypothesis.core.global_force_seed  # what hypothesis' own --hypothesis-seed sets
            hypothesis.core.global_force_seed = seed
            self._restore.append(lambda: setattr(hypothesis.core, "global_force_seed", forced))
            return seed
        return "derandomized"

    def _spec(self):
        try:
            return default_spec()
        except SpecError as e:
            raise pytest.UsageError(f"spec/ is invalid: {e}") from None

    def restore(self) -> None:
        for undo in reversed(self._restore):
            undo()
        self._restore.clear()
        if self.events:
            self.events.close()
            self.events = None

    def _emit(self, **event: Any) -> None:
        if self.events:
            self.events.write(json.dumps(event, default=str) + "\n")

    # ------------------------------------------------------------------ collection
    @pytest.hookimpl(hookwrapper=True)
    def pytest_make_collect_report(self, collector):
        """A failed pre-flight that pytest_sessionstart could not stop (the suite activated late, by its conftest
        during collection, or in an xdist worker) is ONE collection error, on the first test module; no test runs."""
        outcome = yield
        if not self.preflight_error or not isinstance(collector, pytest.Module):
            return
        rep = outcome.get_result()
        if not self._preflight_reported:
            self._preflight_reported = True
            rep.outcome = "failed"
            rep.longrepr = f"rlconform pre-flight: the implementation cannot be run\n{self.preflight_error}"
            self._emit(event="preflight", error=self.preflight_error)

    @pytest.hookimpl(trylast=True)  # after -m/-k deselection: record only what will run
    def pytest_collection_modifyitems(self, session, config, items):
        if self.preflight_error:
            items[:] = []
            return
        spec = self.spec
        unknown = sorted({c for it in items for c in item_clauses(it) if c not in spec.clauses})
        if unknown and not option(config, "skip-id-check"):
            raise pytest.UsageError(f"tests name clause id(s) absent from spec/: {', '.join(unknown)}")
        bad = sorted(set(self.clauses) - set(spec.clauses))
        if bad:
            raise pytest.UsageError(f"--clauses names unknown clause id(s): {', '.join(bad)}")
        bad = sorted(set(self.families) - set(spec.families))
        if bad:
            raise pytest.UsageError(f"--families names unknown famil(ies): {', '.join(bad)} "
                                    f"(known: {', '.join(spec.families)})")
        keep = list(items)
        self.meta_left_out = 0
        if self.impl != preflight.DEFAULT_IMPL:  # the meta-tests check the suite and the bundled reference,
            meta = [it for it in keep if it.get_closest_marker("meta")]  # never --impl: some carry a clause
            keep = [it for it in keep if not it.get_closest_marker("meta")]  # mark, which would misreport it
            self.meta_left_out = len(meta)
        if self.clauses:
            keep = [it for it in keep if set(self.clauses) & set(item_clauses(it))]
        if self.families:
            keep = [it for it in keep if any(spec.clause(c).family in self.families for c in item_clauses(it))]
        skip_file = option(config, "skip-file")
        if skip_file:
            skip = set(Path(skip_file).read_text(encoding="utf-8").split())
            keep = [it for it in keep if it.nodeid not in skip]
        if self.profile == "mutant":  # fixed inputs before hypothesis: most kills cost one cheap test
            keep.sort(key=lambda it: KIND_RANK[test_kind(it)])
        kept = {id(it) for it in keep}
        drop = [it for it in items if id(it) not in kept]
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep
        matched: set[str] = set()
        for it in items:
            record = self._new_record(it)
            hit = [c for c in record["clauses"] if c in self.expectations]
            if hit:
                matched.update(hit)
                reason = "; ".join(f"{c}: {self.expectations[c]['reason']}" for c in hit)
                it.add_marker(pytest.mark.xfail(reason=f"expected failure ({reason})", strict=False))
            it.user_properties.append(("clause", ",".join(record["clauses"])))
            self.tests[it.nodeid] = record
        self.unmatched = sorted(set(self.expectations) - matched)
        if self.worker:
            self.config.workeroutput.update(rlconform_tests=self.tests, rlconform_unmatched=self.unmatched,
                                            rlconform_meta_left_out=self.meta_left_out)
        self._emit(event="collected", tests=self.tests, unmatched_expectations=self.unmatched)

    def _asked(self, clauses) -> list[str]:
        """The clauses among ``clauses`` this run reports on (``--clauses`` narrows it; a test's other
        clauses only come along)."""
        return [c for c in clauses if c in self.clauses] if self.clauses else list(clauses)

    def _new_record(self, item) -> dict:
        return {"clauses": list(item_clauses(item)), "kind": test_kind(item),
                "meta": any(True for _ in item.iter_markers("meta")), "outcome": None}

    # ------------------------------------------------------------------ running
    @pytest.hookimpl(tryfirst=True)  # a failed pre-flight stops the run before xdist starts its workers
    def pytest_sessionstart(self, session):
        """A failed pre-flight is one usage error naming the implementation, before anything is collected
        (reported on a test module, it read as that module's fault), and never a pass (exit 4).

        Under ``rlconform audit``, a fatal signal (a segfault in the code under test) writes the Python
        stack to the audit's file, after pytest's own faulthandler set-up (at configure), so the crash report
        shows the user's frames whole instead of the cut tail of a log."""
        if self.preflight_error and not self.worker:
            self._preflight_reported = True
            self._emit(event="preflight", error=self.preflight_error)
            raise pytest.UsageError(f"rlconform pre-flight: the implementation cannot be run\n{self.preflight_error}")
        path = crashes.own_path(crashes.FAULT_LOG_VAR)
        if path:
            import faulthandler

            self._fault_file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - kept open for the session
            faulthandler.enable(file=self._fault_file, all_threads=False)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        if self.ctrl_c:  # a Ctrl-C the code under test swallowed: stop before this test
            raise KeyboardInterrupt

    def pytest_runtest_setup(self, item):
        clauses = item_clauses(item)
        if self.profile == "mutant" and clauses and self.failed_clauses.issuperset(self._asked(clauses)):
            # a mutant is killed by one failing test per clause: the rest of its clauses' tests add nothing
            pytest.skip("mutant profile: every clause this run checks with this test already failed")
        harness.begin_test(clauses=clauses, timeout=self.timeout or None)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        """A test parametrised on a floating dtype the implementation does not declare is not applicable.

        While the test body runs, Hypothesis formats EVERY failing example it tries (shrinking included)
        through ``item.repr_failure``; pytest's formatter re-parses the source file of each frame every
        time (about 90 ms a failure here: most of a shrink). Those texts are only compared, never shown, so
        the stdlib formatter serves them; the report's traceback, formatted after the call, is pytest's."""
        import torch

        params = getattr(getattr(item, "callspec", None), "params", {})
        for value in params.values():
            name = str(value).replace("torch.", "")
            if isinstance(value, (torch.dtype, str)) and name in harness.DTYPES and not harness.supports_dtype(name):
                harness.not_applicable(f"{name} is not among the declared dtypes")
        item.repr_failure = _plain_repr_failure
        try:
            yield
        finally:
            del item.repr_failure  # pytest's own again

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem):
        """A verdict must not depend on how the suite was started. Hypothesis keys a parametrised test's
        examples (and, derandomised, its seed) by the pytest node id, which changes with the rootdir
        (``--pyargs``, a checkout, ``rlconform audit``'s temporary directory); its plugin sets that key in
        its ``pytest_runtest_call`` wrapper, so here, just before the test body, it is replaced by one
        that names the module and the test only."""
        inner = getattr(getattr(pyfuncitem.obj, "hypothesis", None), "inner_test", None)
        if inner is not None and getattr(inner, "_hypothesis_internal_add_digest", None) is not None:
            inner._hypothesis_internal_add_digest = stable_test_key(pyfuncitem).encode()

    def pytest_runtest_teardown(self, item):
        harness.end_test()
        # Read by our call report already. Left, Hypothesis' teardown report would import libcst (~1 s) to
        # write a patch adding @example to OUR test file, into the caller's directory.
        item.__dict__.pop("_hypothesis_failing_examples", None)

    def pytest_runtest_logstart(self, nodeid, location):
        self._emit(event="start", nodeid=nodeid, t=time.time())

    def pytest_runtest_logfinish(self, nodeid, location):
        record = self.tests.get(nodeid) or {}
        self._emit(event="finish", nodeid=nodeid, outcome=record.get("outcome"), clauses=record.get("clauses", []))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        rep = (yield).get_result()
        if call.when == "setup":
            # the record rides on every phase's report: an xdist controller learns it from there
            rep.user_properties.append((_PROP, self.tests.get(item.nodeid) or self._new_record(item)))
        extra: dict[str, Any] = {}
        if call.excinfo is not None and rep.failed:
            if harness.not_applicable_calls() and _gave_up(call.excinfo):
                extra.update(status="not_applicable", message=f"{harness.NOT_APPLICABLE} every example the test drew "
                             f"makes a call the implementation declares not applicable "
                             f"({harness.not_applicable_calls()} call(s))")
            elif op := _gradient_of_a_declared_constant(call.excinfo):
                # as require_differentiable would have said before the check
                extra.update(status="not_applicable", message=f"{harness.NOT_APPLICABLE} a gradient through {op}, "
                             "which the implementation declares carries none (capabilities['differentiable'])")
            elif call.excinfo.errisinstance(harness.OpTimeout):
                # out of time while shrinking a failure already found: that failure is the verdict
                found = harness.first_failure()
                extra["status"] = found[0] if found else "timeout"
            elif call.excinfo.errisinstance(harness.ImplementationError) or call.when != "call":
                extra["status"] = "error"
            # the message is the failure itself, taken from the exception where it was raised: never a
            # scrape of the report's text (under xdist that begins with the worker's header)
            extra.setdefault("message", failure_message(call.excinfo.value))
            if extra.get("status") is None and not call.excinfo.errisinstance((AssertionError, pytest.fail.Exception)):
                # the suite's own code raised on a result: name the result and the contract, not the traceback
                extra["message"] = harness.suite_side_error(call.excinfo.value) or extra["message"]
            if extra.get("status") != "not_applicable":
                extra["severity"] = ("critical" if extra.get("status") in ("error", "timeout")
                                     else harness.failure_severity() or "major")
                if extra.get("status") is None and (ev := harness.evidence_in_train_dtype()):
                    extra["train_dtype_evidence"] = ev  # the same call in the dtype the library trains in
                    extra["severity"] = worst_severity(extra["severity"], ev.get("severity"))
            examples = getattr(item, "_hypothesis_failing_examples", None)  # set by hypothesis on failure
            if examples:
                extra["falsifying_example"] = "\n".join(examples)
            blob = [m.group(0) for n in _notes(call.excinfo) if (m := _BLOB.search(n))]
            if blob:
                extra["reproduce_failure"] = blob[0]
        if extra.get("status") == "not_applicable" and rep.failed:
            # every example declared not applicable: plain pytest shows the skip the audit records, never a failure
            rep.outcome = "skipped"
            rep.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {extra['message']}")
        if call.when == "call" and harness.deviations():
            extra["deviations"] = harness.deviations()
        if call.when == "call" or (rep.failed and call.when == "setup"):
            snippet = harness.repro_snippet()
            if snippet and (rep.failed or self.config.option.xmlpath):
                extra["repro"] = snippet
                rep.sections.append(("rlconform repro", snippet))
                item.user_properties.append(("repro", snippet))  # a JUnit <property> on the testcase
                rep.user_properties.append(("repro", snippet))
        if extra:
            rep.user_properties.append((_PROP + "_result", extra))

    def pytest_runtest_logreport(self, report):
        props = dict(report.user_properties)
        record = self.tests.get(report.nodeid)
        if record is None:
            record = dict(props.get(_PROP) or {"clauses": [], "kind": "example", "meta": False, "outcome": None})
            self.tests[report.nodeid] = record
        if not (report.when == "call" or report.failed or report.skipped):
            return
        extra = props.get(_PROP + "_result") or {}
        if crashed := _worker_crash(report):  # the code under test killed an xdist worker: its finding, in full
            extra = {"status": "error", "severity": "critical", "message": crashed}
        status = _classify(report, extra)
        # a teardown error after a passing call still counts: the first non-pass wins
        if status in ("fail", "error", "timeout"):
            self.failed_clauses.update(record["clauses"])
        if record["outcome"] in (None, "pass", "deviation") or status not in ("pass", "deviation"):
            record["outcome"] = status
            if extra.get("deviations"):
                record["deviations"] = extra["deviations"]
            if status not in ("pass", "deviation"):
                text = getattr(report, "longreprtext", None) or str(report.longrepr)
                record["message"] = harness.plain_text(text)[-4000:]
                record.update({k: v for k, v in extra.items() if k != "status"})
        record["duration"] = round(record.get("duration", 0.0) + report.duration, 4)
        self._emit(event="result", nodeid=report.nodeid, when=report.when, record=record)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        """xdist controller: learn the workers' collected tests (so never-run ones are reported) and
        their unmatched expectations (every worker collects the same tests)."""
        output = getattr(node, "workeroutput", {}) or {}
        for nodeid, record in output.get("rlconform_tests", {}).items():
            self.tests.setdefault(nodeid, record)
        if "rlconform_unmatched" in output:
            self.unmatched = output["rlconform_unmatched"]
        self.meta_left_out = max(self.meta_left_out, output.get("rlconform_meta_left_out", 0))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self._emit(event="collected_ids", count=len(ids))

    # ------------------------------------------------------------------ reporting
    def pytest_report_header(self, config):
        spec = self.spec
        fams = self.families or [f for f in spec.families]
        versions = ", ".join(f"{f} {spec.families[f].version}" for f in fams if f in spec.families)
        named = (f"{self.info.get('impl_name') or '?'} {self.info.get('impl_version') or '?'}"
                 if not self.preflight_error else "cannot be run (see the pre-flight error)")
        return [f"rlconform: impl={self.impl} ({named}) device={self.device} profile={self.profile} seed={self.seed}",
                f"rlconform: spec {versions}"]

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        if self.meta_left_out:
            terminalreporter.write_line(f"rlconform: {self.meta_left_out} meta-test(s) left out: they test the suite "
                                        "and the bundled reference, not --impl (run them without --impl)")
        for clause in self.unmatched:
            terminalreporter.write_line(f"rlconform: warning: expectation for {clause} matches no collected test",
                                        yellow=True)
        na = sum(1 for t in self.tests.values() if t["outcome"] == "not_applicable")
        if na:
            terminalreporter.write_line(f"rlconform: {na} test(s) not applicable "
                                        "(operations the implementation does not provide)")
        for line in deviation_lines(self.tests):
            terminalreporter.write_line(line, yellow=True)

    def payload(self, exitstatus: int, interrupted: bool) -> dict:
        for record in self.tests.values():
            if record["outcome"] is None:
                record["outcome"] = "not_run"
        return {
            "impl": self.impl, **self.info, "preflight_error": self.preflight_error,
            "profile": self.profile, "device": self.device, "seed": self.seed, "families": self.families,
            "started": self.started, "finished": time.time(), "exitstatus": int(exitstatus),
            "interrupted": interrupted, "tests": self.tests, "expectations": self.expectations,
            "unmatched_expectations": self.unmatched,
        }

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        # pytest then runs 5 full garbage collections (to report exceptions raised in __del__), each walking
        # torch's and hypothesis' whole heap: about 1 s at the end of every process. Nothing of the verdict
        # depends on them, so the heap that exists now is left out of them.
        gc.freeze()
        if self.worker:
            return
        interrupted = int(exitstatus) == int(pytest.ExitCode.INTERRUPTED) or bool(session.shouldstop)
        payload = self.payload(exitstatus, interrupted)
        self._emit(event="finished", exitstatus=int(exitstatus), interrupted=interrupted,
                   unmatched_expectations=self.unmatched)
        path = option(self.config, "report")
        if path:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")
            tmp.replace(path)


def _gave_up(excinfo) -> bool:
    """Hypothesis found no example to run (all rejected), rather than a failing one."""
    from hypothesis.errors import FailedHealthCheck, Unsatisfiable

    return excinfo.errisinstance((Unsatisfiable, FailedHealthCheck))


def _gradient_of_a_declared_constant(excinfo) -> str | None:
    """The op whose result a gradient check asked autograd about, when the implementation declares that op carries
    no gradient (``differentiable``): the check does not apply, whichever test forgot to ask first."""
    if not excinfo.errisinstance(RuntimeError) or "does not require grad" not in str(excinfo.value):
        return None
    return next((name for name, *_ in harness.recorded_calls() if not harness.differentiable(name)), None)


def _classify(rep, extra: dict) -> str:
    if hasattr(rep, "wasxfail"):
        return "expected_fail" if rep.skipped else "xpass"
    if rep.skipped:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        return "not_applicable" if harness.NOT_APPLICABLE in reason else "skipped"
    if rep.failed:
        return extra.get("status", "fail")
    return "deviation" if extra.get("deviations") else "pass"


def deviation_lines(tests: dict[str, dict]) -> list[str]:
    """One console line per declared convention the passing tests relied on: what, declared vs seed, how many tests."""
    seen: dict[str, tuple[dict, set[str]]] = {}
    for record in tests.values():
        if record.get("outcome") != "deviation":
            continue
        for d in record.get("deviations", []):
            seen.setdefault(d["convention"], (d, set()))[1].update(record.get("clauses", []))
    return [f"rlconform: deviation {name}: declared {d['declared']!r}, seed {d['seed']!r} "
            f"({', '.join(sorted(clauses))}): {d['consequence']}" for name, (d, clauses) in sorted(seen.items())]


def _csv(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


_WORKER_CRASHED = re.compile(r"worker '(?P<worker>[\w-]+)' crashed while running")


def _worker_crash(report) -> str | None:
    """xdist's report of a worker that died inside a test (a segfault, os._exit in the code under test), as the
    serial audit words a crash: the call the worker was making and its frames, not xdist's header line."""
    text = getattr(report, "longreprtext", None) or str(report.longrepr or "")
    m = _WORKER_CRASHED.search(text) if report.failed else None
    if not m:
        return None
    lines = [f"the test process (xdist worker {m['worker']}) died inside {report.nodeid}: the implementation "
             "crashed it"]
    return "\n".join(lines + crashes.details(*crashes.worker_paths(m["worker"])))
