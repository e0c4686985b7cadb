"""Meta-tests: the audit's verdict cannot lie, and the plugin stays out of other projects.

Each test is a case that once passed silently or failed confusingly: a malformed expectations file,
the caller's pytest configuration, an implementation that cannot be imported or built, a wrong
signature, a missing device, a hung or input-mutating operation, Ctrl-C, report fidelity, JUnit
properties, the plugin in an unrelated project, a gate over a messy run, a trainer restart.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from rlconform import audit, cli, launch
from rlconform.audit import clause_report, render_checklist, run_suite
from rlconform.cli import UsageError, gate
from rlconform.spec import SpecError, default_spec, load_spec, spec_dir
from rlconform.spec.yamlfile import YamlFileError

import reference_impl
from conformance_tests import NotApplicable, harness
from conformance_tests import strategies as st_
from conformance_tests.expectations import load_expectations
from conformance_tests.harness import _severity_of
from conformance_tests.impl import override
from conformance_tests.meta.run_once import once_per_run
from reference_impl.common.run import RunDir, RunDirBusy

pytestmark = pytest.mark.meta
HERE = "conformance_tests.meta.test_verdict"


def _cli(*argv, cwd=None, env=None):
    """(exit code, stdout, stderr) of ``rlconform`` run in-process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


# ----------------------------------------------------------------------------- implementations under test
def flawed_impl():
    """Three defects at once: PPO masking that writes into its input, a Top-p-free soft value that hangs,
    and V1's TD target that bootstraps through terminal steps."""
    ref = reference_impl.make()

    def masked_logits(logits, mask):
        logits.masked_fill_(~mask, -1e9)  # in place: the caller's logits are changed
        return logits

    def soft_value(probs, q1, q2, legal_mask, *, alpha):
        time.sleep(1000)

    def td_target(reward, done, next_value, *, gamma):
        return reward + gamma * next_value

    impl = override(ref, "ppo", masked_logits=masked_logits)
    return override(impl, "sac", soft_value=soft_value, td_target=td_target)


def deaf_hang_impl():
    """An operation that hangs where no signal reaches it (as a stuck C call would)."""
    def soft_value(probs, q1, q2, legal_mask, *, alpha):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(1000)

    return override(reference_impl.make(), "sac", soft_value=soft_value)


def ctrl_c_swallowing_impl():
    """Ctrl-C arrives inside an operation that swallows it (a bare ``except:``; a finalizer that was running
    then loses it the same way)."""
    ref = reference_impl.make()
    real = ref.isreshape.reshape_weight

    def reshape_weight(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the KeyboardInterrupt is raised here, at once
        except KeyboardInterrupt:
            pass
        return real(*args, **kwargs)

    return override(ref, "isreshape", reshape_weight=reshape_weight)


def misdeclared_impl(**capabilities):
    impl = reference_impl.make()
    impl.capabilities = capabilities
    return impl


def slow_wrong_ratio_impl():
    """A PPO ratio that is always wrong and slow: Hypothesis finds the failure at once, then runs out of
    time while shrinking it."""
    def ratio(new_log_prob, old_log_prob):
        time.sleep(0.4)
        return torch.exp(new_log_prob - old_log_prob) + 1.0

    return override(reference_impl.make(), "ppo", ratio=ratio)


def stalling_isreshape_impl():
    """IS-Reshape whose importance ratio takes forever: an audit under a time budget cannot finish."""
    def importance_ratio(log_prob, ref_log_prob, *, log_ratio_clamp=20.0):
        time.sleep(1000)

    return override(reference_impl.make(), "isreshape", importance_ratio=importance_ratio)


def raising_factory():
    raise RuntimeError("cannot open the checkpoint shard 3 of 8")


def wrong_signature_impl():
    def td_target(reward, done):  # the contract passes next_value and gamma too
        return reward

    return override(reference_impl.make(), "sac", td_target=td_target)


def empty_ppo_impl():
    return types.SimpleNamespace(name="nothing", version="0", ppo=types.SimpleNamespace())


not_a_factory = 42


# ----------------------------------------------------------------------------- expectations (exit 2)
@pytest.mark.parametrize("text, message", [
    ("- {clause: SAC-TD-1}\n", "exp.yaml:1: [0].reason: required field is missing"),
    ("- {clause: SAC-TD-1, reason: x, url: y}\n", "[0].url: unknown field"),
    ("- {clause: SAC-NOPE-9, reason: x}\n", "clause: unknown clause id 'SAC-NOPE-9'"),
    ("SAC-TD-1: kept\nSAC-TD-1: twice\n", "exp.yaml:2: SAC-TD-1: duplicate key"),
    ("expected_failures: [{clause: SAC-TD-1, reason: a}, {clause: SAC-TD-1, reason: b}]\n", "declared twice"),
    ("- {clause: SAC-TD-1, reason: [unclosed\n", "not valid YAML"),
    ("", "the file is empty"),
    ("just a string\n", "is not valid under any of the given schemas"),
])
def test_malformed_expectations_exit_2_naming_file_and_line(tmp_path, text, message):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    code, _, err = _cli("audit", "--family", "sac", "--out", tmp_path / "out", "--expectations", path)
    assert code == 2, err
    assert message in err and str(path) in err


@pytest.mark.parametrize("flag, value", [("--timeout", "-1"), ("--budget", "0"), ("--jobs", "0")])
def test_out_of_range_limits_exit_2_before_anything_runs(tmp_path, flag, value):
    code, _, err = _cli("audit", "--out", tmp_path, flag, value)
    assert code == 2 and f"{flag} " in err and "out of range" in err


def test_missing_expectations_file_exits_2(tmp_path):
    code, _, err = _cli("audit", "--out", tmp_path, "--expectations", tmp_path / "absent.yaml")
    assert code == 2 and "no such file" in err


def test_expectations_mapping_and_list_forms_mean_the_same(tmp_path):
    spec = default_spec().clauses
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("SAC-TD-1: V1 kept on purpose\nSAC-TEMP-1: {reason: sign, link: 'https://x.invalid/1'}\n")
    b.write_text("- {clause: SAC-TD-1, reason: V1 kept on purpose}\n"
                 "- {clause: SAC-TEMP-1, reason: sign, link: 'https://x.invalid/1'}\n")
    assert load_expectations(a, spec) == load_expectations(b, spec)
    assert load_expectations(a, spec)["SAC-TD-1"]["reason"] == "V1 kept on purpose"


def test_expectation_error_line_points_at_the_entry(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("- {clause: SAC-TD-1, reason: ok}\n- {clause: SAC-TD-1, reason: again}\n")
    with pytest.raises(YamlFileError, match=rf"{path}:2: clause: SAC-TD-1 is declared twice"):
        load_expectations(path, default_spec().clauses)


# ----------------------------------------------------------------------------- the implementation cannot run (exit 3)
@pytest.mark.parametrize("impl, message", [
    ("no_such_pkg_xyz.adapter:make", "no module named 'no_such_pkg_xyz'"),
    (f"{HERE}:not_a_factory", "is a int, not a callable factory"),
    (f"{HERE}:no_such_name", "has no attribute 'no_such_name'"),
    (f"{HERE}:raising_factory", "cannot open the checkpoint shard 3 of 8"),
    (f"{HERE}:wrong_signature_impl", "sac.td_target(reward, done) cannot be called as the contract calls it"),
])
def test_an_implementation_that_cannot_run_exits_3_with_one_message(tmp_path, impl, message):
    code, out, err = _cli("audit", "--impl", impl, "--out", tmp_path)
    assert code == 3, (out, err)
    assert message in err
    assert err.count("the implementation cannot be run") == 1 and "Traceback" not in out  # once, not per test
    assert not (tmp_path / "report.json").exists()


def test_factory_exception_is_shown_with_its_traceback(tmp_path):
    code, _, err = _cli("audit", "--impl", f"{HERE}:raising_factory", "--out", tmp_path)
    assert code == 3 and "Traceback" in err and "in raising_factory" in err


def test_pytest_impl_preflight_is_a_single_usage_error(tmp_path):
    modules = [f"conformance_tests.{m}" for m in ("test_sac_backup", "test_ppo_masking", "test_isreshape_weights")]
    proc = launch.run([sys.executable, "-m", "pytest", "--pyargs", *modules, "-m", "not meta",  # a warm child
                       "-p", "no:cacheprovider", "--impl", f"{HERE}:raising_factory", "-q"],
                      cwd=Path(__file__).resolve().parents[2], timeout=300, tmp=tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 4, text[-2000:]  # pytest's usage error: never a pass, never "no tests ran"
    assert text.count("rlconform pre-flight") == 1 and "ERROR collecting" not in text  # not one per module


@pytest.mark.parametrize("impl, meta_kept", [(f"{HERE}:empty_ppo_impl", False), ("reference_impl:make", True)])
def test_pytest_with_another_impl_leaves_the_meta_tests_out_and_says_so(tmp_path, impl, meta_kept):
    """The meta-tests check the suite and the bundled reference, whatever --impl says; some carry a clause
    mark (test_sac_graph's SAC-STEP-1), so under another implementation they would report on the reference
    as if it were that implementation."""
    modules = ["conformance_tests.test_ppo_selftest", "conformance_tests.meta.test_sac_graph"]
    proc = launch.run([sys.executable, "-m", "pytest", "--pyargs", *modules, "--collect-only", "-q",
                       "-p", "no:cacheprovider", "--impl", impl],
                      cwd=Path(__file__).resolve().parents[2], timeout=300, tmp=tmp_path)
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    assert any("test_ppo_selftest.py::" in i for i in ids), proc.stdout[-2000:]
    assert any("meta/test_sac_graph.py::" in i for i in ids) == meta_kept, proc.stdout[-2000:]
    assert ("meta-test(s) left out: they test the suite and the bundled reference, not --impl" in proc.stdout) \
        == (not meta_kept)


# ----------------------------------------------------------------------------- one audit with three defects
@pytest.fixture(scope="module")
def flawed(tmp_path_factory):
    def audit(tmp):
        payload = run_suite(f"{HERE}:flawed_impl", clauses=["PPO-MASK-1", "SAC-V-1", "SAC-TD-1", "SAC-TOPP-2"],
                            timeout=4, extra=["--junitxml", str(tmp / "junit.xml")])
        return clause_report(payload), tmp / "junit.xml"
    return once_per_run(tmp_path_factory, "flawed-audit", audit)


def _entry(report, cid):
    return next(c for c in report["clauses"] if c["id"] == cid)


def test_an_input_mutating_op_fails_naming_op_and_argument(flawed):
    mask1 = _entry(flawed[0], "PPO-MASK-1")
    assert mask1["status"] == "fail"
    assert "ppo.masked_logits modified its input 'logits' in place" in mask1["message"]
    repro = next(t["repro"] for t in mask1["failing_tests"] if "repro" in t)
    assert "-1000000000.0" not in repro.split("arg = ")[-1].split("\n")[0]  # it replays the ORIGINAL logits
    # and shows the write: the argument is held in a variable and printed after the call
    assert "masked_logits(arg, " in repro and "print('logits after the call (it must be unchanged):', arg)" in repro
    printed = subprocess.run([sys.executable, "-c", repro], capture_output=True, text=True, timeout=300,
                             cwd=Path(__file__).resolve().parents[2])
    assert printed.returncode == 0 and "-1.0000e+09" in printed.stdout.split("after the call")[-1], printed


def test_a_hung_op_marks_its_clause_timeout_and_the_audit_goes_on(flawed):
    report = flawed[0]
    assert _entry(report, "SAC-V-1")["status"] == "timeout"
    assert _entry(report, "SAC-TOPP-2")["status"] == "pass"
    assert "SAC-V-1" in report["summary"]["must_failed"] and report["summary"]["exit_code"] == 1
    # the hung op costs one test's budget: the later tests that call it time out at once, saying why
    msgs = [t["message"] for t in _entry(report, "SAC-V-1")["failing_tests"]]
    again = [m for m in msgs if "sac.soft_value is not called again" in m]
    assert len(msgs) >= 2 and len(again) == len(msgs) - 1, msgs
    # the clause's headline is the test that hung, not one that only never called the op again
    assert "did not return within the test's time budget" in _entry(report, "SAC-V-1")["message"]
    assert msgs[0] not in again


def test_report_keeps_every_failing_test_golden_first_with_hypothesis_details(flawed):
    td = _entry(flawed[0], "SAC-TD-1")
    kinds = [t["kind"] for t in td["failing_tests"]]
    assert len(kinds) >= 2 and kinds == sorted(kinds, key=["golden", "example", "property"].index)
    assert td["failing_test"] == td["failing_tests"][0]["test"]
    assert td["message"] == td["failing_tests"][0]["message"]  # status and message come from one test
    prop = next(t for t in td["failing_tests"] if t["kind"] == "property")
    assert prop["falsifying_example"].startswith(prop["test"].split("::")[-1] + "(")
    assert prop["reproduce_failure"].startswith("@reproduce_failure(")
    assert "np.float64" not in json.dumps(flawed[0]) and "array([" not in json.dumps(flawed[0])


def test_report_names_versions_commit_seed_and_only_the_audited_families(tmp_path):
    code, out, err = _cli("audit", "--impl", f"{HERE}:stalling_isreshape_impl", "--family", "isreshape",
                          "--out", tmp_path, "--profile", "release", "--seed", "1234", "--timeout", "600",
                          "--budget", "6")
    report = json.loads((tmp_path / "report.json").read_text())
    info = report["run_info"]
    assert info["families"] == ["isreshape"] and list(info["spec_versions"]) == ["isreshape"]
    assert info["seed"] == 1234 and info["rlconform"] and info["implementation_version"]
    assert "sac" not in (tmp_path / "checklist.md").read_text().split("## Grey-release")[0]
    assert code == 4 and info["budget_exhausted"]  # the stalled op holds the run past its budget
    assert report["summary"]["tests_not_run"] > 0
    assert report["summary"]["error"] == 0  # what never ran is "not run", never ERROR


def test_junit_xml_carries_clause_and_repro_properties(flawed):
    root = ET.parse(flawed[1]).getroot()
    cases = root.findall(".//testcase")
    assert cases
    for case in cases:
        props = {p.get("name"): p.get("value") for p in case.findall("./properties/property")}
        assert props.get("clause"), f"{case.get('name')} has no clause property"
        assert "repro" in props and "load_impl(" in props["repro"]


def test_a_hang_that_ignores_signals_is_killed_and_the_run_resumes():
    payload = run_suite(f"{HERE}:deaf_hang_impl", clauses=["SAC-V-1", "SAC-TD-1"], timeout=5, grace=1)
    report = clause_report(payload)
    st = {c["id"]: c["status"] for c in report["clauses"]}
    assert st["SAC-V-1"] == "timeout" and st["SAC-TD-1"] == "pass"
    assert len(payload["hung"]) == 1 and not payload["interrupted"]
    assert payload["hung"][0].startswith("conformance_tests/test_sac_backup.py::test_soft_value")
    assert "last call: sac.soft_value(" in payload["tests"][payload["hung"][0]]["message"]  # where it hung
    # one budget per clause: SAC-V-1's tests after the hung one are timeout without running (the verdict they
    # would add is already known), the SAC-TD-1 tests after it still run
    later = [t for t in payload["tests"].values() if t["clauses"] == ["SAC-V-1"] and t["outcome"] != "pass"][1:]
    assert later and all(t["outcome"] == "timeout" and t["message"].startswith("not run: ") for t in later), later


def deaf_td_target_impl():
    """td_target hangs where no signal reaches it; the tests of two clauses call it."""
    def td_target(reward, done, v_next, *, gamma, truncated=None):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(1000)

    return override(reference_impl.make(), "sac", td_target=td_target)


def test_an_operation_killed_for_hanging_is_never_called_again_in_later_processes():
    """One kill per hung operation, not one per clause: the next child is told which operation the killed one
    was inside, and every later call of it fails at once as a timeout that says why."""
    payload = run_suite(f"{HERE}:deaf_td_target_impl", clauses=["SAC-TD-1", "SAC-INPUT-4"], timeout=5, grace=1)
    st = {c["id"]: c["status"] for c in clause_report(payload)["clauses"]}
    assert st == {"SAC-TD-1": "timeout", "SAC-INPUT-4": "timeout"}, st
    assert len(payload["hung"]) == 1, payload["hung"]
    msgs = [t.get("message") or "" for t in payload["tests"].values() if t["clauses"] == ["SAC-INPUT-4"]]
    assert any("sac.td_target is not called again: it hung an earlier test" in m for m in msgs), msgs


def _as_from_a_terminal() -> None:
    """A child's SIGINT at its default, as a shell starts a foreground command. A suite started in the background
    (``cmd &``, nohup) hands its children SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_reports_what_ran_and_exits_4(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "rlconform.cli", "audit", "--family", "isreshape", "--out",
                             str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=_as_from_a_terminal)
    for line in proc.stderr:  # wait until the suite is really running: a progress line "  [n/N] file: ..."
        if re.match(r"\s*\[\d+/\d+\] ", line):
            break
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 4, (out[-2000:], err[-2000:])
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["run_info"]["interrupted"] and report["summary"]["tests_not_run"] > 0
    assert report["summary"]["error"] == 0 and "interrupted" in report["summary"]["verdict"]


def test_a_ctrl_c_the_code_under_test_swallows_still_stops_the_run_after_that_test():
    payload = run_suite(f"{HERE}:ctrl_c_swallowing_impl", clauses=["ISR-W-1", "ISR-W-2"])
    outcomes = [t["outcome"] for t in payload["tests"].values()]
    assert payload["interrupted"], outcomes
    assert outcomes.count("not_run") == len(outcomes) - 1, outcomes  # the test it arrived in ended; no other began


def test_no_executed_test_is_no_verdict():
    report = clause_report(run_suite(f"{HERE}:empty_ppo_impl", clauses=["PPO-MASK-1"]))
    assert report["summary"]["not_applicable"] == 1 and report["summary"]["exit_code"] == 4


# ----------------------------------------------------------------------------- isolation from the caller
def test_the_callers_pytest_configuration_does_not_reach_the_audit(tmp_path, monkeypatch):
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -n 2 --collect-only -x -p no:rlconform\n")
    (tmp_path / "conftest.py").write_text("import pytest\n\ndef pytest_collection_modifyitems(items):\n"
                                          "    items.clear()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTEST_ADDOPTS", "--collect-only --deselect conformance_tests")
    code, out, err = _cli("audit", "--clause", "ISR-W-1", "--clause", "ISR-LOSS-2", "--out", tmp_path / "out")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert code == 0, err
    assert {c["id"]: c["status"] for c in report["clauses"]} == {"ISR-W-1": "pass", "ISR-LOSS-2": "pass"}
    assert "tests selected" in err  # progress is streamed (plain lines when not a terminal)


def test_the_plugin_leaves_an_unrelated_project_alone(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent('''
        import sys
        from hypothesis import settings
        settings.register_profile("theirs", max_examples=7)
        settings.load_profile("theirs")

        def pytest_addoption(parser):
            parser.addoption("--device", default="tpu")
            parser.addoption("--profile", default="fast")
        '''))
    (tmp_path / "test_theirs.py").write_text(textwrap.dedent('''
        import sys
        from hypothesis import settings

        def test_untouched(pytestconfig):
            assert "torch" not in sys.modules, "the rlconform plugin imported torch"
            assert settings.default.max_examples == 7, settings.default
            assert pytestconfig.getoption("--device") == "tpu"
            assert pytestconfig.getoption("--profile") == "fast"

        def test_torch_threads_untouched():
            import torch
            assert torch.get_num_threads() == 2
        '''))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "RLCONFORM_IMPL")}
    env["OMP_NUM_THREADS"] = "2"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "rlconform" in subprocess.run([sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True,
                                         cwd=tmp_path, env=env).stdout  # the plugin was loaded all along


# ----------------------------------------------------------------------------- gate over a messy run
def _metrics(tmp_path, lines):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


def _ppo_records(n, **override):
    base = {"family": "ppo", "approx_kl": 0.01, "clip_fraction": 0.15, "ratio_mean": 1.0, "entropy_ratio": 0.5,
            "log_prob_min": -5.0}
    return [{**base, "update": i, **{k: v(i) if callable(v) else v for k, v in override.items()}} for i in range(n)]


def test_gate_passes_a_clean_run_and_fails_nan_partway(tmp_path):
    assert _cli("gate", _metrics(tmp_path, _ppo_records(10)))[0] == 0
    recs = _ppo_records(10, approx_kl=lambda i: math.nan if i == 4 else 0.01)
    text = "\n".join(json.dumps(r) for r in recs)  # json writes NaN, as the trainers' logs do
    path = tmp_path / "nan.jsonl"
    path.write_text(text + "\n")
    code, out, _ = _cli("gate", path)
    assert code == 1 and "non-finite" in out


def test_gate_with_every_metric_missing_is_not_ok(tmp_path):
    path = _metrics(tmp_path, [{"family": "ppo", "update": 0, "other": 1.0}])
    code, out, _ = _cli("gate", path)
    assert code == 1 and "gates: FAILED" in out
    assert _cli("gate", path, "--allow-missing")[0] == 0


@pytest.mark.parametrize("lines, message", [
    (_ppo_records(3) + [_ppo_records(3)[1]], "metrics.jsonl:4: update 1 goes backwards from update 2"),
    (_ppo_records(2) + [_ppo_records(2)[1]], "metrics.jsonl:3: update 1 repeats update 1"),
    (_ppo_records(2, approx_kl="high"), "metrics.jsonl:1: metric 'approx_kl' is 'high', not a number"),
    (["[1, 2]"] + _ppo_records(2), "metrics.jsonl:1: expected a JSON object per line"),
    (["{not json"] + _ppo_records(2), "metrics.jsonl:1: not a JSON object"),
])
def test_gate_rejects_messy_runs_naming_file_and_line(tmp_path, lines, message):
    code, _, err = _cli("gate", _metrics(tmp_path, lines))
    assert code == 2 and message in err


def test_gate_warns_about_a_torn_last_line_and_reads_the_rest(tmp_path):
    path = _metrics(tmp_path, _ppo_records(4) + ['{"family": "ppo", "update": 4, "approx_'])
    code, out, err = _cli("gate", path)
    assert code == 0 and "metrics.jsonl:5: torn last line ignored" in err and "4 records" in out


# ----------------------------------------------------------------------------- trainers restart cleanly
def test_a_restart_without_checkpoint_drops_the_killed_attempts_records(tmp_path):

    run = RunDir(tmp_path, family="ppo", config={"lr": 1.0})
    for u in range(2):  # an attempt killed before its first checkpoint
        run.log(update=u)
    run = RunDir(tmp_path, family="ppo", config={"lr": 1.0})
    assert run.metrics() == [] and run.load() is None
    for u in range(3):
        run.log(update=u)
    assert [r["update"] for r in run.metrics()] == [0, 1, 2]


def test_resume_trims_a_torn_last_line_with_a_warning(tmp_path):

    run = RunDir(tmp_path, family="ppo", config={"lr": 1.0})
    for u in range(3):
        run.log(update=u, loss=0.5)
    run.save({"update": 1})
    with open(run.metrics_path, "a") as f:
        f.write('{"family": "ppo", "upd')
    run = RunDir(tmp_path, family="ppo", config={"lr": 1.0}, resume=True)
    with pytest.warns(UserWarning, match=r"metrics\.jsonl:4: torn last line dropped"):
        assert run.load() == {"update": 1}
    assert [r["update"] for r in run.metrics()] == [0, 1]


# ----------------------------------------------------------------------------- CLI basics
def test_version():
    from importlib import metadata

    with pytest.raises(SystemExit) as e, contextlib.redirect_stdout(io.StringIO()) as out:
        cli.main(["--version"])
    assert e.value.code == 0 and out.getvalue().strip() == f"rlconform {metadata.version('rlconform')}"


def test_only_a_usage_error_exits_2_and_a_fault_of_rlconform_exits_4(monkeypatch):
    """The README's exit codes: 2 is the caller's mistake, 4 is ours; a bug must never pass for a bad argument."""

    def bug(args, rest):
        raise KeyError("an internal lookup failed")

    monkeypatch.setattr(gate, "run", bug)
    code, _, err = _cli("gate", "anything.jsonl")
    assert code == 4 and "internal error" in err and "KeyError" in err, err

    def bad_input(args, rest):
        raise UsageError("anything.jsonl: no such file or directory")

    monkeypatch.setattr(gate, "run", bad_input)
    code, _, err = _cli("gate", "anything.jsonl")
    assert code == 2 and "rlconform gate: error: anything.jsonl: no such file" in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv, needle", [
    (["gate", "no-such-file.jsonl"], "no such file"),
    (["spec", "show", "SAC-NOPE-9"], "no such clause"),
    (["mutants", "no_such_mutant"], "unknown mutant"),
    (["matrix", "--library", "no-such-lib"], "--library no-such-lib"),
    (["audit", "--clause", "SAC-NOPE-9"], "no such clause"),
    (["audit", "--families", "ppo,dqn"], "unknown family 'dqn'"),
    (["audit", "--clause", "SAC-TD-1", "--out", "/proc/no-such-dir/out"], "cannot create the directory"),
])
def test_bad_arguments_are_usage_errors(argv, needle):
    code, _, err = _cli(*argv)
    assert code == 2 and needle in err and "Traceback" not in err, err


def test_a_damaged_checkpoint_is_named_not_a_torch_traceback(tmp_path):
    code, _, err = _cli("train", "ppo", "--updates", "1", "--out", tmp_path / "run")
    assert code == 0, err
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"cut short")
    code, _, err = _cli("train", "ppo", "--updates", "2", "--out", tmp_path / "run", "--resume")
    assert code == 2 and "checkpoint.pt is damaged" in err and "new --out" in err and "Traceback" not in err, err


def test_packages_are_typed():
    import rlconform

    import conformance_tests

    for pkg in (conformance_tests, reference_impl, rlconform):
        assert (Path(pkg.__file__).parent / "py.typed").exists(), pkg.__name__


# ----------------------------------------------------------------------------- what a third party declares
def _reference_without_capabilities(**sac_ops):
    impl = override(reference_impl.make(), "sac", **sac_ops) if sac_ops else reference_impl.make()
    impl.capabilities = {}
    return impl


def unmasked_softmax_impl():
    """A library without masks: it declares every input with an illegal action not applicable."""

    ref = reference_impl.make().sac.masked_softmax

    def masked_softmax(logits, legal_mask, *, eps=1e-8):
        if not bool(legal_mask.all()):
            raise NotApplicable("this library has no action masks")
        return ref(logits, legal_mask, eps=eps)

    return _reference_without_capabilities(masked_softmax=masked_softmax)


def plain_errors_impl():
    """A library that rejects bad input with its own error messages (no rlconform clause ids)."""
    ref = reference_impl.make().sac.masked_softmax

    def masked_softmax(logits, legal_mask, *, eps=1e-8):
        try:
            return ref(logits, legal_mask, eps=eps)
        except ValueError:
            raise ValueError("invalid logits") from None

    return _reference_without_capabilities(masked_softmax=masked_softmax)


def test_not_applicable_per_call_discards_examples_never_fails():
    report = clause_report(run_suite(f"{HERE}:unmasked_softmax_impl", clauses=["SAC-MASK-1", "SAC-MASK-2"]))
    st = {c["id"]: c["status"] for c in report["clauses"]}
    assert st["SAC-MASK-1"] in ("pass", "not_applicable") and st["SAC-MASK-2"] == "not_applicable", st
    assert report["summary"]["error"] == report["summary"]["fail"] == 0


def test_third_party_input_clauses_accept_any_rejection_but_not_silence():
    report = clause_report(run_suite(f"{HERE}:plain_errors_impl", clauses=["SAC-INPUT-1", "SAC-INPUT-2"]))
    st = {c["id"]: c["status"] for c in report["clauses"]}
    assert st["SAC-INPUT-1"] == st["SAC-INPUT-2"] == "pass", st
    native = clause_report(run_suite("conformance_tests.meta.test_verdict:plain_errors_native", clauses=["SAC-INPUT-1"]))
    assert native["clauses"][0]["status"] == "fail"  # declaring errors_name_clauses makes the id required


def plain_errors_native():
    impl = plain_errors_impl()
    impl.capabilities = {"errors_name_clauses": True}
    return impl


def test_a_clause_without_any_test_is_never_passed():
    # a suite whose only test checks ISR-W-1 cannot vouch for the rest of the family
    payload = {"families": ["isreshape"], "tests": {"t::a": {"clauses": ["ISR-W-1"], "outcome": "pass", "kind": "golden"}}}
    report = clause_report(payload)
    status = {c["id"]: c["status"] for c in report["clauses"]}
    assert status["ISR-W-1"] == "pass" and status["ISR-F-1"] == "untested"
    assert report["summary"]["exit_code"] == 4 and "have no test" in report["summary"]["verdict"]
    assert "No test in this suite" in render_checklist(report)
    only = clause_report({**payload, "clauses": ["ISR-W-1"]})  # a clause-filtered run asks for no more
    assert only["summary"]["exit_code"] == 0


# ----------------------------------------------------------------------------- declared conventions
def _declaring(impl, **capabilities):
    impl.capabilities = {"errors_name_clauses": True, **capabilities}
    return impl


def _folded_value_loss(declare: bool):
    """TorchRL's and SB3's value loss: the ½ folded into vf_coef, i.e. twice the seed's value loss."""
    ref = reference_impl.make()
    impl = override(ref, "ppo", value_loss=lambda values, returns: 2.0 * ref.ppo.value_loss(values, returns))
    return _declaring(impl, conventions={"value_loss_factor": 1.0} if declare else {})


def folded_value_loss_declared():
    return _folded_value_loss(declare=True)


def folded_value_loss_undeclared():
    return _folded_value_loss(declare=False)


def seed_value_loss_declared_folded():
    """Declares the folded ½ but computes the seed's value loss: a declaration the code does not follow."""
    return _declaring(reference_impl.make(), conventions={"value_loss_factor": 1.0})


def folded_value_loss_and_broken_kl():
    """A declared deviation next to a real defect (approx_kl with the sign flipped), for the report's order."""
    impl = folded_value_loss_declared()
    ref_kl = impl.ppo.approx_kl
    return _declaring(override(impl, "ppo", approx_kl=lambda old, new: -ref_kl(old, new)),
                      conventions={"value_loss_factor": 1.0})


def test_a_declared_convention_that_the_code_follows_is_a_deviation_not_a_failure():
    report = clause_report(run_suite(f"{HERE}:folded_value_loss_declared", clauses=["PPO-LOSS-2"]))
    (clause,) = report["clauses"]
    assert clause["status"] == "deviation", clause
    (dev,) = clause["deviations"]
    assert (dev["convention"], dev["declared"], dev["seed"]) == ("value_loss_factor", 1.0, 0.5)
    assert dev["consequence"] == default_spec().convention("value_loss_factor").consequence(1.0) != ""
    assert report["summary"]["exit_code"] == 0 and report["summary"]["deviation"] == 1
    text = render_checklist(report)
    assert "## Deviations" in text and "| PPO-LOSS-2 | value_loss_factor | 1.0 | 0.5 |" in text
    assert "device mistakes" in text and "`--device sim`" in text  # a CPU audit says what it cannot see
    report["run_info"]["device"] = "sim"
    assert "device mistakes" not in render_checklist(report)


def test_the_same_code_without_the_declaration_fails():
    report = clause_report(run_suite(f"{HERE}:folded_value_loss_undeclared", clauses=["PPO-LOSS-2"]))
    assert report["clauses"][0]["status"] == "fail" and report["summary"]["exit_code"] == 1
    assert "deviations" not in report["clauses"][0]


def test_a_declared_convention_the_code_does_not_follow_still_fails():
    report = clause_report(run_suite(f"{HERE}:seed_value_loss_declared_folded", clauses=["PPO-LOSS-2"]))
    assert report["clauses"][0]["status"] == "fail" and report["summary"]["exit_code"] == 1


def test_report_lists_findings_then_deviations_then_the_rest():
    report = clause_report(run_suite(f"{HERE}:folded_value_loss_and_broken_kl", clauses=["PPO-LOSS-2", "PPO-KL-1"]))
    status = {c["id"]: c["status"] for c in report["clauses"]}
    assert status == {"PPO-KL-1": "fail", "PPO-LOSS-2": "deviation"}, status
    text = render_checklist(report)
    order = [text.index(h) for h in ("## Findings that fail the audit", "## Deviations", "## Grey-release checklist")]
    assert order == sorted(order), order
    table = text[text.index("| clause | level | status"):]
    assert table.index("PPO-KL-1") < table.index("PPO-LOSS-2")  # the family table too: fail, deviation, pass


def maskless_impl():
    """A library without action masks: any illegal action that reaches it is an error."""
    ref = reference_impl.make()

    def all_legal(fn):
        def op(*args, **kwargs):
            masks = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.dtype == torch.bool]
            if any(not bool(m.all()) for m in masks):
                raise RuntimeError("this library has no action masks")
            return fn(*args, **kwargs)
        return op

    impl = override(ref, "sac", masked_softmax=all_legal(ref.sac.masked_softmax))
    impl = override(impl, "ppo", evaluate_actions=all_legal(ref.ppo.evaluate_actions),
                    masked_distribution=all_legal(ref.ppo.masked_distribution))
    return _declaring(impl, masks=False)


def test_masks_false_makes_illegal_action_tests_not_applicable_never_error():
    payload = run_suite(f"{HERE}:maskless_impl", clauses=["SAC-MASK-1", "SAC-MASK-2", "PPO-MASK-3"])
    report = clause_report(payload)
    assert report["summary"]["error"] == report["summary"]["fail"] == 0, report["clauses"]
    outcome = {n.split("::")[-1]: t["outcome"] for n, t in payload["tests"].items()}
    for golden in ("test_masked_softmax_golden", "test_replay_golden_from_the_symptom_log",
                   "test_update_rejects_a_stored_action_illegal_under_its_mask"):
        assert outcome[golden] == "not_applicable", (golden, outcome[golden])
    # what needs no illegal action still runs (all-legal masks drawn) and passes
    assert outcome["test_masked_softmax_matches_softmax_over_legal_set"] == "pass"


def test_declared_dtypes_are_the_only_ones_drawn():
    from hypothesis import given, settings

    saved = harness.declared_capabilities()
    seen: set[torch.dtype] = set()

    from hypothesis import strategies as st

    @settings(max_examples=15, database=None, deadline=None)
    @given(st.tuples(st_.logits_and_masks(), st_.policies(), st_.dyadic_policies(widths=(3, 8)),
                     st_.isr_token_batches(), st_.ccapo_return_groups(), st_.rollouts(), st_.float_dtypes()))
    def draw_all(drawn):
        for x in drawn:
            for t in x.values() if isinstance(x, dict) else x if isinstance(x, tuple) else (x,):
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    seen.add(t.dtype)
            if isinstance(x, torch.dtype):
                seen.add(x)

    try:
        harness.set_capabilities({"dtypes": ["float32"]})
        draw_all()
    finally:
        harness.set_capabilities(saved)
    assert seen == {torch.float32}, seen


def test_declared_value_outside_the_allowed_values_is_the_implementations_error():

    saved = harness.declared_capabilities()
    try:
        harness.set_capabilities({"conventions": {"value_loss_factor": 0.7}})
        with pytest.raises(harness.ImplementationError, match="value_loss_factor"):
            harness.convention("value_loss_factor")
        harness.set_capabilities({"conventions": {"value_loss_factor": 0.5}})  # the seed's value: no deviation
        harness.begin_test(clauses=["PPO-LOSS-2"])
        assert harness.convention("value_loss_factor") == 0.5 and harness.deviations() == []
    finally:
        harness.set_capabilities(saved)
        harness.end_test()


def test_conventions_must_name_existing_clauses_that_list_them_back(tmp_path):
    import shutil

    for f in spec_dir().glob("*.yaml"):
        shutil.copy(f, tmp_path / f.name)
    conv = tmp_path / "conventions.yaml"
    text = conv.read_text(encoding="utf-8")
    conv.write_text(text.replace("clauses: [PPO-CLIPFRAC-1,", "clauses: [PPO-NOPE-9, PPO-CLIPFRAC-1,"), encoding="utf-8")
    line = 1 + text[: text.index("  - id: clip_fraction")].count("\n")
    with pytest.raises(SpecError, match=rf"conventions.yaml:{line}: convention clip_fraction: .*PPO-NOPE-9"):
        load_spec(tmp_path)
    # a clause file may add itself to a convention: conventions.yaml's list is completed from it
    conv.write_text(text.replace("clauses: [PPO-CLIPFRAC-1, ", "clauses: ["), encoding="utf-8")
    assert "PPO-CLIPFRAC-1" in load_spec(tmp_path).convention("clip_fraction").clauses
    conv.write_text(text, encoding="utf-8")
    ppo = tmp_path / "ppo.yaml"
    ppo.write_text(ppo.read_text(encoding="utf-8").replace("conventions: [clip_fraction]", "conventions: [clip_fraction, clip_rate]", 1),
                   encoding="utf-8")
    with pytest.raises(SpecError, match="lists unknown convention 'clip_rate'"):
        load_spec(tmp_path)


def test_time_running_out_while_shrinking_reports_the_failure_not_a_timeout():
    payload = run_suite(f"{HERE}:slow_wrong_ratio_impl", clauses=["PPO-RATIO-1"], timeout=3)
    entry = _entry(clause_report(payload), "PPO-RATIO-1")
    assert entry["status"] == "fail", entry
    assert {t["status"] for t in entry["failing_tests"]} == {"fail"}
    shrinking = [t for t in entry["failing_tests"] if "while Hypothesis was shrinking" in t["message"]]
    assert shrinking and all("but should be" in t["message"] for t in shrinking), entry["failing_tests"]


@pytest.mark.parametrize("caps, needle", [
    ({"mask": False}, "unknown capability ['mask']"),
    ({"dtypes": ["float23"]}, "capabilities['dtypes'] must name"),
    ({"conventions": {"value_los_factor": 1.0}}, "unknown convention 'value_los_factor'"),
    ({"conventions": {"value_loss_factor": 0.7}}, "is not an allowed value"),
])
def test_a_misspelt_declaration_stops_the_audit_before_any_test(caps, needle, monkeypatch, tmp_path):
    # ignored, it would have the suite check something the implementation never claimed
    monkeypatch.setattr(sys.modules[__name__], "bad_declarations", lambda: misdeclared_impl(**caps), raising=False)
    code, _, err = _cli("audit", "--impl", f"{HERE}:bad_declarations", "--out", str(tmp_path / "a"))
    assert code == 3 and needle in err, err


def test_a_run_directory_has_one_writer(tmp_path):
    """A second trainer on a directory another live process writes stops before touching a file (two
    trainers on one --out would interleave their metrics); the end of the owner frees it."""
    import subprocess
    import sys

    owner = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom reference_impl.common.run import RunDir\n"
         f"r = RunDir({str(tmp_path)!r}, family='ppo', config={{'seed': 3}})\nr.log(update=1)\n"
         "print('ready', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "ready"
        with pytest.raises(RunDirBusy, match=rf"being written by another run \(pid {owner.pid}\)"):
            RunDir(tmp_path, family="ppo", config={"seed": 4})
        code, _, err = _cli("train", "ppo", "--out", str(tmp_path), "--updates", "1")
        assert code == 2 and "being written by another run" in err
        lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(ln)["update"] for ln in lines] == [1], "the refused runs changed the owner's metrics"
        assert json.loads((tmp_path / "config.json").read_text())["config"] == {"seed": 3}
    finally:
        owner.kill()
        owner.wait()
    run = RunDir(tmp_path, family="ppo", config={"seed": 4})  # the owner is gone: the directory is free
    run.log(update=7)
    assert [r["update"] for r in run.metrics()] == [7]
    run.close()


# ----------------------------------------------------------------------------- what a clause's level governs
def unvalidated_normalisation():
    """Advantage normalisation without its input checks (NaN passes through): a SHOULD check left out."""
    def normalize_advantages(advantage, *, eps=1e-8, clamp=None):
        out = (advantage - advantage.mean()) / (advantage.std() + eps)
        return out if clamp is None else out.clamp(-clamp, clamp)

    return override(reference_impl.make(), "ppo", normalize_advantages=normalize_advantages)


def test_a_should_behaviour_that_is_there_and_wrong_fails_the_audit():
    report = clause_report(run_suite("conformance_tests.mutants.ppo:advantage_eps_inside_sqrt", clauses=["PPO-ADV-1"]))
    (c,) = report["clauses"]
    assert (c["level"], c["binding"], c["status"]) == ("SHOULD", True, "fail"), c
    assert report["summary"]["should_failed"] == ["PPO-ADV-1"] and report["summary"]["must_failed"] == []
    assert report["summary"]["exit_code"] == 1 and "present but wrong: PPO-ADV-1" in report["summary"]["verdict"]
    text = render_checklist(report)
    assert "## Findings that fail the audit" in text and "## Recommendations not followed" not in text
    # every finding says what its clause requires, in one sentence, and where to read more
    assert "The clause requires: " in text and "`rlconform spec show PPO-ADV-1`" in text


def test_a_wrong_gate_metric_fails_the_audit():
    """A gate's threshold is judged on a run; what the suite tests of it is the operation computing its metric,
    and a wrong metric is a wrong result, not a recommendation."""
    report = clause_report(run_suite("conformance_tests.mutants.ppo:entropy_ratio_over_all_actions",
                                     clauses=["PPO-SLO-4"]))
    (c,) = report["clauses"]
    assert (c["level"], c["kind"], c["binding"], c["status"]) == ("SHOULD", "gate", True, "fail"), c
    assert report["summary"]["exit_code"] == 1


def test_a_should_check_left_out_is_a_recommendation_not_followed():
    report = clause_report(run_suite(f"{HERE}:unvalidated_normalisation", clauses=["PPO-INPUT-4"]))
    (c,) = report["clauses"]
    assert (c["level"], c["kind"], c["binding"], c["status"]) == ("SHOULD", "input", False, "fail"), c
    assert report["summary"]["advisory_failed"] == ["PPO-INPUT-4"] and report["summary"]["exit_code"] == 0
    text = render_checklist(report)
    assert "## Recommendations not followed" in text and "## Findings that fail the audit" not in text


def nan_ratio_std_and_flipped_kl():
    """Two findings: one that breaks training (a NaN diagnostic) and a plain wrong sign."""
    impl = reference_impl.make()
    kl = impl.ppo.approx_kl
    return override(impl, "ppo", approx_kl=lambda old, new: -kl(old, new),
                    ratio_std=lambda ratio: ratio.std() * float("nan"))


def test_findings_are_ordered_by_severity_then_level():
    report = clause_report(run_suite(f"{HERE}:nan_ratio_std_and_flipped_kl", clauses=["PPO-KL-1", "PPO-RATIO-2"]))
    sev = {c["id"]: c.get("severity") for c in report["clauses"]}
    assert sev == {"PPO-KL-1": "major", "PPO-RATIO-2": "critical"}, sev
    text = render_checklist(report)
    # the SHOULD clause whose NaN would wreck training comes before the MUST clause's wrong sign
    assert text.index("[critical] **PPO-RATIO-2**") < text.index("[major] **PPO-KL-1**")


def test_a_residue_is_minor_a_wrong_value_major_a_nan_critical():

    e = torch.tensor([10.1, 10.1, 3.0], dtype=torch.float64).numpy()
    assert _severity_of(e + 1.4e-11, e, 1.4e-11) == "minor"
    assert _severity_of(e + 0.47, e, 0.47) == "major"
    assert _severity_of(e * float("nan"), e, float("nan")) == "critical"


def test_relative_paths_and_the_callers_modules_reach_the_audit(tmp_path):
    """The audit's pytest runs in a temporary directory; an --impl module in the caller's directory
    (or on a relative PYTHONPATH) and a relative --expectations file must still be what it reads."""
    proj = tmp_path / "proj"
    (proj / "my_probe_impl").mkdir(parents=True)
    (proj / "my_probe_impl" / "__init__.py").write_text("")
    (proj / "my_probe_impl" / "adapter.py").write_text(
        "from conformance_tests.mutants.sac import no_done_truncation\n\n\ndef make():\n    return no_done_truncation()\n")
    (proj / "exp").mkdir()
    (proj / "exp" / "known.yaml").write_text('SAC-TD-1: "bootstraps through terminal states, fix scheduled"\n')
    script = Path(sys.executable).parent / "rlconform"  # the console script: no `python -m` adding the cwd
    argv = [str(script), "audit", "--impl", "my_probe_impl.adapter:make", "--clause", "SAC-TD-1"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    here = subprocess.run([*argv, "--expectations", "exp/known.yaml", "--out", "o"], cwd=proj, env=env,
                          capture_output=True, text=True)
    assert here.returncode == 0, here.stdout[-2000:] + here.stderr[-2000:]
    report = json.loads((proj / "o" / "report.json").read_text())
    assert report["clauses"][0]["status"] == "expected_fail"  # the relative expectations file was read
    sub = proj / "exp"  # from elsewhere, the module is found through a relative PYTHONPATH
    there = subprocess.run([*argv, "--out", "o2"], cwd=sub, env={**env, "PYTHONPATH": ".."}, capture_output=True, text=True)
    assert there.returncode == 1, there.stdout[-2000:] + there.stderr[-2000:]  # the mutant, found and failing
    assert json.loads((sub / "o2" / "report.json").read_text())["clauses"][0]["status"] == "fail"


@pytest.mark.long
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_audit_writes_its_partial_report_and_stops_its_child(tmp_path, sig):
    """A CI cancel or `timeout` (SIGTERM) and Ctrl-C end the same way: the partial report (the rest
    NOT RUN), exit 4, and no pytest child left running on to the end."""
    script = Path(sys.executable).parent / "rlconform"
    proc = subprocess.Popen([str(script), "audit", "--family", "ppo", "--out", str(tmp_path / "o")], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_as_from_a_terminal)
    log = tmp_path / "o" / "pytest.log"
    for line in proc.stderr:  # the first test file done: stop it there
        if "failing so far" in line:
            break
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 4, (proc.returncode, err[-2000:])
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["run_info"]["interrupted"] and report["summary"]["tests_not_run"] > 0
    assert "Verdict (exit 4)" in (tmp_path / "o" / "checklist.md").read_text()
    size = log.stat().st_size
    time.sleep(4)
    assert log.stat().st_size == size, "the pytest child went on writing after the audit ended"


def _crashing_gae(how: str):
    def gae(*args, **kwargs):
        if how == "segfault":
            import ctypes

            ctypes.string_at(0)  # reads address 0: SIGSEGV inside the operation
        os._exit(3)

    return override(reference_impl.make(), "ppo", gae=gae)


def segfaulting_gae():
    return _crashing_gae("segfault")


def exiting_gae():
    return _crashing_gae("exit")


@pytest.mark.parametrize("factory, how", [("segfaulting_gae", "signal SIGSEGV"), ("exiting_gae", "exit code 3")])
def test_a_crash_in_the_code_under_test_is_that_clauses_finding_and_the_rest_still_runs(factory, how):
    """A segfault or os._exit inside an operation is reported as a crash of the clause it happened
    in, with the call it was making; the child is replaced and the other clauses still get their verdict."""
    report = clause_report(run_suite(f"{HERE}:{factory}", clauses=["PPO-GAE-1", "PPO-LOSS-2"]))
    by = {c["id"]: c for c in report["clauses"]}
    gae = by["PPO-GAE-1"]
    assert gae["status"] == "error" and gae["severity"] == "critical", gae
    assert "died inside" in gae["message"] and how in gae["message"] and "last call: ppo.gae(" in gae["message"]
    if how.startswith("signal"):
        assert "in gae" in gae["message"]  # the user's frame, from faulthandler
    assert by["PPO-LOSS-2"]["status"] == "pass"
    assert report["summary"]["exit_code"] == 1 and report["summary"]["tests_not_run"] == 0


def careless_impl():
    """Three operations with the right values that a caller still cannot use: one leaves grad mode off
    behind it, one returns a numpy array, one calls sys.exit."""
    ref = reference_impl.make()

    def ratio(new_log_prob, old_log_prob):
        out = ref.ppo.ratio(new_log_prob, old_log_prob)
        torch.set_grad_enabled(False)
        return out

    def value_loss(values, returns):
        return ref.ppo.value_loss(values, returns).detach().cpu().numpy()

    def gae(*args, **kwargs):
        sys.exit(0)

    return override(ref, "ppo", ratio=ratio, value_loss=value_loss, gae=gae)


def test_an_op_that_leaves_a_setting_changed_returns_numpy_or_exits_is_blamed_alone():
    """Each is its own clause's finding, naming the op; the reference's ops the later tests call (the clipped
    loss needs grad mode on) still pass: the harness put the setting back."""
    report = clause_report(run_suite(f"{HERE}:careless_impl",
                                     clauses=["PPO-RATIO-1", "PPO-LOSS-1", "PPO-LOSS-2", "PPO-GAE-1"]))
    by = {c["id"]: c for c in report["clauses"]}
    assert by["PPO-RATIO-1"]["status"] == "fail"
    assert "ppo.ratio left grad mode False (it was True)" in by["PPO-RATIO-1"]["message"]
    assert by["PPO-LOSS-1"]["status"] == "pass", by["PPO-LOSS-1"].get("message")
    assert by["PPO-LOSS-2"]["status"] == "fail"
    assert "ppo.value_loss returned a numpy float" in by["PPO-LOSS-2"]["message"]
    gae = by["PPO-GAE-1"]
    assert (gae["status"], gae["severity"]) == ("error", "critical") and "raised SystemExit" in gae["message"]
    assert "ppo.gae(" in gae["message"]


def test_a_crash_under_xdist_is_named_as_a_crash_with_the_workers_own_call():
    """Under --jobs the crash kills a worker, not the run: xdist reports it with its own header. The report still
    calls it a crash (critical, an error), with the call that worker was making and the user's frame."""
    report = clause_report(run_suite(f"{HERE}:segfaulting_gae", clauses=["PPO-GAE-1", "PPO-LOSS-2"], jobs=2))
    by = {c["id"]: c for c in report["clauses"]}
    gae = by["PPO-GAE-1"]
    assert gae["status"] == "error" and gae["severity"] == "critical", gae
    assert "died inside" in gae["message"] and "last call: ppo.gae(" in gae["message"], gae["message"]
    assert "in gae" in gae["message"] and not gae["message"].startswith("[gw")
    assert by["PPO-LOSS-2"]["status"] == "pass"


def plain_zscore_macro_trained_in_float32():
    """GRPO's group z-score without the degenerate-group rule, from a library that trains in float32: in
    float64 an all-equal group gives a residue; in float32 it gives advantages near ±1."""
    def macro_advantage(returns, *, eps=1e-8):
        return (returns - returns.mean(-1, keepdim=True)) / (returns.std(-1, keepdim=True, unbiased=False) + eps)

    impl = override(reference_impl.make(), "ccapo", macro_advantage=macro_advantage)
    return _declaring(impl, train_dtype="float32")


def test_a_float64_finding_is_shown_in_the_dtype_the_library_trains_in():
    """The audit shows a finding in the library's real dtype, and ranks it by what users get there."""
    report = clause_report(run_suite(f"{HERE}:plain_zscore_macro_trained_in_float32", clauses=["CCAPO-MACRO-2"]))
    (c,) = report["clauses"]
    assert c["status"] == "fail" and c["severity"] == "major", c.get("severity")
    assert any("seven_equal_returns_golden[float32]" in t["test"] for t in c["failing_tests"])


def test_the_failing_call_is_made_again_in_the_training_dtype():

    saved = harness.declared_capabilities()
    impl = plain_zscore_macro_trained_in_float32()
    where = harness.configure(HERE, "cpu")  # CPU arithmetic: the float32 rounding this test is about
    try:
        harness.set_capabilities(impl.capabilities)
        harness.begin_test(clauses=["CCAPO-MACRO-2"])
        ccapo = harness.FamilyProxy("ccapo", impl.ccapo)
        ccapo.macro_advantage(torch.full((1, 7), 10.1, dtype=torch.float64))  # float64: a residue at most
        ev = harness.evidence_in_train_dtype()
        assert ev["dtype"] == "float32" and ev["severity"] == "major" and ev["max_difference"] > 0.5, ev
        ccapo.macro_advantage(torch.full((1, 3), 0.1, dtype=torch.float64))  # here float32 rounds to exactly 0
        assert harness.evidence_in_train_dtype()["severity"] is None
        harness.set_capabilities({**impl.capabilities, "train_dtype": None})
        assert harness.evidence_in_train_dtype() is None  # nothing declared: nothing redone
    finally:
        harness.set_capabilities(saved)
        harness.configure(*where)
        harness.end_test()


def evaluate_actions_returns_a_dict():
    impl = reference_impl.make()
    base = impl.ppo.evaluate_actions

    def evaluate_actions(*args, **kwargs):
        log_prob, entropy = base(*args, **kwargs)
        return {"log_prob": log_prob, "entropy": entropy}

    return override(impl, "ppo", evaluate_actions=evaluate_actions)


def detached_policy_loss():
    impl = reference_impl.make()
    base = impl.ppo.clipped_policy_loss
    return override(impl, "ppo", clipped_policy_loss=lambda r, a, *, clip_eps: base(r, a, clip_eps=clip_eps).detach())


@pytest.mark.parametrize("factory, clause, needles", [
    ("evaluate_actions_returns_a_dict", "PPO-LOGP-1", ["ppo.evaluate_actions returned a dict", "returns tuple[Tensor, Tensor]"]),
    ("detached_policy_loss", "PPO-LOSS-1", ["returned a float64 tensor of shape () on cpu, no gradient",
                                            "It carries no gradient"]),
])
def test_a_result_the_suite_cannot_check_is_named_with_the_contract(factory, clause, needles):
    """A wrong return type or a loss without gradient is named as such, with the contract,
    not shown as a traceback of the suite's comparison code."""
    report = clause_report(run_suite(f"{HERE}:{factory}", clauses=[clause]))
    (c,) = report["clauses"]
    assert c["status"] == "fail" and all(n in c["message"] for n in needles), c["message"]


def crashing_everywhere():
    def die(*args, **kwargs):
        os._exit(7)

    return override(reference_impl.make(), "ppo", gae=die, approx_kl=die, value_loss=die)


def test_past_the_crash_limit_the_audit_reports_what_ran_and_gives_no_verdict(monkeypatch):
    """An implementation that keeps killing the test process is not restarted forever: past MAX_CRASHES the
    crashes are findings, the rest is NOT RUN, and the exit is 4 (never 0, never a lost report)."""

    monkeypatch.setattr(audit, "MAX_CRASHES", 2)
    report = clause_report(run_suite(f"{HERE}:crashing_everywhere",
                                     clauses=["PPO-GAE-1", "PPO-KL-1", "PPO-LOSS-2", "PPO-RATIO-1"]))
    assert report["run_info"]["crash_limited"] and report["summary"]["exit_code"] == 4
    assert "killed the test process 2 times" in report["summary"]["verdict"]
    assert sum(c["status"] == "error" for c in report["clauses"]) == 2 and report["summary"]["tests_not_run"] > 0
